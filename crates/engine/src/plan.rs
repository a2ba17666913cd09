//! Pure decisions: what to do with an entry, and how a big file is cut into
//! chunks. No I/O here, so the arithmetic is covered by property tests.

use sluice_sys::{FileType, Stat};

/// What the executor does with one listed entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Walk it, creating the directory in DST.
    Dir,
    /// Copy a regular file in one piece on one stream.
    Whole,
    /// Copy a regular file as `chunks` pieces on any number of streams.
    Chunked { chunks: u64 },
    /// Recreate a symlink (never followed).
    Symlink,
    /// Recreate a FIFO, socket or device node (never read).
    Special,
    /// Not copied; counted as skipped (e.g. a device node without root).
    Skip(&'static str),
}

/// Decides the action for an entry from its `statx` alone.
pub fn action(st: &Stat, chunk_size: u64, privileged: bool) -> Action {
    match st.file_type() {
        FileType::Directory => Action::Dir,
        FileType::RegularFile => {
            if splits(st.size, chunk_size) {
                Action::Chunked {
                    chunks: chunk_count(st.size, chunk_size),
                }
            } else {
                Action::Whole
            }
        }
        FileType::Symlink => Action::Symlink,
        FileType::Fifo | FileType::Socket => Action::Special,
        FileType::CharacterDevice | FileType::BlockDevice => {
            if privileged {
                Action::Special
            } else {
                Action::Skip("device node needs root")
            }
        }
        FileType::Unknown => Action::Skip("unknown file type"),
    }
}

/// A file is split when it is larger than twice the chunk size, so no chunk
/// is ever a small leftover copied on its own stream for nothing.
pub fn splits(size: u64, chunk_size: u64) -> bool {
    chunk_size > 0 && size > chunk_size.saturating_mul(2)
}

/// Number of chunks for `size` bytes.
pub fn chunk_count(size: u64, chunk_size: u64) -> u64 {
    size.div_ceil(chunk_size).max(1)
}

/// Offset and length of chunk `i`; the last chunk takes the remainder.
pub fn chunk_range(size: u64, chunk_size: u64, i: u64) -> (u64, u64) {
    let off = i * chunk_size;
    (off, chunk_size.min(size.saturating_sub(off)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn chunks_tile_the_file_exactly(size in 0u64..(1 << 44), chunk in 1u64..(1 << 30)) {
            let n = chunk_count(size, chunk);
            let mut next = 0;
            for i in [0, n / 2, n - 1] {
                let (off, len) = chunk_range(size, chunk, i);
                prop_assert_eq!(off, i * chunk);
                prop_assert!(len <= chunk);
                if i + 1 < n { prop_assert_eq!(len, chunk); }
                next = next.max(off + len);
            }
            prop_assert_eq!(next, size);
        }

        #[test]
        fn small_files_never_split(size in 0u64..(1 << 40), chunk in 1u64..(1 << 30)) {
            prop_assert_eq!(splits(size, chunk), size > 2 * chunk);
            if splits(size, chunk) { prop_assert!(chunk_count(size, chunk) >= 3); }
        }
    }

    #[test]
    fn boundaries() {
        let c = 64;
        assert!(!splits(128, c));
        assert!(splits(129, c));
        assert_eq!(chunk_count(129, c), 3);
        assert_eq!(chunk_range(129, c, 2), (128, 1));
        assert_eq!(chunk_count(192, c), 3);
        assert_eq!(chunk_range(192, c, 2), (128, 64));
    }
}
