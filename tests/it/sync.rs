//! `sluice sync` (and re-runs of `copy`): only what differs is written,
//! and `--delete` is safe.

use crate::common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// A tree with every kind of entry sync has to compare.
fn tree(src: &Path) {
    write(&src.join("a/one"), b"one");
    write(&src.join("a/b/two"), &bytes(5000, 2));
    write(&src.join("big.bin"), &bytes(3 << 20, 3)); // chunked at 1M
    write(&src.join("top"), b"top");
    std::os::unix::fs::symlink("a/one", src.join("link")).unwrap();
    fs::hard_link(src.join("top"), src.join("a/top-again")).unwrap();
    fs::set_permissions(src.join("a/b"), fs::Permissions::from_mode(0o750)).unwrap();
    rustix::fs::setxattr(
        src.join("a"),
        "user.tag",
        b"dir",
        rustix::fs::XattrFlags::empty(),
    )
    .ok(); // tmpfs before 6.6 has no user xattrs: compared as absent then
}

const ARGS: &[&str] = &["--chunk-size", "1M", "--json"];

#[test]
fn unchanged_resync_writes_nothing_and_changes_no_ctime() {
    let t = disk_dir("resync");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    ok(&copy(&src, &dst, ARGS));
    let before = ctimes(&dst);
    std::thread::sleep(std::time::Duration::from_millis(20));
    for out in [sync(&src, &dst, ARGS), copy(&src, &dst, ARGS)] {
        ok(&out);
        let s = summary(&out);
        assert_eq!(s["files_copied"], 0, "{s}");
        assert_eq!(s["bytes_copied"], 0, "{s}");
        // one, two, big.bin, top, link, top-again
        assert_eq!(s["files_unchanged"], 6, "{s}");
        assert_eq!(ctimes(&dst), before, "a re-run touched DST");
    }
    assert_same_tree(&src, &dst);
}

#[test]
fn sync_copies_only_what_changed() {
    let t = disk_dir("changed");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    ok(&copy(&src, &dst, ARGS));
    let mode_only_ino = fs::metadata(dst.join("a/one")).unwrap().ino();
    // content (same size, new mtime), mode only, symlink target, new file,
    // new directory, a file that became a directory and the reverse
    write(&src.join("a/b/two"), &bytes(5000, 9));
    fs::set_permissions(src.join("a/one"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::remove_file(src.join("link")).unwrap();
    std::os::unix::fs::symlink("top", src.join("link")).unwrap();
    write(&src.join("new/file"), b"new");
    // top becomes a directory; its hard link a/top-again stays, alone
    fs::remove_file(src.join("top")).unwrap();
    write(&src.join("top/inside"), b"now a directory");
    let out = sync(&src, &dst, ARGS);
    ok(&out);
    let s = summary(&out);
    // two, new/file, top/inside; plus the symlink
    assert_eq!(s["files_copied"], 3, "{s}");
    assert_eq!(s["symlinks"], 1, "{s}");
    assert_eq!(s["bytes_copied"], 5000 + 3 + 15, "{s}");
    assert_same_tree(&src, &dst);
    // the mode change was applied in place, not by a copy
    assert_eq!(
        fs::metadata(dst.join("a/one")).unwrap().ino(),
        mode_only_ino
    );
}

#[test]
fn checksum_catches_what_size_and_mtime_miss() {
    let t = disk_dir("checksum");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("f"), &bytes(10_000, 1));
    set_mtime(&src.join("f"), 1_600_000_000, 5);
    ok(&copy(&src, &dst, &[]));
    // Same size and mtime, different bytes: the quick check cannot see it.
    write(&dst.join("f"), &bytes(10_000, 2));
    set_mtime(&dst.join("f"), 1_600_000_000, 5);
    let out = sync(&src, &dst, &["--json"]);
    ok(&out);
    assert_eq!(summary(&out)["files_copied"], 0);
    let out = sync(&src, &dst, &["--json", "--checksum"]);
    ok(&out);
    assert_eq!(summary(&out)["files_copied"], 1);
    assert_same_tree(&src, &dst);
    let out = sync(&src, &dst, &["--json", "--checksum"]);
    assert_eq!(summary(&out)["files_copied"], 0);
}

#[test]
fn broken_hard_links_in_dst_are_relinked() {
    let t = disk_dir("relink");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"shared");
    fs::hard_link(src.join("a"), src.join("b")).unwrap();
    ok(&copy(&src, &dst, &[]));
    // DST got a separate copy of b (same bytes, same mtime): not a link.
    fs::remove_file(dst.join("b")).unwrap();
    fs::copy(dst.join("a"), dst.join("b")).unwrap();
    let m = fs::metadata(src.join("a")).unwrap();
    set_mtime(&dst.join("b"), m.mtime(), m.mtime_nsec());
    ok(&sync(&src, &dst, &[]));
    assert_same_tree(&src, &dst);
}

