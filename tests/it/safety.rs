//! The escape and data-loss paths a review found (issue 13), each tried on
//! the real binary: writes that could land outside DST, deletes that could
//! wipe a replica, results that could be silently wrong, hangs.

use crate::common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Waits up to 20 s for `cond`.
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if cond() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("not within 20 s: {what}");
}

/// Item 1: a watch pass over a changed subdirectory reaches DST/sub from
/// DST's root descriptor; a symlink planted at DST/sub neither receives
/// the pass's files nor loses its target's files to the pass's deletes.
#[test]
fn a_watch_pass_never_follows_a_symlink_planted_in_dst() {
    let t = disk_dir("wsym");
    let (src, dst, victim) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("victim"),
    );
    write(&src.join("sub/a"), b"a");
    write(&victim.join("precious"), b"only copy");
    let mut child = sluice()
        .args(["watch", "--json", "--no-progress"])
        .arg(&src)
        .arg(&dst)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the initial sync", || dst.join("sub/a").is_file());
    fs::rename(dst.join("sub"), t.path().join("old-sub")).unwrap();
    std::os::unix::fs::symlink(&victim, dst.join("sub")).unwrap();
    write(&src.join("sub/new"), b"new");
    // The pass runs; then a full pass replaces the link with a directory.
    eventually("sub/new in a real DST/sub", || {
        fs::symlink_metadata(dst.join("sub")).is_ok_and(|m| m.is_dir())
            && dst.join("sub/new").is_file()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(fs::read(victim.join("precious")).unwrap(), b"only copy");
    assert!(
        !victim.join("new").exists(),
        "a pass wrote through the link"
    );
    assert!(!victim.join("a").exists(), "a pass wrote through the link");
}

/// Item 2: a later name of a hard-linked file is linked from the first
/// name's directory held open, not by a path resolved through DST: the
/// first name's directory swapped for a symlink (while the link waits,
/// held by strace) never makes DST hard-link a file outside it.
#[test]
fn a_hard_link_is_never_made_through_a_directory_swapped_for_a_symlink() {
    if !is_root() {
        eprintln!("skipped: the race is held with strace as root");
        return;
    }
    let t = disk_dir("hsym");
    let (src, dst, outside) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("outside"),
    );
    write(&src.join("d1/a"), b"linked data");
    fs::create_dir_all(src.join("d2")).unwrap();
    fs::hard_link(src.join("d1/a"), src.join("d2/b")).unwrap();
    write(&outside.join("a"), b"not DST's");
    // One stream: d1 (and its a) is done before d2 is entered. Every
    // linkat is held 400 ms on entry, which is when the path of the old
    // code was resolved.
    let Some(mut cmd) = under_strace(
        "linkat",
        "delay_enter=400000",
        "copy",
        &src,
        &dst,
        &["-j", "1"],
    ) else {
        return;
    };
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("DST/d2 created", || dst.join("d2").is_dir());
    fs::rename(dst.join("d1"), t.path().join("d1-real")).unwrap();
    std::os::unix::fs::symlink(&outside, dst.join("d1")).unwrap();
    child.wait().unwrap();
    let out_ino = fs::metadata(outside.join("a")).unwrap().ino();
    assert_eq!(fs::metadata(outside.join("a")).unwrap().nlink(), 1);
    if let Ok(m) = fs::symlink_metadata(dst.join("d2/b")) {
        assert_ne!(
            m.ino(),
            out_ino,
            "DST/d2/b is a hard link to a file outside DST"
        );
    }
}

