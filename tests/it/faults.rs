//! Bad input and resource failures: clear message, right exit code,
//! nothing partial under a final name.

use crate::common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

#[test]
fn missing_source_is_exit_2() {
    let t = disk_dir("missing");
    let out = copy(&t.path().join("nope"), &t.path().join("dst"), &[]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("nope") && stderr(&out).contains("No such file"),
        "{}",
        stderr(&out)
    );
    assert!(!t.path().join("dst").exists());
    // With --json the stream still ends with the summary, after a fatal line.
    let out = copy(&t.path().join("nope"), &t.path().join("dst"), &["--json"]);
    assert_eq!(code(&out), 2);
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["type"], "fatal");
    assert!(lines[0]["error"].as_str().unwrap().contains("nope"));
    assert_eq!(lines[1]["type"], "summary");
    assert_eq!(lines[1]["outcome"], "failed");
}

#[test]
fn overlapping_paths_are_refused() {
    let t = disk_dir("overlap");
    let src = t.path().join("src");
    write(&src.join("f"), b"x");
    for dst in [src.join("inside"), src.clone(), t.path().to_path_buf()] {
        let out = copy(&src, &dst, &[]);
        assert_eq!(code(&out), 2, "{}", stderr(&out));
        assert!(stderr(&out).contains("overlap"), "{}", stderr(&out));
    }
    assert!(!src.join("inside").exists(), "refused copy still wrote");
}

#[test]
fn bad_usage_is_exit_2() {
    let out = sluice().args(["copy", "only-one-arg"]).output().unwrap();
    assert_eq!(code(&out), 2);
    let t = disk_dir("usage");
    let out = copy(t.path(), &t.path().join("x"), &["--chunk-size", "12Q"]);
    assert_eq!(code(&out), 2);
    let out = copy(t.path(), &t.path().join("x"), &["--exclude", "a["]);
    assert_eq!(code(&out), 2);
}