#[test]
fn a_directory_in_the_way_of_a_file_is_reported_not_removed() {
    let t = disk_dir("inway");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("x"), b"file");
    write(&src.join("y"), b"y");
    write(&dst.join("x/keep"), b"precious");
    let out = sync(&src, &dst, &[]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("directory is in the way"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read(dst.join("x/keep")).unwrap(), b"precious");
    assert_eq!(fs::read(dst.join("y")).unwrap(), b"y");
}

/// With `--delete`, DST mirrors SRC even where a name changed kind: the
/// directory goes after the walk, then the file (a big, chunked one too)
/// and the symlink take its place, and a second run has nothing to do.
#[test]
fn delete_replaces_a_directory_by_the_file_of_the_same_name() {
    let t = disk_dir("replace");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&dst.join("small/deep/old"), b"old");
    write(&dst.join("big/old"), b"old");
    write(&dst.join("link/old"), b"old");
    write(&src.join("small"), b"now a file");
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    write(&src.join("big"), &big);
    std::os::unix::fs::symlink("small", src.join("link")).unwrap();
    let out = sync(&src, &dst, &["--delete", "--json", "--chunk-size", "1M"]);
    ok(&out);
    assert_eq!(summary(&out)["deleted"], 7);
    assert_same_tree(&src, &dst);
    let out = sync(&src, &dst, &["--delete", "--json"]);
    ok(&out);
    assert_eq!(summary(&out)["files_copied"], 0);
    assert_eq!(summary(&out)["deleted"], 0);
}

/// When the directory in the way may not be deleted (`--max-delete`), it
/// stays whole and the entry is reported, not written into it.
#[test]
fn a_directory_delete_may_not_remove_stays_and_is_reported() {
    let t = disk_dir("replace-limit");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&dst.join("x/keep"), b"precious");
    write(&src.join("x"), b"file");
    let out = sync(&src, &dst, &["--delete", "--max-delete", "0"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("was not deleted"), "{}", stderr(&out));
    assert_eq!(fs::read(dst.join("x/keep")).unwrap(), b"precious");
    assert!(!dst.join("x/x").exists());
}

