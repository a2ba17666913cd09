//! Buffers aligned for `O_DIRECT`.

/// A heap buffer whose usable slice starts on a 4 KiB boundary, as
/// `O_DIRECT` requires on every file system sluice targets. Built from a
/// plain `Vec` with slack, so it needs no `unsafe` allocation.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

/// Alignment used for direct I/O buffers, offsets and lengths.
pub const DIRECT_ALIGN: usize = 4096;

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (rounded up to the alignment).
    pub fn new(len: usize) -> AlignedBuf {
        let len = len.div_ceil(DIRECT_ALIGN).max(1) * DIRECT_ALIGN;
        let raw = vec![0u8; len + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { raw, start, len }
    }

    /// The aligned bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}