/// Item 3: a dangling symlink where the journal goes (or the image's chunk
/// map) never makes sluice create a file at its target.
#[test]
fn state_files_are_never_created_through_a_symlink() {
    let t = disk_dir("jsym");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("big"), &bytes(3 << 20, 1));
    fs::create_dir_all(&dst).unwrap();
    let target = t.path().join("created-by-sluice");
    std::os::unix::fs::symlink(&target, dst.join(".sluice-journal.redb")).unwrap();
    let out = copy(&src, &dst, &["--chunk-size", "1M"]);
    ok(&out);
    assert!(
        !target.exists(),
        "the journal was created through a symlink"
    );
    assert_eq!(
        fs::read(dst.join("big")).unwrap(),
        fs::read(src.join("big")).unwrap()
    );

    let img = t.path().join("disk.img");
    fs::write(&img, bytes(1 << 20, 2)).unwrap();
    let out_img = t.path().join("copy.img");
    let map_target = t.path().join("map-created-by-sluice");
    std::os::unix::fs::symlink(&map_target, t.path().join("copy.img.sluice-map")).unwrap();
    let out = run_cmd("image", &img, &out_img, &[]);
    assert!(
        !map_target.exists(),
        "the chunk map was created through a symlink"
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("chunk map"), "{}", stderr(&out));
}

/// Item 4: an empty SRC root (an unmounted mount point) never empties a
/// non-empty DST; `--allow-empty-src` says it is meant.
#[test]
fn an_empty_source_root_never_empties_the_destination() {
    let t = disk_dir("empty");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    fs::create_dir_all(&src).unwrap();
    write(&dst.join("a"), b"a");
    write(&dst.join("d/b"), b"b");
    let out = sync(&src, &dst, &["--delete", "--json"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--allow-empty-src"),
        "{}",
        stderr(&out)
    );
    assert_eq!(summary(&out)["deleted"], 0);
    assert!(dst.join("a").is_file() && dst.join("d/b").is_file());
    let out = sync(&src, &dst, &["--delete", "--allow-empty-src", "--json"]);
    ok(&out);
    assert_eq!(summary(&out)["deleted"], 3);
    assert!(fs::read_dir(&dst).unwrap().next().is_none());
}

/// Item 4, unattended: a watch whose SRC is replaced (a share that drops
/// leaves its empty mount point) pauses instead of deleting DST.
#[test]
fn a_watch_pauses_when_its_source_is_no_longer_the_same_directory() {
    let t = disk_dir("wsrc");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"a");
    write(&src.join("d/b"), b"b");
    // Rescans every second: a full pass is due while SRC is replaced.
    let mut child = sluice()
        .args(["watch", "--json", "--no-progress", "--rescan", "1"])
        .arg(&src)
        .arg(&dst)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the initial sync", || dst.join("d/b").is_file());
    fs::rename(&src, t.path().join("src-away")).unwrap();
    fs::create_dir(&src).unwrap();
    fs::write(src.join("late"), b"x").unwrap(); // an event in the new SRC
    std::thread::sleep(Duration::from_secs(3));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(
        dst.join("a").is_file() && dst.join("d/b").is_file(),
        "DST was emptied"
    );
    assert!(
        stdout(&out).contains("\"src_unavailable\""),
        "the pause was not said: {}",
        stdout(&out)
    );
}

/// Item 5: `--delete` never deletes into a file system mounted inside DST
/// (with or without `-x`); it reports the mount point. With `-x`, nothing
/// on another file system in DST is deleted at all (as rsync -x).
#[test]
fn delete_never_crosses_into_a_file_system_mounted_in_dst() {
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let t = disk_dir("mnt");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("keep"), b"k");
    write(&src.join("same/x"), b"x");
    let (mnt, same) = (dst.join("data/mnt"), dst.join("same"));
    for m in [&mnt, &same] {
        fs::create_dir_all(m).unwrap();
        assert!(run("mount", &["-t", "tmpfs", "tmpfs", m.to_str().unwrap()]));
    }
    write(&mnt.join("on-the-mount"), b"precious");
    write(&same.join("extra-on-a-mount"), b"kept with -x");
    let out = sync(&src, &dst, &["--delete", "-x", "--json"]);
    let kept = (
        fs::read(mnt.join("on-the-mount")),
        fs::read(same.join("extra-on-a-mount")),
    );
    let out2 = sync(&src, &dst, &["--delete", "--json"]);
    let kept2 = fs::read(mnt.join("on-the-mount"));
    for m in [&mnt, &same] {
        let _ = run("umount", &[m.to_str().unwrap()]);
    }
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(stderr(&out).contains("mount point"), "{}", stderr(&out));
    assert_eq!(kept.0.unwrap(), b"precious");
    assert_eq!(kept.1.unwrap(), b"kept with -x");
    assert_eq!(code(&out2), 1, "{}", stderr(&out2));
    assert_eq!(
        kept2.unwrap(),
        b"precious",
        "deleted across the mount without -x"
    );
}