#[test]
fn delete_removes_extras_but_keeps_excluded_and_never_follows_links() {
    let t = disk_dir("delete");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let outside = t.path().join("outside");
    write(&outside.join("victim"), b"untouched");
    tree(&src);
    ok(&copy(&src, &dst, &[]));
    write(&dst.join("extra-file"), b"x");
    write(&dst.join("a/extra-dir/deep/f"), b"x");
    std::os::unix::fs::symlink(&outside, dst.join("a/b/extra-link")).unwrap();
    write(&dst.join("notes.keep"), b"excluded, so not ours to delete");
    // Without --delete nothing is removed.
    ok(&sync(&src, &dst, &[]));
    assert!(dst.join("extra-file").exists());
    let out = sync(&src, &dst, &["--delete", "--exclude", "*.keep", "--json"]);
    ok(&out);
    let s = summary(&out);
    // extra-file, extra-dir, deep, f, extra-link
    assert_eq!(s["deleted"], 5, "{s}");
    assert_eq!(json_lines(&out, "deleted").len(), 5);
    assert_eq!(fs::read(outside.join("victim")).unwrap(), b"untouched");
    assert!(dst.join("notes.keep").exists());
    fs::remove_file(dst.join("notes.keep")).unwrap();
    let m = fs::metadata(&src).unwrap();
    set_mtime(&dst, m.mtime(), m.mtime_nsec());
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

#[test]
fn max_delete_stops_before_the_next_deletion() {
    let t = disk_dir("maxdel");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("kept"), b"k");
    for i in 0..5 {
        write(&dst.join(format!("extra{i}")), b"x");
    }
    let out = sync(&src, &dst, &["--delete", "--max-delete", "2", "--json"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("--max-delete 2"), "{}", stderr(&out));
    assert_eq!(summary(&out)["deleted"], 2);
    let left = (0..5)
        .filter(|i| dst.join(format!("extra{i}")).exists())
        .count();
    assert_eq!(left, 3);
    // --max-delete without --delete is a usage error.
    assert_eq!(code(&sync(&src, &dst, &["--max-delete", "1"])), 2);
}

/// An unreadable source directory looks empty; if that were trusted, its
/// copy in DST would be deleted. Any walk error cancels every deletion.
#[test]
fn delete_after_a_failed_walk_deletes_nothing() {
    let Some(t) = nobody_dir("delwalk", 0o777) else {
        return;
    };
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("secret/data"), b"s");
    write(&src.join("open"), b"o");
    ok(&as_nobody("sync", &src, &dst, &[]));
    write(&dst.join("extra"), b"x");
    fs::set_permissions(src.join("secret"), fs::Permissions::from_mode(0o000)).unwrap();
    let out = as_nobody("sync", &src, &dst, &["--delete"]);
    fs::set_permissions(src.join("secret"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("nothing deleted"), "{}", stderr(&out));
    assert!(dst.join("extra").exists());
    assert_eq!(fs::read(dst.join("secret/data")).unwrap(), b"s");
}

/// Rewrites `len` bytes at `off` of a file and gives it a new mtime.
fn scribble(path: &Path, off: u64, len: usize) {
    use std::os::unix::fs::FileExt;
    let f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&bytes(len, off), off).unwrap();
    set_mtime(path, 1_700_000_000 + off as i64, 0);
}

const MIB: u64 = 1 << 20;

/// Where DST can clone (btrfs here; SRC on another file system), a changed
/// big file gets a temporary cloned from its old copy, only the differing
/// blocks are written, and it is renamed into place as a whole.
#[test]
fn a_changed_big_file_is_cloned_and_patched_where_dst_can_clone() {
    let Some(lfs) = LoopFs::new("btrfs", 400) else {
        return;
    };
    let t = disk_dir("delta-clone");
    let src = t.path().join("src");
    write(&src.join("big.bin"), &bytes(40 << 20, 4));
    let dst = lfs.path().join("dst");
    ok(&copy(&src, &dst, &["--chunk-size", "1M"]));
    let old_ino = fs::metadata(dst.join("big.bin")).unwrap().ino();
    scribble(&src.join("big.bin"), 5 * MIB + 100, 10);
    scribble(&src.join("big.bin"), 30 * MIB, 4096);
    let out = sync(&src, &dst, &["--chunk-size", "1M", "--json"]);
    ok(&out);
    // Two 1 MiB chunks differ; nothing else is written. Within a chunk
    // the comparison goes buffer by buffer, and a stream's buffer shrinks
    // as more streams share the pool, so less than the chunk may be.
    let copied = summary(&out)["bytes_copied"].as_u64().unwrap();
    assert!((8192..=2 * MIB).contains(&copied), "{copied} bytes written");
    assert_same_tree(&src, &dst);
    assert_ne!(fs::metadata(dst.join("big.bin")).unwrap().ino(), old_ino);
    assert_no_temporaries(&dst);
}

