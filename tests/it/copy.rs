//! `sluice copy` end to end on the disk and tmpfs.

use crate::common::*;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Builds a tree holding every kind of entry and odd name sluice promises
/// to preserve.
pub fn kitchen_sink(root: &Path) {
    fs::create_dir_all(root).unwrap();
    write(&root.join("plain.txt"), b"hello\n");
    write(&root.join("empty"), b"");
    write(&root.join("a/b/c/deep.bin"), &bytes(70_000, 1));
    write(&root.join("ro-dir/inside"), b"x");
    // Odd names: newline, invalid UTF-8, a 255-byte name, spaces, a leading dash.
    write(&root.join(OsStr::from_bytes(b"new\nline")), b"nl");
    write(
        &root.join(OsStr::from_bytes(b"bad-\xff\xfe-utf8")),
        b"bytes",
    );
    write(&root.join("x".repeat(255)), b"long name");
    write(&root.join(" spaced name "), b"s");
    write(&root.join("-dash"), b"d");
    // Symlinks: relative, absolute, dangling, to a directory.
    std::os::unix::fs::symlink("plain.txt", root.join("link-rel")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("link-abs")).unwrap();
    std::os::unix::fs::symlink("does/not/exist", root.join("link-dangling")).unwrap();
    std::os::unix::fs::symlink("a/b", root.join("link-dir")).unwrap();
    // Hard links across directories.
    write(&root.join("hl/one"), &bytes(5000, 2));
    fs::create_dir_all(root.join("hl2")).unwrap();
    fs::hard_link(root.join("hl/one"), root.join("hl/two")).unwrap();
    fs::hard_link(root.join("hl/one"), root.join("hl2/three")).unwrap();
    // A FIFO.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();
    // Sparse file: data, a 20 MiB hole, data.
    let f = fs::File::create(root.join("sparse.img")).unwrap();
    f.set_len(20 << 20).unwrap();
    drop(f);
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new()
            .write(true)
            .open(root.join("sparse.img"))
            .unwrap();
        f.write_all_at(b"head", 0).unwrap();
        f.write_all_at(b"tail", (20 << 20) - 4).unwrap();
    }
    // Extended attribute.
    let _ = rustix::fs::setxattr(
        root.join("plain.txt"),
        "user.sluice",
        b"kept",
        rustix::fs::XattrFlags::empty(),
    );
    // Modes, including ones that forbid writing, and set-id bits.
    fs::set_permissions(root.join("plain.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    fs::set_permissions(root.join("empty"), fs::Permissions::from_mode(0o400)).unwrap();
    write(&root.join("suid"), b"#!/bin/sh\n");
    fs::set_permissions(root.join("suid"), fs::Permissions::from_mode(0o4755)).unwrap();
    fs::set_permissions(root.join("ro-dir"), fs::Permissions::from_mode(0o555)).unwrap();
    // Nanosecond times on files and directories, set last.
    set_mtime(&root.join("plain.txt"), 1_000_000_000, 123_456_789);
    set_mtime(&root.join("link-rel"), 1_100_000_000, 1);
    set_mtime(&root.join("a/b"), 1_200_000_000, 999_999_999);
    set_mtime(&root.join("ro-dir"), 1_300_000_000, 5);
    set_mtime(root, 1_400_000_000, 42);
}

/// A path longer than PATH_MAX (4096): 40 levels of 120-byte names.
fn deep_path(root: &Path) -> std::path::PathBuf {
    let mut rel = std::path::PathBuf::new();
    for i in 0..40 {
        rel.push(format!("{i:03}{}", "d".repeat(117)));
    }
    // std::fs refuses such paths in one call; build it level by level.
    let mut dir = fs::File::open(root).unwrap();
    for c in rel.components() {
        let name = c.as_os_str();
        let _ = rustix::fs::mkdirat(&dir, name, rustix::fs::Mode::from_raw_mode(0o755));
        dir = open_in(&dir, name, rustix::fs::OFlags::DIRECTORY).into();
    }
    let flags = rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY;
    rustix::io::write(open_in(&dir, "leaf".as_ref(), flags), b"deep").unwrap();
    rel.join("leaf")
}

/// `openat(dir, name)` with mode 0644 for creation.
fn open_in(dir: &fs::File, name: &OsStr, flags: rustix::fs::OFlags) -> std::os::fd::OwnedFd {
    rustix::fs::openat(dir, name, flags, rustix::fs::Mode::from_raw_mode(0o644)).unwrap()
}

fn read_deep(root: &Path, rel: &Path) -> Vec<u8> {
    let mut dir = fs::File::open(root).unwrap();
    let comps: Vec<_> = rel.components().collect();
    for c in &comps[..comps.len() - 1] {
        dir = open_in(&dir, c.as_os_str(), rustix::fs::OFlags::DIRECTORY).into();
    }
    let fd = open_in(&dir, "leaf".as_ref(), rustix::fs::OFlags::RDONLY);
    let mut buf = [0u8; 16];
    let n = rustix::io::read(&fd, &mut buf).unwrap();
    buf[..n].to_vec()
}

fn roundtrip_on(base: &Path) {
    let src = base.join("src");
    let dst = base.join("dst");
    kitchen_sink(&src);
    let out = copy(&src, &dst, &[]);
    ok(&out);
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
    // Sparse stays sparse: 20 MiB logical, a few KiB allocated.
    let m = fs::metadata(dst.join("sparse.img")).unwrap();
    assert_eq!(m.len(), 20 << 20);
    assert!(
        m.blocks() * 512 < 1 << 20,
        "sparse file was filled in: {} blocks",
        m.blocks()
    );
}

#[test]
fn every_kind_of_entry_round_trips_on_disk() {
    let t = disk_dir("sink");
    roundtrip_on(t.path());
}

#[test]
fn every_kind_of_entry_round_trips_on_tmpfs() {
    let Some(t) = tmpfs_dir("sink") else {
        eprintln!("skipped: no tmpfs at /dev/shm");
        return;
    };
    roundtrip_on(t.path());
}

#[test]
fn copies_between_tmpfs_and_disk() {
    let Some(t) = tmpfs_dir("x") else {
        eprintln!("skipped: no tmpfs at /dev/shm");
        return;
    };
    let d = disk_dir("x");
    kitchen_sink(&t.path().join("src"));
    ok(&copy(&t.path().join("src"), &d.path().join("dst"), &[]));
    assert_same_tree(&t.path().join("src"), &d.path().join("dst"));
}

#[test]
fn setid_bits_follow_ownership() {
    let t = disk_dir("suid");
    let src = t.path().join("src");
    write(&src.join("f"), b"x");
    fs::set_permissions(src.join("f"), fs::Permissions::from_mode(0o6755)).unwrap();
    ok(&copy(&src, &t.path().join("dst"), &[]));
    let mode = fs::metadata(t.path().join("dst/f"))
        .unwrap()
        .permissions()
        .mode()
        & 0o7777;
    if is_root() {
        assert_eq!(mode, 0o6755, "root preserves owner, so keeps set-id bits");
    } else {
        assert_eq!(
            mode, 0o755,
            "set-id bits are dropped when the owner is not preserved"
        );
    }
}

#[test]
fn device_nodes_are_recreated_as_root() {
    if !is_root() {
        eprintln!("skipped: creating device nodes needs root");
        return;
    }
    let t = disk_dir("dev");
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let dev = rustix::fs::makedev(1, 3);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("null"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        dev,
    )
    .unwrap();
    ok(&copy(&src, &t.path().join("dst"), &[]));
    assert_same_tree(&src, &t.path().join("dst"));
}

#[test]
fn paths_longer_than_path_max_are_copied() {
    let t = disk_dir("deep");
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let rel = deep_path(&src);
    assert!(rel.as_os_str().len() > 4096);
    ok(&copy(&src, &t.path().join("dst"), &[]));
    assert_eq!(read_deep(&t.path().join("dst"), &rel), b"deep");
}

/// Sizes around the chunk boundaries, with a small chunk so every case
/// is split or not split as the size says.
#[test]
fn chunked_copies_are_byte_identical_at_boundaries() {
    let chunk = 64 * 1024;
    let t = disk_dir("chunks");
    let src = t.path().join("src");
    let sizes = [
        0,
        1,
        chunk - 1,
        chunk,
        chunk + 1,
        2 * chunk,
        2 * chunk + 1,
        3 * chunk,
        7 * chunk + 13,
        64 * chunk + 4095,
    ];
    for (i, &size) in sizes.iter().enumerate() {
        write(
            &src.join(format!("f{i:02}-{size}")),
            &bytes(size, i as u64 + 10),
        );
    }
    for args in [
        &["--chunk-size", "64K"][..],
        &["--chunk-size", "64K", "-j", "1"],
        &["--chunk-size", "64K", "--no-direct"],
    ] {
        let dst = t.path().join(format!("dst{}", args.len()));
        let out = copy(&src, &dst, args);
        ok(&out);
        assert_same_tree(&src, &dst);
        assert_no_temporaries(&dst);
    }
}

/// A > 4 GiB sparse file with data at both ends and across the 4 GiB mark
/// is copied byte for byte and stays sparse.
#[test]
fn huge_sparse_file_stays_sparse_and_identical() {
    use std::os::unix::fs::FileExt;
    let t = disk_dir("huge");
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let f = fs::File::create(src.join("big.img")).unwrap();
    let size: u64 = (5 << 30) + 12345;
    f.set_len(size).unwrap();
    let marks = [0u64, (1 << 30) - 3, 4 << 30, size - 100];
    for (i, &off) in marks.iter().enumerate() {
        f.write_all_at(&bytes(100, i as u64), off).unwrap();
    }
    drop(f);
    let dst = t.path().join("dst");
    ok(&copy(&src, &dst, &[]));
    let d = fs::File::open(dst.join("big.img")).unwrap();
    let m = d.metadata().unwrap();
    assert_eq!(m.len(), size);
    assert!(
        m.blocks() * 512 < 64 << 20,
        "copy is not sparse: {} blocks",
        m.blocks()
    );
    for (i, &off) in marks.iter().enumerate() {
        let mut buf = vec![0u8; 100];
        d.read_exact_at(&mut buf, off).unwrap();
        assert_eq!(buf, bytes(100, i as u64), "data at {off} differs");
    }
    // And the holes read as zeros.
    let mut buf = vec![1u8; 4096];
    d.read_exact_at(&mut buf, 2 << 30).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn single_file_to_file_and_into_directory() {
    let t = disk_dir("single");
    let src = t.path().join("one.bin");
    write(&src, &bytes(300_000, 3));
    set_mtime(&src, 1_500_000_000, 7);
    // To a new file name.
    ok(&copy(
        &src,
        &t.path().join("copy.bin"),
        &["--chunk-size", "64K"],
    ));
    assert_eq!(
        fs::read(t.path().join("copy.bin")).unwrap(),
        fs::read(&src).unwrap()
    );
    assert_eq!(
        fs::metadata(t.path().join("copy.bin"))
            .unwrap()
            .mtime_nsec(),
        7
    );
    // Into an existing directory: DST/name.
    fs::create_dir(t.path().join("into")).unwrap();
    ok(&copy(&src, &t.path().join("into"), &[]));
    assert_eq!(
        fs::read(t.path().join("into/one.bin")).unwrap(),
        fs::read(&src).unwrap()
    );
}

#[test]
fn copy_replaces_what_differs_and_never_follows_dst_symlinks() {
    let t = disk_dir("replace");
    let src = t.path().join("src");
    let dst = t.path().join("dst");
    let outside = t.path().join("outside");
    write(&src.join("f"), b"new content");
    write(&src.join("sub/g"), b"g");
    write(&outside.join("victim"), b"untouched");
    write(&dst.join("f"), b"old");
    // DST has symlinks where SRC has a file and a directory.
    std::os::unix::fs::symlink(outside.join("victim"), dst.join("h")).unwrap();
    write(&src.join("h"), b"h");
    std::os::unix::fs::symlink(&outside, dst.join("sub")).unwrap();
    ok(&copy(&src, &dst, &[]));
    // The symlink where SRC has a directory is replaced by a directory;
    // nothing is written through it.
    assert!(fs::symlink_metadata(dst.join("sub")).unwrap().is_dir());
    assert_eq!(fs::read(dst.join("sub/g")).unwrap(), b"g");
    assert_eq!(fs::read(dst.join("f")).unwrap(), b"new content");
    assert_eq!(fs::read(dst.join("h")).unwrap(), b"h");
    assert!(!fs::symlink_metadata(dst.join("h"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(outside.join("victim")).unwrap(), b"untouched");
    assert!(
        !outside.join("g").exists(),
        "a write escaped DST through a symlink"
    );
}

#[test]
fn exclude_include_and_dry_run() {
    let t = disk_dir("filter");
    let src = t.path().join("src");
    write(&src.join("keep.txt"), b"k");
    write(&src.join("skip.tmp"), b"s");
    write(&src.join("important.tmp"), b"i");
    write(&src.join("cache/big"), b"c");
    write(&src.join("logs/a.gz"), b"a");
    write(&src.join("logs/old/b.gz"), b"b");
    let dst = t.path().join("dst");
    let args = [
        "--exclude",
        "*.tmp",
        "--include",
        "important.tmp",
        "--exclude",
        "cache/",
        "--exclude",
        "logs/*.gz",
    ];
    // Dry run writes nothing.
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    ok(&copy(&src, &dst, &dry));
    assert!(!dst.exists(), "dry run created DST");
    ok(&copy(&src, &dst, &args));
    let got: Vec<_> = entries(&dst)
        .into_iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        got,
        [
            "important.tmp",
            "keep.txt",
            "logs",
            "logs/old",
            "logs/old/b.gz"
        ]
    );
}

#[test]
fn json_stream_ends_with_summary() {
    let t = disk_dir("json");
    let src = t.path().join("src");
    for i in 0..50 {
        write(
            &src.join(format!("d{}/f{i}", i % 5)),
            &bytes(i * 100, i as u64),
        );
    }
    let out = copy(&src, &t.path().join("dst"), &["--json"]);
    ok(&out);
    let text = stdout(&out);
    let last = text.lines().last().expect("some output");
    let v: serde_json::Value = serde_json::from_str(last).expect("last line is JSON");
    assert_eq!(v["type"], "summary");
    assert_eq!(v["files_copied"], 50);
    assert_eq!(v["bytes_copied"], (0..50).map(|i| i * 100).sum::<u64>());
    assert_eq!(v["errors"], 0);
    assert_eq!(v["files_skipped"], 0);
    assert!(v["elapsed_s"].as_f64().unwrap() >= 0.0);
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line).expect("every line is JSON");
    }
}

#[test]
fn human_summary_is_printed() {
    let t = disk_dir("summary");
    write(&t.path().join("src/f"), b"abc");
    let out = copy(&t.path().join("src"), &t.path().join("dst"), &[]);
    ok(&out);
    let s = stdout(&out);
    assert!(
        s.contains("files copied") && s.contains("failed") && s.contains("files/s"),
        "{s}"
    );
}

/// A reader polling DST during the copy never sees a final name whose
/// size differs from the source's.
#[test]
fn readers_never_see_torn_files() {
    let t = disk_dir("torn");
    let src = t.path().join("src");
    let mut sizes = std::collections::HashMap::new();
    for i in 0..400u64 {
        let size = if i % 50 == 0 {
            3 << 20
        } else {
            (i as usize * 997) % 20_000
        };
        let name = format!("f{i:03}");
        write(&src.join(&name), &bytes(size, i));
        sizes.insert(name, size as u64);
    }
    let dst = t.path().join("dst");
    fs::create_dir_all(&dst).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (dst, stop, sizes) = (dst.clone(), stop.clone(), sizes.clone());
        std::thread::spawn(move || {
            let mut checks = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for e in fs::read_dir(&dst).unwrap().flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if let Some(&want) = sizes.get(&name) {
                        if let Ok(m) = fs::symlink_metadata(e.path()) {
                            assert_eq!(m.len(), want, "{name} visible with a wrong size");
                            checks += 1;
                        }
                    }
                }
            }
            checks
        })
    };
    ok(&copy(&src, &dst, &["--chunk-size", "256K", "-j", "4"]));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let checks = watcher.join().expect("watcher saw a torn file");
    assert!(checks > 0, "the watcher never saw a file");
    assert_same_tree(&src, &dst);
}

