//! Zeroed byte buffers that start on a page boundary.
//!
//! Why: AMD Zen cores copy with `rep movsb` (the kernel's `copy_to_user`,
//! glibc's `memcpy` above 2 KiB) about ten times slower when the
//! destination lies 1 to 63 bytes past the source modulo 4 KiB. A large
//! `Vec` comes from `mmap` through malloc and starts 16 bytes into a page,
//! and socket data sits at page offsets, so every datagram the kernel
//! copied into the receive pool took that slow path: a 60 KB `recv` cost
//! 28 µs into a buffer at page offset 16, 2.7 µs at offset 0
//! (docs/PERFORMANCE.md, session 20).

use std::ops::{Deref, DerefMut};

/// The page size the alignment is for (x86-64, aarch64 with 4 KiB pages;
/// larger pages keep 4 KiB alignment, which is what the copy cares about).
const PAGE: usize = 4096;

/// `len` zeroed bytes starting on a [`PAGE`] boundary; derefs to them.
/// The bytes never move (a boxed allocation), so pointers into them stay
/// valid as long as the value lives.
pub(crate) struct PageAligned {
    /// [`PAGE`] bytes more than asked for; the bytes asked for start at
    /// `start`, the first page boundary in it.
    buf: Box<[u8]>,
    start: usize,
}

impl PageAligned {
    pub(crate) fn zeroed(len: usize) -> PageAligned {
        let buf = vec![0u8; len + PAGE].into_boxed_slice();
        // `align_offset` on a `u8` pointer always succeeds (no `usize::MAX`)
        // and is below PAGE, so `start + len` fits in `buf`.
        let start = buf.as_ptr().align_offset(PAGE);
        PageAligned { buf, start }
    }

    /// Where in `buf` the bytes asked for lie.
    fn range(&self) -> std::ops::Range<usize> {
        self.start..self.buf.len() - PAGE + self.start
    }
}

impl Deref for PageAligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf[self.range()]
    }
}

impl DerefMut for PageAligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        let r = self.range();
        &mut self.buf[r]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_start_on_a_page_and_hold_their_length() {
        for len in [1, 4095, 4096, 64 * 65536] {
            let mut p = PageAligned::zeroed(len);
            assert_eq!(p.as_ptr() as usize % PAGE, 0, "len {len}");
            assert_eq!(p.len(), len);
            assert!(p.iter().all(|&b| b == 0));
            p[len - 1] = 7;
            assert_eq!(p[len - 1], 7);
        }
    }
}
