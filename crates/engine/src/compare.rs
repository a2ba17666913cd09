//! Pure decisions about an entry that already exists in DST: is it up to
//! date, does only its metadata need fixing, or must it be replaced?
//!
//! This is the quick check of `sync` and of every re-run (resume included):
//! a file whose size and nanosecond mtime match was committed by an earlier
//! run, because sluice sets the source's mtime on the temporary *before*
//! renaming it into place, so a torn file never carries the source's mtime
//! under its final name. No I/O here; property tests cover it.

use sluice_sys::{FileType, Stat};

/// What to do with a source entry whose name exists in DST.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Identical as far as the check can tell: leave it alone.
    Same,
    /// Same content; mode or owner differ and are fixed in place.
    FixMeta,
    /// Different content or kind: copy and rename over it.
    Replace,
    /// DST holds a directory where SRC has something else. Replacing it
    /// would delete a tree, which only `--delete` may do, after the walk.
    DirInTheWay,
}

/// Compares an entry's source and destination `statx`. `owners` says owner
/// and group are preserved (root), so a difference in them matters.
/// Symlinks and special files compare by kind and times here; a symlink's
/// target is compared by the caller.
pub fn verdict(src: &Stat, dst: &Stat, perm_mask: u32, owners: bool, size_only: bool) -> Verdict {
    let kind = src.file_type();
    if dst.file_type() != kind {
        return if dst.file_type() == FileType::Directory {
            Verdict::DirInTheWay
        } else {
            Verdict::Replace
        };
    }
    let content_same = match kind {
        FileType::RegularFile if size_only => src.size == dst.size,
        FileType::RegularFile | FileType::Symlink => src.size == dst.size && src.mtime == dst.mtime,
        FileType::CharacterDevice | FileType::BlockDevice => {
            src.rdev == dst.rdev && src.mtime == dst.mtime
        }
        _ => src.mtime == dst.mtime,
    };
    if !content_same {
        return Verdict::Replace;
    }
    if meta_same(src, dst, perm_mask, owners) {
        Verdict::Same
    } else {
        Verdict::FixMeta
    }
}

/// Why a source entry differs from the DST entry of its name, in the
/// words `-v` prints (rsync's `--itemize-changes` in plain English): the
/// kind, size, mtime, device number, mode and (when preserved) owner that
/// differ. Content, extended attributes and link identity are judged by
/// the caller, which adds its own word.
pub fn differences(src: &Stat, dst: &Stat, perm_mask: u32, owners: bool) -> Vec<&'static str> {
    let kind = src.file_type();
    if dst.file_type() != kind {
        return vec!["type"];
    }
    let mut why = Vec::new();
    if matches!(kind, FileType::RegularFile | FileType::Symlink) && src.size != dst.size {
        why.push("size");
    }
    if kind != FileType::Directory && src.mtime != dst.mtime {
        why.push("mtime");
    }
    if matches!(kind, FileType::CharacterDevice | FileType::BlockDevice) && src.rdev != dst.rdev {
        why.push("device");
    }
    if kind != FileType::Symlink && src.perm() & perm_mask != dst.perm() & perm_mask {
        why.push("mode");
    }
    if owners && (src.uid, src.gid) != (dst.uid, dst.gid) {
        why.push("owner");
    }
    why
}

/// Whether mode and (when preserved) owner already match. A symlink's mode
/// cannot be changed and does not matter, so only its owner counts.
pub fn meta_same(src: &Stat, dst: &Stat, perm_mask: u32, owners: bool) -> bool {
    let perm_same =
        src.file_type() == FileType::Symlink || src.perm() & perm_mask == dst.perm() & perm_mask;
    let owner_same = !owners || (src.uid == dst.uid && src.gid == dst.gid);
    perm_same && owner_same
}