/// `--one-file-system` keeps the mount point directory but not what is
/// mounted on it.
#[test]
fn one_file_system_stops_at_mount_points() {
    if !is_root() {
        eprintln!("skipped: mounting a tmpfs inside SRC needs root");
        return;
    }
    let t = disk_dir("onefs");
    let src = t.path().join("src");
    write(&src.join("here"), b"h");
    fs::create_dir_all(src.join("mnt")).unwrap();
    assert!(run(
        "mount",
        &["-t", "tmpfs", "tmpfs", src.join("mnt").to_str().unwrap()]
    ));
    write(&src.join("mnt/there"), b"t");
    let out = copy(&src, &t.path().join("one"), &["--one-file-system"]);
    let all = copy(&src, &t.path().join("all"), &[]);
    run("umount", &[src.join("mnt").to_str().unwrap()]);
    ok(&out);
    ok(&all);
    assert!(t.path().join("one/here").exists());
    assert!(t.path().join("one/mnt").is_dir());
    assert!(
        !t.path().join("one/mnt/there").exists(),
        "crossed into another file system"
    );
    assert!(t.path().join("all/mnt/there").exists());
}

/// Without root, a device node cannot be recreated: it is skipped and said
/// so, and the job still succeeds.
#[test]
fn device_nodes_are_skipped_with_a_note_without_root() {
    let Some(t) = nobody_dir("devskip", 0o777) else {
        return;
    };
    let src = t.path().join("src");
    write(&src.join("f"), b"x");
    let dev = rustix::fs::makedev(1, 3);
    let mode = rustix::fs::Mode::from_raw_mode(0o666);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("null"),
        rustix::fs::FileType::CharacterDevice,
        mode,
        dev,
    )
    .unwrap();
    let out = copy_as_nobody(&src, &t.path().join("dst"), &["--json"]);
    ok(&out);
    assert!(
        stderr(&out).contains("skipped") && stderr(&out).contains("null"),
        "{}",
        stderr(&out)
    );
    let last: serde_json::Value =
        serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert_eq!(last["files_skipped"], 1);
    assert!(!t.path().join("dst/null").exists());
    assert_eq!(fs::read(t.path().join("dst/f")).unwrap(), b"x");
}