/// Item 6: after a power loss (ext4's shutdown ioctl, log flushed, data
/// not), a sparse file never comes back looking complete with zeros in it:
/// the rerun finds it right or copies it again.
#[test]
fn a_sparse_file_is_never_complete_looking_with_lost_data_after_a_power_loss() {
    if !have("xfs_io") {
        eprintln!("skipped: xfs_io (xfsprogs) shuts file systems down");
        return;
    }
    let Some(fs_) = LoopFs::new("ext4", 64) else {
        return;
    };
    let t = disk_dir("sparse");
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let f = fs::File::create(src.join("sparse")).unwrap();
    f.set_len(8 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&bytes(256 << 10, 3), 2 << 20).unwrap();
    f.write_all_at(&bytes(64 << 10, 4), 6 << 20).unwrap();
    drop(f);
    write(&src.join("dense"), &bytes(300 << 10, 5));
    let dst = fs_.path().join("dst");
    ok(&copy(&src, &dst, &[]));
    // -f: the log is flushed first (LOGFLUSH): metadata reaches the disk,
    // data still in the page cache does not.
    assert!(run(
        "xfs_io",
        &["-x", "-c", "shutdown -f", fs_.path().to_str().unwrap()]
    ));
    // Remount: what the log kept is what a power loss would have kept.
    fs_.remount();
    let out = sync(&src, &dst, &["--json"]);
    ok(&out);
    for name in ["sparse", "dense"] {
        assert!(
            fs::read(dst.join(name)).unwrap() == fs::read(src.join(name)).unwrap(),
            "{name} differs after the power loss and a rerun"
        );
    }
}

/// Item 7: names shaped like sluice's temporaries that sluice did not
/// create in that directory are user files: copied, kept, not re-copied.
#[test]
fn files_named_like_temporaries_are_not_taken_for_leftovers() {
    let t = disk_dir("tmpname");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join(".sluice-1a-2.tmp"), b"a user's file");
    write(&src.join("d/.sluice-ff-0.tmp"), b"another");
    write(&dst.join(".sluice-3-4.tmp"), b"only in DST");
    ok(&copy(&src, &dst, &[]));
    let out = copy(&src, &dst, &["--json"]);
    ok(&out);
    assert_eq!(
        summary(&out)["files_copied"],
        0,
        "copied again: {}",
        stdout(&out)
    );
    assert_eq!(
        fs::read(dst.join(".sluice-3-4.tmp")).unwrap(),
        b"only in DST"
    );
    assert_eq!(
        fs::read(dst.join(".sluice-1a-2.tmp")).unwrap(),
        b"a user's file"
    );
}

/// Item 8: a run over DST leaves alone the subtree another run is writing
/// (its temporary survives, it finishes), and a single-file copy locks its
/// target directory.
#[test]
fn a_run_never_disturbs_another_run_below_it() {
    let t = disk_dir("nested");
    let (src, dst, big) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("big"),
    );
    write(&src.join("sub/x"), b"x");
    write(&src.join("top"), b"t");
    ok(&copy(&src, &dst, &[]));
    write(&big.join("slow"), &bytes(6 << 20, 6));
    // B: 6 MiB at 1 MiB/s (6 s) into DST/sub, a named temporary in flight.
    let b = sluice()
        .args([
            "copy",
            "--no-progress",
            "--chunk-size",
            "1M",
            "--bwlimit",
            "1M",
        ])
        .arg(&big)
        .arg(dst.join("sub"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("B's temporary", || {
        fs::read_dir(dst.join("sub")).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".sluice-")
        })
    });
    let a = sync(&src, &dst, &["--json"]);
    assert_eq!(code(&a), 1, "{}", stderr(&a));
    assert!(stderr(&a).contains("another sluice run"), "{}", stderr(&a));
    // A single-file copy into DST/sub while B holds it: refused at once.
    let one = copy(&src.join("top"), &dst.join("sub"), &[]);
    assert_eq!(code(&one), 2, "{}", stderr(&one));
    let b = b.wait_with_output().unwrap();
    assert_eq!(
        b.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&b.stderr)
    );
    assert_eq!(
        fs::read(dst.join("sub/slow")).unwrap(),
        fs::read(big.join("slow")).unwrap()
    );
}

