//! Buffers aligned for `O_DIRECT`.

use std::ptr::NonNull;

/// A buffer whose bytes start on a page boundary, as `O_DIRECT` requires
/// on every file system sluice targets. Mapped from the kernel on its own
/// (anonymous, private) and unmapped when dropped, so the memory goes back
/// to the system at once: a stream that trades its buffer for a smaller
/// one (more streams sharing the same memory, see the engine's budget)
/// does not leave the old one resident in an allocator's free lists.
/// Pages are only resident once touched.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its mapping outright (no aliasing handles), so
// moving it to or sharing `&` it with another thread is as safe as a Vec.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; `&AlignedBuf` gives no access to the bytes.
unsafe impl Sync for AlignedBuf {}

/// Alignment used for direct I/O buffers, offsets and lengths.
pub const DIRECT_ALIGN: usize = 4096;

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (rounded up to the alignment).
    /// Panics if the system has no memory to map, as a `Vec` would abort.
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.div_ceil(DIRECT_ALIGN).max(1) * DIRECT_ALIGN;
        use rustix::mm::{mmap_anonymous, MapFlags, ProtFlags};
        // SAFETY: a fresh anonymous mapping at an address the kernel picks
        // aliases nothing; it is unmapped exactly once, in `Drop`.
        let ptr = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE,
            )
        }
        .unwrap_or_else(|e| panic!("cannot map a {len}-byte buffer: {e}"));
        AlignedBuf {
            ptr: NonNull::new(ptr.cast()).expect("mmap never returns null on success"),
            len,
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes (never: a buffer has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The aligned bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes, readable and writable, zeroed
        // by the kernel, and borrowed mutably through `&mut self` only.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, not used after this.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_aligned_zeroed_and_writable() {
        let mut b = AlignedBuf::new(10_000);
        assert_eq!(b.len(), 12_288);
        let s = b.as_mut_slice();
        assert_eq!(s.as_ptr() as usize % DIRECT_ALIGN, 0);
        assert!(s.iter().all(|&x| x == 0));
        s[12_287] = 7;
        assert_eq!(b.as_mut_slice()[12_287], 7);
    }
}
