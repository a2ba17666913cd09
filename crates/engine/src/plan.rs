//! Pure decisions: what to do with an entry, what to do when DST already
//! has its name, and how a big file is cut into chunks. No I/O here, so the
//! rules are covered by property tests; the streams carry out what these
//! decide and decide nothing themselves.

use crate::compare::{self, Verdict};
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

/// The options that decide what becomes of an entry DST already has.
#[derive(Clone, Copy, Debug, Default)]
pub struct Rules {
    /// Permission bits compared (0 with `--no-perms`).
    pub perm_mask: u32,
    /// Owner and group are preserved, so a difference in them matters.
    pub owners: bool,
    /// `--size-only`: a regular file of the same size is the same.
    pub size_only: bool,
    /// `--update`: a file of the same kind that is newer in DST stays.
    pub update: bool,
    /// `--ignore-existing`: whatever DST has stays.
    pub ignore_existing: bool,
    /// `--delete`: a directory in the way may go, after a clean walk.
    pub delete: bool,
    /// `--checksum`: same-looking files are compared byte for byte.
    pub checksum: bool,
    /// Extended attributes (and ACLs) are preserved.
    pub xattrs: bool,
}

impl Rules {
    /// These rules without the options that take a file as it is in DST
    /// (`--size-only`, `--update`, `--ignore-existing`).
    pub fn exact(self) -> Rules {
        Rules {
            size_only: false,
            update: false,
            ignore_existing: false,
            ..self
        }
    }
}

/// What becomes of a source entry whose name DST already has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Existing {
    /// Left as it is (`--ignore-existing`, `--update`): counted unchanged.
    Keep,
    /// Copied over it, for these reasons (`-v`'s words).
    Replace(Vec<&'static str>),
    /// A directory holds the name: it goes with the extras after a clean
    /// walk, and the entry is copied after that.
    AfterDelete,
    /// A directory holds the name and nothing may delete it: an error.
    Blocked,
    /// Same by `statx`; before it is left alone the executor looks closer
    /// where asked, and a difference found there makes it a copy.
    Looks(Closer),
}

/// The closer looks an entry that seems up to date still needs: each is
/// I/O the planner cannot do, and each is asked only where it can matter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Closer {
    /// Compare the bytes (`--checksum`).
    pub content: bool,
    /// A hard-linked file: its DST name must be the group's DST inode.
    pub links: bool,
    /// Compare extended attributes and ACLs: only when SRC's inode changed
    /// after DST's (a copy sets DST's times after writing, so an untouched
    /// pair never pays for the listings, while `setfattr` on SRC is seen).
    pub xattrs: bool,
    /// A symlink: compare where the two point.
    pub target: bool,
    /// Mode or owner differ: set them in place (a file that cannot be
    /// opened for that is copied instead).
    pub fix_meta: bool,
}