/// Item 9: entries created in a DST directory that has a default ACL end
/// with exactly SRC's ACLs (none, here) and SRC's mode.
#[test]
fn a_default_acl_in_dst_is_not_inherited_by_what_sluice_creates() {
    if !have("setfacl") {
        eprintln!("skipped: setfacl (acl) is not installed");
        return;
    }
    let t = disk_dir("acl");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("d/f"), b"f");
    fs::create_dir_all(src.join("d/sub")).unwrap();
    fs::set_permissions(src.join("d/f"), fs::Permissions::from_mode(0o644)).unwrap();
    let mut names = vec!["d/f", "d/sub"];
    if is_root() {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            src.join("d/fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o640),
            0,
        )
        .unwrap();
        names.push("d/fifo");
    }
    // Set after the contents were created: they have no ACL of their own.
    if !run(
        "setfacl",
        &[
            "-d",
            "-m",
            "u::rwx,g::---,o::---,u:nobody:rwx",
            src.join("d").to_str().unwrap(),
        ],
    ) {
        eprintln!("skipped: this file system has no ACLs");
        return;
    }
    ok(&copy(&src, &dst, &[]));
    for rel in names {
        let (s, d) = (src.join(rel), dst.join(rel));
        assert_eq!(xattr_names(&d), xattr_names(&s), "{rel}: ACLs differ");
        assert_eq!(
            fs::metadata(&d).unwrap().mode() & 0o7777,
            fs::metadata(&s).unwrap().mode() & 0o7777,
            "{rel}: mode"
        );
    }
}

fn xattr_names(p: &Path) -> Vec<String> {
    let out = std::process::Command::new("getfattr")
        .args(["-d", "-m", "-", "--absolute-names"])
        .arg(p)
        .output()
        .unwrap();
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split('=').next().unwrap().to_string())
        .collect();
    v.sort();
    v
}

/// Item 10: `sync --delete` onto a full disk whose space the extras hold
/// converges in one run.
#[test]
fn sync_delete_onto_a_full_disk_converges() {
    let Some(fs_) = LoopFs::new("ext4", 64) else {
        return;
    };
    let t = disk_dir("full");
    let src = t.path().join("src");
    for i in 0..3 {
        write(&src.join(format!("f{i}")), &bytes(20 << 20, i));
    }
    let dst = fs_.path().join("dst");
    let out = sync(&src, &dst, &["--delete"]);
    assert_eq!(code(&out), 2, "three 20 MiB files fit? {}", stderr(&out));
    // Now SRC holds new data that fits only once the old is gone.
    for i in 0..3 {
        fs::remove_file(src.join(format!("f{i}"))).unwrap();
    }
    write(&src.join("new"), &bytes(40 << 20, 9));
    let have_old = fs::read_dir(&dst).unwrap().count();
    assert!(have_old >= 2, "the first run left what it copied");
    let out = sync(&src, &dst, &["--delete", "--json"]);
    ok(&out);
    assert_same_tree(&src, &dst);
}

/// Item 11: files whose size lies (`/proc` says 0, `/sys` pads to 4096)
/// are copied as a read returns them.
#[test]
fn proc_and_sys_files_are_copied_as_read() {
    let t = disk_dir("proc");
    for src in [
        "/proc/sys/kernel/ostype",
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "/sys/class/mem/null/dev",
    ] {
        let src = Path::new(src);
        if !src.is_file() {
            continue;
        }
        let dst = t.path().join(src.file_name().unwrap());
        let out = copy(src, &dst, &[]);
        ok(&out);
        assert_eq!(
            fs::read(&dst).unwrap(),
            fs::read(src).unwrap(),
            "{}",
            src.display()
        );
    }
}