/// `--inplace` patches DST's file itself on any file system (ext4 here,
/// which cannot clone); without it, a file that changed is copied whole.
#[test]
fn inplace_patches_only_what_differs_and_default_copies_whole() {
    let t = disk_dir("delta-inplace");
    let src = t.path().join("src");
    let dst = t.path().join("dst");
    write(&src.join("big.bin"), &bytes(40 << 20, 5));
    ok(&copy(&src, &dst, &["--chunk-size", "1M"]));
    let ino = fs::metadata(dst.join("big.bin")).unwrap().ino();
    scribble(&src.join("big.bin"), 7 * MIB, 100);
    // it grows by 100 KiB too: a new last chunk
    {
        use std::io::Write;
        let mut f = fs::OpenOptions::new()
            .append(true)
            .open(src.join("big.bin"))
            .unwrap();
        f.write_all(&bytes(100 << 10, 77)).unwrap();
    }
    set_mtime(&src.join("big.bin"), 1_750_000_000, 1);
    let out = sync(&src, &dst, &["--chunk-size", "1M", "--inplace", "--json"]);
    ok(&out);
    // One chunk differs, or a buffer's worth of it (see above), and the
    // 100 KiB it grew by.
    let copied = summary(&out)["bytes_copied"].as_u64().unwrap();
    assert!(
        ((100 << 10) + 100..=MIB + (100 << 10)).contains(&copied),
        "{copied} bytes written"
    );
    assert_same_tree(&src, &dst);
    assert_eq!(fs::metadata(dst.join("big.bin")).unwrap().ino(), ino);
    // The default on a file system that cannot clone: the whole file.
    scribble(&src.join("big.bin"), 20 * MIB, 10);
    let out = sync(
        &src,
        &dst,
        &["--chunk-size", "1M", "--json", "--reflink", "never"],
    );
    ok(&out);
    assert_eq!(summary(&out)["bytes_copied"], (40 << 20) + (100 << 10));
    assert_same_tree(&src, &dst);
}

/// `sync --delete --dry-run` says what a real run would copy and delete,
/// and touches nothing.
#[test]
fn dry_run_compares_with_dst_and_changes_nothing() {
    let t = disk_dir("dry");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    ok(&copy(&src, &dst, &[]));
    write(&src.join("a/new"), b"new");
    write(&src.join("top"), b"changed!");
    write(&dst.join("a/b/extra-dir/x"), b"x");
    write(&dst.join("extra"), b"x");
    // Shaped like a temporary but without the tag of this directory: not
    // provably sluice's, so a user's file like any other (an extra here).
    write(&dst.join(".sluice-1-2.tmp"), b"not ours");
    let before = ctimes(&dst);
    let out = sync(&src, &dst, &["--delete", "--dry-run", "--json"]);
    ok(&out);
    let s = summary(&out);
    // top and its hard link a/top-again changed (a dry run counts each
    // name as a file), a/new is new
    assert_eq!(s["files_copied"], 3, "{s}");
    assert_eq!(s["deleted"], 4, "{s}"); // extra-dir, its x, extra, .sluice-1-2.tmp
    assert_eq!(json_lines(&out, "deleted").len(), 4);
    assert_eq!(ctimes(&dst), before, "a dry run changed DST");
    // into a DST that does not exist: everything would be copied
    let out = sync(&src, &t.path().join("none"), &["--dry-run", "--json"]);
    ok(&out);
    assert_eq!(summary(&out)["files_copied"], 6);
    assert!(!t.path().join("none").exists());
}

/// `setfattr` and `setfacl` change nothing but an inode's ctime and its
/// attributes: a sync sees it by the ctime and copies the file again.
#[test]
fn an_xattr_only_change_is_synced() {
    let d = disk_dir("xattr");
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    write(&src.join("f"), b"data");
    write(&src.join("g"), b"untouched");
    ok(&sync(&src, &dst, &[]));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let set = rustix::fs::setxattr(
        src.join("f"),
        "user.sluice-test",
        b"v1",
        rustix::fs::XattrFlags::empty(),
    );
    if set.is_err() {
        eprintln!("skipped: the disk here takes no user xattrs");
        return;
    }
    let o = sync(&src, &dst, &["--json"]);
    ok(&o);
    let s = summary(&o);
    assert_eq!(s["files_copied"], 1, "{s}");
    assert_same_tree(&src, &dst);
    // And an unchanged pair stays untouched.
    let o = sync(&src, &dst, &["--json"]);
    assert_eq!(summary(&o)["files_copied"], 0);
    // A directory DST already has gets SRC's new attribute, and (as root)
    // its owner back, in place.
    write(&src.join("d/h"), b"h");
    ok(&sync(&src, &dst, &[]));
    rustix::fs::setxattr(
        src.join("d"),
        "user.sluice-dir",
        b"v2",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    if is_root() {
        assert!(run(
            "chown",
            &["65534:65534", dst.join("d").to_str().unwrap()]
        ));
    }
    ok(&sync(&src, &dst, &[]));
    assert_same_tree(&src, &dst);
}
