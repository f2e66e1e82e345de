//! rsockets (`<rdma/rsocket.h>`): sockets over RDMA connections, part of
//! librdmacm's ABI. Programs that link them load the drop-in; the calls
//! fail with ENOSYS until roxe implements rsockets (`riowrite` returns 0
//! bytes written, its failure value, as `size_t` cannot be -1 there).
//! `rfcntl` is variadic in C: its extra argument is never read, which the
//! C calling convention allows.

use crate::set_errno;
use std::ffi::{c_int, c_void};

#[no_mangle]
pub unsafe extern "C" fn rsocket(_domain: c_int, _kind: c_int, _protocol: c_int) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rbind(_socket: c_int, _addr: *const c_void, _addrlen: u32) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rlisten(_socket: c_int, _backlog: c_int) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn raccept(_socket: c_int, _addr: *mut c_void, _addrlen: *mut u32) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rconnect(_socket: c_int, _addr: *const c_void, _addrlen: u32) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rshutdown(_socket: c_int, _how: c_int) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rclose(_socket: c_int) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rrecv(
    _socket: c_int,
    _buf: *mut c_void,
    _len: usize,
    _flags: c_int,
) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rrecvfrom(
    _socket: c_int,
    _buf: *mut c_void,
    _len: usize,
    _flags: c_int,
    _src: *mut c_void,
    _addrlen: *mut u32,
) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rrecvmsg(_socket: c_int, _msg: *mut c_void, _flags: c_int) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rsend(
    _socket: c_int,
    _buf: *const c_void,
    _len: usize,
    _flags: c_int,
) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rsendto(
    _socket: c_int,
    _buf: *const c_void,
    _len: usize,
    _flags: c_int,
    _dest: *const c_void,
    _addrlen: u32,
) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rsendmsg(_socket: c_int, _msg: *const c_void, _flags: c_int) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rread(_socket: c_int, _buf: *mut c_void, _count: usize) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rreadv(_socket: c_int, _iov: *const c_void, _iovcnt: c_int) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rwrite(_socket: c_int, _buf: *const c_void, _count: usize) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rwritev(_socket: c_int, _iov: *const c_void, _iovcnt: c_int) -> isize {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rpoll(_fds: *mut c_void, _nfds: u64, _timeout: c_int) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rselect(
    _nfds: c_int,
    _readfds: *mut c_void,
    _writefds: *mut c_void,
    _exceptfds: *mut c_void,
    _timeout: *mut c_void,
) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rgetpeername(
    _socket: c_int,
    _addr: *mut c_void,
    _addrlen: *mut u32,
) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rgetsockname(
    _socket: c_int,
    _addr: *mut c_void,
    _addrlen: *mut u32,
) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rsetsockopt(
    _socket: c_int,
    _level: c_int,
    _optname: c_int,
    _optval: *const c_void,
    _optlen: u32,
) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rgetsockopt(
    _socket: c_int,
    _level: c_int,
    _optname: c_int,
    _optval: *mut c_void,
    _optlen: *mut u32,
) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn rfcntl(_socket: c_int, _cmd: c_int) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn riomap(
    _socket: c_int,
    _buf: *mut c_void,
    _len: usize,
    _prot: c_int,
    _flags: c_int,
    _offset: i64,
) -> i64 {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn riounmap(_socket: c_int, _buf: *mut c_void, _len: usize) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn riowrite(
    _socket: c_int,
    _buf: *const c_void,
    _count: usize,
    _offset: i64,
    _flags: c_int,
) -> usize {
    set_errno(libc::ENOSYS);
    0
}