/// Item 12: SIGINT, SIGTERM and SIGHUP stop a throttled copy within a
/// second (the token bucket never sleeps a whole debt), with exit 130.
#[test]
fn signals_stop_a_throttled_copy_within_a_second() {
    use rustix::process::Signal;
    let t = disk_dir("bw");
    let src = t.path().join("src");
    write(&src.join("f"), &bytes(4 << 20, 7));
    for sig in [Signal::INT, Signal::TERM, Signal::HUP] {
        let dst = t.path().join(format!("dst-{}", sig.as_raw()));
        // 10 KiB/s: one 64 KiB piece is a 6 s debt.
        let child = sluice()
            .args(["copy", "--no-progress", "--bwlimit", "10K"])
            .arg(&src)
            .arg(&dst)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(800));
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        let sent = Instant::now();
        rustix::process::kill_process(pid, sig).unwrap();
        let out = child.wait_with_output().unwrap();
        let took = sent.elapsed();
        assert!(
            took < Duration::from_millis(3000),
            "{sig:?}: stopped after {took:?}"
        );
        assert_eq!(out.status.code(), Some(130), "{sig:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("interrupted"), "{sig:?}: {err}");
        assert_no_partial_files(&src, &dst);
    }
}

/// Item 13: a directory onto an existing file says what is wrong; an
/// unreadable journal is reported; bytes of a file that failed are not
/// counted as copied.
#[test]
fn small_things_are_said_and_counted_right() {
    let t = disk_dir("small");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"a");
    write(&dst, b"a file");
    let out = copy(&src, &dst, &[]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("is a file, not a directory"),
        "{}",
        stderr(&out)
    );

    let dst = t.path().join("dst2");
    write(&src.join("big"), &bytes(3 << 20, 8));
    write(&dst.join(".sluice-journal.redb"), b"not a database");
    let out = copy(&src, &dst, &["--chunk-size", "1M"]);
    ok(&out);
    assert!(
        stderr(&out).contains("journal"),
        "not said: {}",
        stderr(&out)
    );
    assert!(!dst.join(".sluice-journal.redb").exists());
}

/// Item 13: a big file that fails counts no bytes as copied.
#[test]
fn bytes_of_a_failed_file_are_not_counted() {
    let t = disk_dir("bytesfail");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("big"), &bytes(4 << 20, 9));
    // Every chunk lands; then its data cannot be made durable (fdatasync
    // fails), so the file is not committed.
    let Some(mut cmd) = under_strace(
        "fdatasync",
        "error=EIO",
        "copy",
        &src,
        &dst,
        &["--chunk-size", "1M", "--json"],
    ) else {
        return;
    };
    let out = cmd.output().unwrap();
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let s = summary(&out);
    assert_eq!(s["files_copied"], 0, "{s}");
    assert_eq!(s["bytes_copied"], 0, "{s}");
}

/// Item 13: a source directory that vanishes while the tree is walked is
/// reported (the rest is copied, exit 0).
#[test]
fn a_directory_vanishing_mid_walk_is_reported() {
    let t = disk_dir("vanish");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"a");
    write(&src.join("sub/x"), b"x");
    // The root's first listing returns, then is held 3 s: sub goes.
    let Some(mut cmd) = under_strace(
        "getdents64",
        "delay_exit=3000000:when=1",
        "copy",
        &src,
        &dst,
        &["-j", "1", "--json"],
    ) else {
        return;
    };
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // DST exists before the root is listed; a second later the listing
    // has surely begun and sits in its 3 s delay, its entries read.
    eventually("DST created", || dst.is_dir());
    std::thread::sleep(std::time::Duration::from_millis(1000));
    fs::remove_dir_all(src.join("sub")).unwrap();
    let out = child.wait_with_output().unwrap();
    ok(&out);
    let notes = json_lines(&out, "notice");
    assert!(
        notes
            .iter()
            .any(|n| n["path"].as_str().unwrap().ends_with("sub")),
        "not reported: {}",
        stdout(&out)
    );
    assert_eq!(fs::read(dst.join("a")).unwrap(), b"a");
}