#[test]
fn full_disk_stops_with_exit_2_and_nothing_partial() {
    let Some(lfs) = LoopFs::new("ext4", 32) else {
        return;
    };
    let t = disk_dir("full");
    let src = t.path().join("src");
    for i in 0..12 {
        write(&src.join(format!("f{i:02}")), &bytes(4 << 20, i));
    }
    write(&src.join("z-big"), &bytes(40 << 20, 99));
    let dst = lfs.path().join("dst");
    let out = copy(&src, &dst, &["--chunk-size", "1M", "-j", "2"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("No space left"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("free space"),
        "no hint in: {}",
        stderr(&out)
    );
    // The big file's temporary may stay, recorded for resume; every file
    // under a final name is complete.
    assert_only_resume_state(&dst);
    assert_no_partial_files(&src, &dst);
}

#[test]
fn read_only_destination_is_exit_2() {
    let Some(lfs) = LoopFs::new("ext4", 32) else {
        return;
    };
    fs::create_dir(lfs.path().join("dst")).unwrap();
    assert!(run(
        "mount",
        &["-o", "remount,ro", lfs.path().to_str().unwrap()]
    ));
    let t = disk_dir("ro");
    write(&t.path().join("src/f"), b"data");
    let out = copy(&t.path().join("src"), &lfs.path().join("dst"), &[]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Read-only file system"),
        "{}",
        stderr(&out)
    );
    assert!(!lfs.path().join("dst/f").exists());
}

/// As an unprivileged user, unreadable files and directories are reported
/// with their paths, everything else is copied, and the exit code is 1.
#[test]
fn unreadable_entries_are_reported_and_the_rest_copied() {
    let Some(t) = nobody_dir("unreadable", 0o777) else {
        return;
    };
    let src = t.path().join("src");
    write(&src.join("ok.txt"), b"fine");
    write(&src.join("secret.txt"), b"no");
    write(&src.join("locked/inner"), b"no");
    write(&src.join("open/visible"), b"yes");
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(src.join("secret.txt"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::set_permissions(src.join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
    let dst = t.path().join("dst");
    let out = copy_as_nobody(&src, &dst, &[]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("secret.txt") && err.contains("Permission denied"),
        "{err}"
    );
    assert!(err.contains("locked"), "{err}");
    assert_eq!(fs::read(dst.join("ok.txt")).unwrap(), b"fine");
    assert_eq!(fs::read(dst.join("open/visible")).unwrap(), b"yes");
    assert!(!dst.join("secret.txt").exists());
    assert_no_temporaries(&dst);
}

/// SIGINT stops the job with exit 130 and no temporaries.
#[test]
fn sigint_exits_130_and_the_same_command_finishes() {
    let t = disk_dir("sigint");
    let src = t.path().join("src");
    for i in 0..4 {
        write(&src.join(format!("big{i}")), &bytes(48 << 20, i));
    }
    let dst = t.path().join("dst");
    let mut child = sluice()
        .args([
            "copy",
            "--no-progress",
            "-j",
            "2",
            "--chunk-size",
            "1M",
            "--fsync",
        ])
        .arg(&src)
        .arg(&dst)
        .spawn()
        .unwrap();
    // Wait until the copy has visibly started.
    let start = std::time::Instant::now();
    while !dst.exists() && start.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    let code = status.code().unwrap_or(-1);
    assert_eq!(code, 130, "SIGINT must stop the copy with exit 130");
    assert_only_resume_state(&dst);
    assert_no_partial_files(&src, &dst);
    let out = copy(&src, &dst, &["-j", "2", "--chunk-size", "1M", "--fsync"]);
    ok(&out);
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

/// A source file that changes while it is copied is never committed torn:
/// it is copied again (`--retries`, default 2) or, with no retries left,
/// reported (exit 1). strace holds the copy in its first write for two
/// seconds while the test changes the file: appends to a whole-file copy,
/// replaces (rename over) a chunked one.
#[test]
fn a_source_changed_during_its_copy_is_retried_or_reported_never_committed_torn() {
    let t = disk_dir("changing");
    for (case, (name, size, extra)) in [
        ("growing.bin", 2usize << 20, vec!["-j", "1"]),
        (
            "replaced.bin",
            6 << 20,
            vec!["-j", "2", "--chunk-size", "1M"],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        for retries in ["0", "2"] {
            let src = t.path().join(format!("src-{case}-{retries}"));
            let dst = t.path().join(format!("dst-{case}-{retries}"));
            write(&src.join(name), &bytes(size, 5));
            let mut args = extra.clone();
            args.extend(["--retries", retries, "--json"]);
            let Some(mut cmd) = copy_under_strace("delay_exit=2000000:when=1", &src, &dst, &args)
            else {
                return;
            };
            let child = cmd
                .stderr(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(700));
            if case == 0 {
                use std::io::Write;
                let mut f = fs::OpenOptions::new()
                    .append(true)
                    .open(src.join(name))
                    .unwrap();
                f.write_all(b"appended while being copied").unwrap();
            } else {
                write(&src.join("next"), &bytes(size, 6));
                fs::rename(src.join("next"), src.join(name)).unwrap();
            }
            let out = child.wait_with_output().unwrap();
            if retries == "0" {
                assert_eq!(code(&out), 1, "{name}: {}", stderr(&out));
                assert!(
                    stderr(&out).contains("changed during copy"),
                    "{name}: {}",
                    stderr(&out)
                );
                assert!(
                    !dst.join(name).exists(),
                    "{name}: a torn copy was committed"
                );
            } else {
                ok(&out);
                assert_eq!(summary(&out)["retries"], 1, "{name}");
                assert!(
                    fs::read(dst.join(name)).unwrap() == fs::read(src.join(name)).unwrap(),
                    "{name}: the retry did not copy the source as it is now"
                );
            }
            assert_no_temporaries(&dst);
        }
    }
}

/// An unwritable DST stops the job before it starts: exit 2, one message.
#[test]
fn unwritable_destination_is_exit_2() {
    let Some(t) = nobody_dir("unwritable", 0o755) else {
        return;
    };
    let src = t.path().join("src");
    for i in 0..20 {
        write(&src.join(format!("f{i}")), b"data");
    }
    fs::set_permissions(&src, fs::Permissions::from_mode(0o755)).unwrap();
    let dst = t.path().join("dst");
    fs::create_dir(&dst).unwrap();
    let out = copy_as_nobody(&src, &dst, &[]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        stderr(&out).lines().count(),
        1,
        "one message, not one per file: {}",
        stderr(&out)
    );
}

/// kill -9 in the middle of a chunked copy leaves a named temporary; the
/// same command run again removes it and finishes with an identical tree.
#[test]
fn rerun_after_kill_9_cleans_temporaries_and_finishes() {
    let t = disk_dir("kill9");
    let src = t.path().join("src");
    write(&src.join("a/big.bin"), &bytes(6 << 20, 1));
    write(&src.join("a/small"), b"s");
    write(&src.join("top"), b"t");
    let dst = t.path().join("dst");
    let args = ["--chunk-size", "1M", "-j", "2", "--no-direct"];
    // strace kills sluice at its 3rd pwrite64: mid-way through big.bin.
    let mut killed_args = vec!["--reflink", "never"];
    killed_args.extend(args);
    let Some(mut cmd) = copy_under_strace("signal=KILL:when=3", &src, &dst, &killed_args) else {
        return;
    };
    let killed = cmd.output().unwrap();
    assert_ne!(
        code(&killed),
        0,
        "sluice was not killed: {}",
        stderr(&killed)
    );
    let leftovers = entries(&dst)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".sluice-")
        })
        .count();
    assert!(
        leftovers > 0,
        "the kill left no temporary; the test set-up is wrong"
    );
    ok(&copy(&src, &dst, &killed_args));
    assert_no_temporaries(&dst);
    assert_same_tree(&src, &dst);
}

/// A second run on a DST that another run is writing to fails fast.
#[test]
fn second_concurrent_run_on_one_destination_fails_fast() {
    let t = disk_dir("lock");
    let src = t.path().join("src");
    write(&src.join("f.bin"), &bytes(2 << 20, 2));
    let dst = t.path().join("dst");
    // The first run is held for 2 s in its first write.
    let Some(mut cmd) = copy_under_strace("delay_exit=2000000:when=1", &src, &dst, &[]) else {
        return;
    };
    let first = cmd.stdout(std::process::Stdio::null()).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    let started = std::time::Instant::now();
    let second = copy(&src, &dst, &[]);
    assert_eq!(code(&second), 2, "{}", stderr(&second));
    assert!(
        stderr(&second).contains("another sluice run"),
        "{}",
        stderr(&second)
    );
    assert!(
        started.elapsed().as_secs_f64() < 1.0,
        "the second run waited instead of failing fast"
    );
    let first = first.wait_with_output().unwrap();
    assert_eq!(code(&first), 0);
    assert_eq!(fs::read(dst.join("f.bin")).unwrap(), bytes(2 << 20, 2));
    // Once the first is done, DST is free again, and no lock file is left.
    ok(&copy(&src, &dst, &[]));
    assert_eq!(entries(&dst).len(), 1);
}

/// A symlink swapped into DST while the copy runs never redirects a write:
/// a racing thread renames DST's copy of a directory away and puts a
/// symlink to a directory outside DST in its place, and plants symlinks to
/// an outside file where files are about to be written.
#[test]
fn a_symlink_swapped_into_dst_during_the_copy_is_never_followed() {
    let t = disk_dir("swap");
    let src = t.path().join("src");
    for d in 0..4 {
        for f in 0..500 {
            write(&src.join(format!("d{d}/f{f:03}")), &bytes(2000, f));
        }
    }
    let outside = t.path().join("outside");
    write(&outside.join("victim"), b"untouched");
    for round in 0..3 {
        let dst = t.path().join(format!("dst{round}"));
        let racer = {
            let (dst, outside) = (dst.clone(), outside.clone());
            std::thread::spawn(move || {
                let start = std::time::Instant::now();
                let mut swapped = 0;
                while start.elapsed().as_secs() < 10 && swapped < 4 {
                    for d in 0..4 {
                        let dir = dst.join(format!("d{d}"));
                        if fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir())
                            && fs::rename(&dir, dst.join(format!("moved{d}"))).is_ok()
                        {
                            std::os::unix::fs::symlink(&outside, &dir).unwrap();
                            swapped += 1;
                        }
                        // and a link where a file will land, in the moved copy
                        let _ = std::os::unix::fs::symlink(
                            outside.join("victim"),
                            dst.join(format!("moved{d}/f499")),
                        );
                    }
                    std::thread::yield_now();
                }
                swapped
            })
        };
        let out = copy(&src, &dst, &["-j", "2"]);
        let swapped = racer.join().unwrap();
        assert!(matches!(code(&out), 0 | 1), "{}", stderr(&out));
        assert_eq!(fs::read(outside.join("victim")).unwrap(), b"untouched");
        let escaped: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "victim")
            .collect();
        assert!(
            escaped.is_empty(),
            "round {round}: written outside DST: {escaped:?}"
        );
        eprintln!("round {round}: {swapped} directories swapped mid-copy");
    }
}