/// Whether a directory that already exists in DST needs its times set
/// again. Only the mtime counts: atime changes whenever anything lists the
/// directory, and setting it would change the ctime for nothing.
pub fn dir_times_differ(src: &Stat, dst: &Stat) -> bool {
    src.mtime != dst.mtime
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn size_only_ignores_mtime() {
        let s = file(0o100644, 10, (5, 0));
        let d = file(0o100644, 10, (6, 0));
        assert_eq!(verdict(&s, &d, 0o7777, true, false), Verdict::Replace);
        assert_eq!(verdict(&s, &d, 0o7777, true, true), Verdict::Same);
        let d = file(0o100644, 11, (5, 0));
        assert_eq!(verdict(&s, &d, 0o7777, true, true), Verdict::Replace);
    }

    #[test]
    fn differences_name_what_differs() {
        let a = file(0o100644, 10, (5, 0));
        assert!(differences(&a, &a, 0o7777, true).is_empty());
        let b = file(0o100600, 11, (5, 1));
        assert_eq!(differences(&a, &b, 0o7777, true), ["size", "mtime", "mode"]);
        let d = file(0o040755, 10, (5, 0));
        assert_eq!(differences(&a, &d, 0o7777, true), ["type"]);
    }

    fn file(mode: u32, size: u64, mtime: (i64, u32)) -> Stat {
        Stat {
            mode,
            uid: 1000,
            gid: 1000,
            nlink: 1,
            ino: 1,
            size,
            blocks: size / 512,
            dev: (8, 1),
            rdev: (0, 0),
            atime: (0, 0),
            ctime: (0, 0),
            mtime,
        }
    }

    const REG: u32 = 0o100000;
    const DIR: u32 = 0o040000;
    const LNK: u32 = 0o120000;

    proptest! {
        #[test]
        fn equal_stats_are_same(perm in 0u32..0o7777, size: u64, sec: i64, ns in 0u32..1_000_000_000) {
            let s = file(REG | perm, size, (sec, ns));
            let mut d = s;
            d.ino = 99; // the inode and atime never matter
            d.atime = (5, 5);
            prop_assert_eq!(verdict(&s, &d, 0o7777, true, false), Verdict::Same);
        }

        #[test]
        fn any_size_or_mtime_change_replaces(size: u64, other: u64, sec: i64, dsec: i64, ns in 0u32..1_000_000_000) {
            let s = file(REG | 0o644, size, (sec, ns));
            let d = file(REG | 0o644, other, (dsec, ns));
            let same = size == other && sec == dsec;
            prop_assert_eq!(verdict(&s, &d, 0o7777, true, false) == Verdict::Same, same);
            if !same { prop_assert_eq!(verdict(&s, &d, 0o7777, true, false), Verdict::Replace); }
        }

        #[test]
        fn a_directory_is_never_replaced_by_a_file(kind in prop::sample::select(vec![REG, LNK, 0o010000, 0o020000])) {
            let s = file(kind | 0o644, 1, (1, 1));
            let d = file(DIR | 0o755, 1, (1, 1));
            prop_assert_eq!(verdict(&s, &d, 0o7777, true, false), Verdict::DirInTheWay);
        }
    }

    #[test]
    fn mode_and_owner_fix_in_place() {
        let s = file(REG | 0o644, 10, (1, 2));
        let mut d = s;
        d.mode = REG | 0o600;
        assert_eq!(verdict(&s, &d, 0o7777, false, false), Verdict::FixMeta);
        let mut d = s;
        d.uid = 0;
        assert_eq!(verdict(&s, &d, 0o7777, true, false), Verdict::FixMeta);
        assert_eq!(verdict(&s, &d, 0o7777, false, false), Verdict::Same);
        // set-id bits are masked when owners are not kept
        let s = file(REG | 0o4755, 10, (1, 2));
        let d = file(REG | 0o755, 10, (1, 2));
        assert_eq!(verdict(&s, &d, 0o1777, false, false), Verdict::Same);
    }

    #[test]
    fn dir_times_ignore_atime() {
        let s = file(DIR | 0o755, 0, (7, 7));
        let mut d = s;
        d.atime = (9, 9);
        assert!(!dir_times_differ(&s, &d));
        d.mtime = (7, 8);
        assert!(dir_times_differ(&s, &d));
    }
}