/// Decides what becomes of the source entry `src`, not a directory (those
/// are walked, and their metadata set when done), whose name DST holds as
/// `dst`.
pub fn existing(src: &Stat, dst: &Stat, r: &Rules) -> Existing {
    let newer = dst.file_type() == src.file_type() && dst.mtime > src.mtime;
    if r.ignore_existing || (r.update && newer) {
        return Existing::Keep;
    }
    match compare::verdict(src, dst, r.perm_mask, r.owners, r.size_only) {
        Verdict::Replace => {
            Existing::Replace(compare::differences(src, dst, r.perm_mask, r.owners))
        }
        Verdict::DirInTheWay if r.delete => Existing::AfterDelete,
        Verdict::DirInTheWay => Existing::Blocked,
        v @ (Verdict::Same | Verdict::FixMeta) => {
            let regular = src.file_type() == FileType::RegularFile;
            Existing::Looks(Closer {
                content: regular && r.checksum,
                links: regular && src.nlink > 1,
                xattrs: regular && r.xattrs && src.ctime >= dst.ctime,
                target: src.file_type() == FileType::Symlink,
                fix_meta: v == Verdict::FixMeta,
            })
        }
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

    fn stat(kind: u32, perm: u32, size: u64, mtime: i64, ctime: i64, nlink: u32) -> Stat {
        Stat {
            mode: kind | perm,
            uid: 1000,
            gid: 1000,
            nlink,
            ino: 7,
            size,
            blocks: size / 512,
            dev: (8, 1),
            rdev: (0, 0),
            atime: (0, 0),
            ctime: (ctime, 0),
            mtime: (mtime, 0),
        }
    }

    const KINDS: [u32; 5] = [0o100000, 0o040000, 0o120000, 0o010000, 0o020000];

    fn any_stat() -> impl Strategy<Value = Stat> {
        stat_of(KINDS.to_vec())
    }

    /// A source entry: never a directory.
    fn any_src() -> impl Strategy<Value = Stat> {
        stat_of(KINDS.iter().copied().filter(|&k| k != 0o040000).collect())
    }

    fn stat_of(kinds: Vec<u32>) -> impl Strategy<Value = Stat> {
        (
            prop::sample::select(kinds),
            prop::sample::select(vec![0o644, 0o600, 0o755]),
            0u64..4,
            0i64..4,
            0i64..4,
            1u32..3,
        )
            .prop_map(|(k, p, size, m, c, n)| stat(k, p, size, m, c, n))
    }

    fn any_rules() -> impl Strategy<Value = Rules> {
        prop::array::uniform8(any::<bool>()).prop_map(|b| Rules {
            perm_mask: if b[0] { 0o7777 } else { 0 },
            owners: b[1],
            size_only: b[2],
            update: b[3],
            ignore_existing: b[4],
            delete: b[5],
            checksum: b[6],
            xattrs: b[7],
        })
    }

    proptest! {
        #[test]
        fn a_directory_goes_only_with_delete(src in any_src(), dst in any_stat(), r in any_rules()) {
            let plan = existing(&src, &dst, &r);
            let dir_in_the_way = dst.file_type() == FileType::Directory
                && src.file_type() != FileType::Directory;
            if dir_in_the_way && !r.ignore_existing {
                prop_assert_eq!(plan.clone(), if r.delete { Existing::AfterDelete } else { Existing::Blocked });
            }
            if plan == Existing::AfterDelete { prop_assert!(r.delete && dir_in_the_way); }
        }

        #[test]
        fn what_the_user_keeps_is_kept(src in any_src(), dst in any_stat(), r in any_rules()) {
            let plan = existing(&src, &dst, &r);
            if r.ignore_existing {
                prop_assert_eq!(plan, Existing::Keep);
            } else if r.update && src.file_type() == dst.file_type() && dst.mtime > src.mtime {
                prop_assert_eq!(plan, Existing::Keep);
            } else {
                prop_assert_ne!(plan, Existing::Keep);
            }
        }

        #[test]
        fn the_same_entry_is_never_copied(src in any_src(), r in any_rules()) {
            let mut dst = src;
            dst.ino = 99;
            dst.atime = (5, 5);
            match existing(&src, &dst, &Rules { ignore_existing: false, ..r }) {
                Existing::Looks(c) => {
                    prop_assert!(!c.fix_meta);
                    prop_assert_eq!(c.content, r.checksum && src.file_type() == FileType::RegularFile);
                    prop_assert_eq!(c.target, src.file_type() == FileType::Symlink);
                }
                other => prop_assert!(false, "{:?}", other),
            }
        }

        #[test]
        fn a_copy_always_says_why(src in any_src(), dst in any_stat(), r in any_rules()) {
            if let Existing::Replace(why) = existing(&src, &dst, &r) {
                prop_assert!(!why.is_empty());
            }
        }

        #[test]
        fn closer_looks_only_where_they_can_matter(src in any_src(), dst in any_stat(), r in any_rules()) {
            if let Existing::Looks(c) = existing(&src, &dst, &r) {
                let regular = src.file_type() == FileType::RegularFile;
                prop_assert!(!c.content || (regular && r.checksum));
                prop_assert!(!c.links || (regular && src.nlink > 1));
                prop_assert!(!c.xattrs || (regular && r.xattrs && src.ctime >= dst.ctime));
            }
        }
    }

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