/// The summary accounts for every stream's time (walk, read, write, kernel
/// copy, journal, idle) and names what bounded the job.
#[test]
fn the_summary_says_where_the_streams_spent_their_time() {
    // tmpfs, so a disk shared with the rest of the suite cannot become
    // the bound instead of the limit.
    let t = tmpfs_dir("gauge").unwrap_or_else(|| disk_dir("gauge"));
    let src = t.path().join("src");
    write(&src.join("big.bin"), &bytes(64 << 20, 1));
    for i in 0..200 {
        write(&src.join(format!("small/f{i}")), &bytes(3000, i));
    }
    // Held to 50 MB/s so the job lasts long enough to be judged (a run
    // under 0.3 s gets no verdict), and then the limit is what bound it.
    let out = copy(
        &src,
        &t.path().join("dst"),
        &[
            "-j",
            "3",
            "--json",
            "--chunk-size",
            "4M",
            "--bwlimit",
            "50MB/s",
        ],
    );
    ok(&out);
    let s = summary(&out);
    assert_eq!(s["bottleneck"], "bound by --bwlimit", "{s}");
    let spent: f64 = s["stream_seconds"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .sum();
    let wall = s["elapsed_s"].as_f64().unwrap();
    assert!(
        (spent - 3.0 * wall).abs() <= 0.25 * 3.0 * wall + 0.05,
        "3 streams over {wall} s accounted for {spent} s: {s}"
    );
    assert!(
        s["bottleneck"].as_str().is_some_and(|v| !v.is_empty()),
        "{s}"
    );
    // and the human table ends with the same report
    let out = copy(
        &src,
        &t.path().join("dst2"),
        &["-j", "3", "--bwlimit", "100MB/s"],
    );
    assert!(stdout(&out).contains("streams: "), "{}", stdout(&out));
    // A run too short to judge says nothing about what bounded it.
    let out = copy(&src, &t.path().join("dst2"), &["--json"]);
    ok(&out);
    assert!(summary(&out)["bottleneck"].is_null(), "{}", stdout(&out));
    assert!(!copy(&src, &t.path().join("dst2"), &[])
        .stdout
        .starts_with(b"streams"));
}
