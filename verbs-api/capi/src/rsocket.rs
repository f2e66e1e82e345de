//! rsockets (`<rdma/rsocket.h>`): sockets over RDMA connections, part of
//! librdmacm's ABI. Programs that link them load the drop-in; the calls
//! fail with ENOSYS until roxe implements rsockets (`riowrite` returns 0
//! bytes written, its failure value, as `size_t` cannot be -1 there).
//! `rfcntl` is variadic in C: its extra argument is never read, which the
//! C calling convention allows.

use crate::set_errno;
use std::ffi::{c_int, c_void};

/// Defines rsocket entry points that fail with -1 and errno ENOSYS. Each
/// keeps its C signature (struct pointers as `*mut c_void`) and reads none
/// of its arguments.
macro_rules! rsocket_unsupported {
    ($( fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty; )*) => {
        $(
            #[doc = concat!("`", stringify!($name), "`: rsockets are not supported, -1 with errno ENOSYS.")]
            #[no_mangle]
            pub extern "C" fn $name($($arg: $ty),*) -> $ret {
                set_errno(libc::ENOSYS);
                -1
            }
        )*
    };
}

rsocket_unsupported! {
    fn rsocket(_domain: c_int, _kind: c_int, _protocol: c_int) -> c_int;
    fn rbind(_socket: c_int, _addr: *const c_void, _addrlen: u32) -> c_int;
    fn rlisten(_socket: c_int, _backlog: c_int) -> c_int;
    fn raccept(_socket: c_int, _addr: *mut c_void, _addrlen: *mut u32) -> c_int;
    fn rconnect(_socket: c_int, _addr: *const c_void, _addrlen: u32) -> c_int;
    fn rshutdown(_socket: c_int, _how: c_int) -> c_int;
    fn rclose(_socket: c_int) -> c_int;
    fn rrecv(_socket: c_int, _buf: *mut c_void, _len: usize, _flags: c_int) -> isize;
    fn rrecvfrom(_socket: c_int, _buf: *mut c_void, _len: usize, _flags: c_int, _src: *mut c_void, _addrlen: *mut u32) -> isize;
    fn rrecvmsg(_socket: c_int, _msg: *mut c_void, _flags: c_int) -> isize;
    fn rsend(_socket: c_int, _buf: *const c_void, _len: usize, _flags: c_int) -> isize;
    fn rsendto(_socket: c_int, _buf: *const c_void, _len: usize, _flags: c_int, _dest: *const c_void, _addrlen: u32) -> isize;
    fn rsendmsg(_socket: c_int, _msg: *const c_void, _flags: c_int) -> isize;
    fn rread(_socket: c_int, _buf: *mut c_void, _count: usize) -> isize;
    fn rreadv(_socket: c_int, _iov: *const c_void, _iovcnt: c_int) -> isize;
    fn rwrite(_socket: c_int, _buf: *const c_void, _count: usize) -> isize;
    fn rwritev(_socket: c_int, _iov: *const c_void, _iovcnt: c_int) -> isize;
    fn rpoll(_fds: *mut c_void, _nfds: u64, _timeout: c_int) -> c_int;
    fn rselect(_nfds: c_int, _readfds: *mut c_void, _writefds: *mut c_void, _exceptfds: *mut c_void, _timeout: *mut c_void) -> c_int;
    fn rgetpeername(_socket: c_int, _addr: *mut c_void, _addrlen: *mut u32) -> c_int;
    fn rgetsockname(_socket: c_int, _addr: *mut c_void, _addrlen: *mut u32) -> c_int;
    fn rsetsockopt(_socket: c_int, _level: c_int, _optname: c_int, _optval: *const c_void, _optlen: u32) -> c_int;
    fn rgetsockopt(_socket: c_int, _level: c_int, _optname: c_int, _optval: *mut c_void, _optlen: *mut u32) -> c_int;
    fn rfcntl(_socket: c_int, _cmd: c_int) -> c_int;
    fn riomap(_socket: c_int, _buf: *mut c_void, _len: usize, _prot: c_int, _flags: c_int, _offset: i64) -> i64;
    fn riounmap(_socket: c_int, _buf: *mut c_void, _len: usize) -> c_int;
}

/// `riowrite`: 0 bytes written (its failure value: `size_t` cannot be -1),
/// errno ENOSYS.
#[no_mangle]
pub extern "C" fn riowrite(
    _socket: c_int,
    _buf: *const c_void,
    _count: usize,
    _offset: i64,
    _flags: c_int,
) -> usize {
    set_errno(libc::ENOSYS);
    0
}
