//! Interrupted jobs: the same command again finishes the job, re-copying
//! only the chunks that were in flight, and leaves no state behind.

use crate::common::*;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Whether `rel` is a temporary or inside one (a new directory still
/// being filled): it has no final path.
fn under_temporary(rel: &Path) -> bool {
    rel.components()
        .any(|c| c.as_os_str().to_string_lossy().starts_with(".sluice-"))
}

/// Every regular file under a final path in `dst` equals its source:
/// whatever an interruption left, nothing is torn. A temporary, or
/// anything in a new directory still filled under a temporary name, has
/// no final path.
fn assert_nothing_torn(src: &Path, dst: &Path) {
    for rel in entries(dst) {
        let d = dst.join(&rel);
        if under_temporary(&rel) || !fs::symlink_metadata(&d).unwrap().is_file() {
            continue;
        }
        assert!(
            fs::read(src.join(&rel)).unwrap() == fs::read(&d).unwrap(),
            "{} is torn",
            rel.display()
        );
    }
}

#[test]
fn a_killed_big_copy_resumes_with_only_the_chunks_in_flight() {
    if !have("strace") {
        eprintln!("skipped: strace is not installed");
        return;
    }
    // At DST's root, and two new directories down (filled under a
    // temporary name when killed, taken up by the rerun).
    for (case, rel) in ["big.bin", "sub/deeper/big.bin"].into_iter().enumerate() {
        let t = disk_dir(&format!("resume-big{case}"));
        let src = t.path().join("src");
        let size = 48u64 << 20;
        write(&src.join(rel), &bytes(size as usize, 7));
        let dst = t.path().join("dst");
        let jobs = 2;
        let args = ["--chunk-size", "1M", "-j", "2", "--reflink", "never"];
        // strace logs every pwrite64 and kills sluice at the 150th (the journal
        // writes with pwrite64 too, about 5 per commit). Each 1 MiB chunk is one pwrite64 of
        // exactly 1048576 bytes, so the log says how many chunks had landed.
        let log = t.path().join("strace.log");
        let (killed, landed) = copy_killed_at_write(150, &log, &src, &dst, &args);
        assert_ne!(code(&killed), 0, "not killed: {}", stderr(&killed));
        assert!(
            landed >= 4,
            "{rel}: only {landed} chunks landed; the set-up is wrong"
        );
        assert!(
            dst.join(".sluice-journal.redb").exists(),
            "{rel}: no journal after the kill"
        );
        assert_only_resume_state(&dst);
        assert!(!dst.join(rel).exists());
        let mut json_args = args.to_vec();
        json_args.push("--json");
        let out = copy(&src, &dst, &json_args);
        ok(&out);
        let copied = summary(&out)["bytes_copied"].as_u64().unwrap();
        // Guarantee 2: of the chunks that had landed, at most one per stream
        // is copied again.
        let allowed = size - (landed - jobs) * (1 << 20);
        assert!(
            copied <= allowed,
            "{rel}: resumed run copied {copied} bytes; {landed} of 48 chunks had landed, so at most {allowed}"
        );
        assert_same_tree(&src, &dst);
        assert_no_temporaries(&dst);
    }
}

#[test]
fn sigint_saves_state_and_the_rerun_copies_the_rest() {
    let t = disk_dir("resume-int");
    let src = t.path().join("src");
    let size = 64usize << 20;
    write(&src.join("big.bin"), &bytes(size, 8));
    let dst = t.path().join("dst");
    // strace slows each write so the copy is surely mid-way at the signal.
    let Some(mut cmd) = under_strace(
        "pwrite64",
        "delay_exit=20000",
        "copy",
        &src,
        &dst,
        &["--chunk-size", "1M", "-j", "2", "--json"],
    ) else {
        return;
    };
    let child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(800));
    // Signal sluice itself, not strace.
    let pid = child.id().to_string();
    assert!(run("pkill", &["-INT", "-P", &pid, "-x", "sluice"]));
    let first = child.wait_with_output().unwrap();
    assert_eq!(code(&first), 130, "{}", stderr(&first));
    let before = summary(&first)["bytes_copied"].as_u64().unwrap();
    assert!(
        before > 0 && before < size as u64,
        "copied {before} before SIGINT"
    );
    assert_only_resume_state(&dst);
    let out = copy(&src, &dst, &["--chunk-size", "1M", "-j", "2", "--json"]);
    ok(&out);
    let after = summary(&out)["bytes_copied"].as_u64().unwrap();
    // What the first run wrote is not written again, give or take the
    // chunks in flight when the signal came (one per stream).
    assert!(
        before + after <= size as u64 + (2 << 20),
        "{before} + {after} bytes for a {size}-byte file"
    );
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

/// Every directory under a final path below `dst` (its root aside) has
/// all of its source's entries: a new directory gets its name only when
/// everything in it is done.
fn assert_dirs_whole(src: &Path, dst: &Path) {
    let names = |dir: &Path| {
        let mut v: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| !n.to_string_lossy().starts_with(".sluice-"))
            .collect();
        v.sort();
        v
    };
    for rel in entries(dst) {
        let d = dst.join(&rel);
        if under_temporary(&rel) || !fs::symlink_metadata(&d).unwrap().is_dir() {
            continue;
        }
        assert_eq!(
            names(&src.join(&rel)),
            names(&d),
            "{} is not whole",
            rel.display()
        );
    }
}

/// The new directories (`.sluice-0-*.tmp`) directly in `dir`.
fn hidden_dirs(dir: &Path) -> Vec<std::path::PathBuf> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".sluice-0-")
        })
        .collect()
}

/// 4 directories of 200 small files in `src/top`.
fn four_dirs_of_small_files(src: &Path) -> u64 {
    for d in 0..4u64 {
        for f in 0..200u64 {
            write(
                &src.join(format!("top/d{d}/f{f}")),
                &bytes(1000 + f as usize, d * 1000 + f),
            );
        }
    }
    800
}

/// `sluice copy -j 1` killed at its `n`th `utimensat` (one per file, as
/// its last step, and one per directory).
fn copy_killed_at_file(n: u32, src: &Path, dst: &Path) -> bool {
    let inject = format!("signal=KILL:when={n}");
    let Some(mut cmd) = under_strace("utimensat", &inject, "copy", src, dst, &["-j", "1"]) else {
        return false;
    };
    let killed = cmd.output().unwrap();
    assert_ne!(code(&killed), 0, "not killed: {}", stderr(&killed));
    true
}

/// A new directory is filled under a temporary name and renamed when all
/// of it is done, so no reader sees it part-filled; after a kill -9 the
/// same command takes up what the killed run had begun: the files that
/// had landed are not copied again.
#[test]
fn new_directories_appear_whole_and_a_rerun_takes_up_a_killed_runs() {
    let t = disk_dir("resume-hidden");
    let src = t.path().join("src");
    let total = four_dirs_of_small_files(&src);
    let dst = t.path().join("dst");
    if !copy_killed_at_file(500, &src, &dst) {
        return;
    }
    // `top` is not done: it is not there under its name, but under the
    // temporary one, where the subdirectories that are done have theirs.
    assert!(!dst.join("top").exists());
    let hidden = hidden_dirs(&dst);
    assert_eq!(hidden.len(), 1, "{hidden:?}");
    let done = (0..4)
        .filter(|d| hidden[0].join(format!("d{d}")).is_dir())
        .count();
    assert!(
        (1..4).contains(&done),
        "{done} of 4 subdirectories done after 499 files"
    );
    assert_dirs_whole(&src.join("top"), &hidden[0]);
    let out = copy(&src, &dst, &["-j", "1", "--json"]);
    ok(&out);
    let copied = summary(&out)["files_copied"].as_u64().unwrap();
    assert!(
        copied <= total - 495,
        "the rerun copied {copied} of {total} files; 499 had landed"
    );
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

/// In a directory a killed run was filling, a file may be cut short under
/// its own name: options that take DST's file as it is (`--ignore-existing`,
/// `--update`, `--size-only`) must not keep it.
#[test]
fn a_file_cut_short_in_a_killed_runs_directory_is_copied_again_whatever_the_options() {
    for opts in [&["--ignore-existing"][..], &["--update", "--size-only"]] {
        let t = disk_dir("resume-hidden-cut");
        let src = t.path().join("src");
        four_dirs_of_small_files(&src);
        let dst = t.path().join("dst");
        if !copy_killed_at_file(100, &src, &dst) {
            return;
        }
        // A file whose data did not land: its size, zeros, a time of now.
        let hidden = hidden_dirs(&dst);
        let cut = entries(&hidden[0])
            .into_iter()
            .map(|rel| hidden[0].join(rel))
            .find(|p| p.is_file())
            .expect("a file landed");
        let len = fs::metadata(&cut).unwrap().len() as usize;
        fs::write(&cut, vec![0u8; len]).unwrap();
        let mut args = vec!["-j", "1"];
        args.extend_from_slice(opts);
        ok(&copy(&src, &dst, &args));
        assert_same_tree(&src, &dst);
        assert_no_temporaries(&dst);
    }
}

/// What a killed run had begun of a directory SRC no longer has is
/// removed (and said), not left behind.
#[test]
fn a_killed_runs_directory_whose_source_is_gone_is_removed() {
    let t = disk_dir("resume-hidden-gone");
    let src = t.path().join("src");
    four_dirs_of_small_files(&src);
    let dst = t.path().join("dst");
    if !copy_killed_at_file(300, &src, &dst) {
        return;
    }
    assert_eq!(hidden_dirs(&dst).len(), 1);
    fs::rename(src.join("top"), src.join("renamed")).unwrap();
    let out = copy(&src, &dst, &["-j", "1"]);
    ok(&out);
    assert!(
        stderr(&out).contains("interrupted sluice run had begun"),
        "{}",
        stderr(&out)
    );
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

/// kill -9 at many points of a mixed copy, each time running the same
/// command again: nothing torn ever appears, and the last run completes
/// an identical tree with no state left.
#[test]
fn kill_9_at_random_points_then_the_same_command_finishes() {
    let t = disk_dir("resume-loop");
    let src = t.path().join("src");
    for d in 0..8 {
        for f in 0..40 {
            write(
                &src.join(format!("d{d}/sub/f{f}")),
                &bytes(100 + 97 * f, d * 100 + f as u64),
            );
        }
        std::os::unix::fs::symlink("sub/f1", src.join(format!("d{d}/link"))).unwrap();
    }
    fs::hard_link(src.join("d0/sub/f0"), src.join("d1/hard")).unwrap();
    for i in 0..3 {
        write(&src.join(format!("big{i}.bin")), &bytes(12 << 20, 50 + i));
    }
    let dst = t.path().join("dst");
    let args = ["--chunk-size", "1M", "-j", "4"];
    // A fixed pseudo-random schedule of kill points, 5..250 ms in.
    let mut seed = 0x9e3779b97f4a7c15u64;
    for round in 0..10 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let delay = 5 + seed % 245;
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["copy", "--no-progress"])
            .args(args)
            .arg(&src)
            .arg(&dst)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        let _ = child.kill();
        let status = child.wait().unwrap();
        if dst.exists() {
            assert_nothing_torn(&src, &dst);
            assert_dirs_whole(&src, &dst);
        }
        eprintln!("round {round}: killed after {delay} ms ({status})");
    }
    ok(&copy(&src, &dst, &args));
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

#[test]
fn a_full_disk_stops_and_the_run_after_freeing_space_finishes() {
    let Some(lfs) = LoopFs::new("ext4", 64) else {
        return;
    };
    let t = disk_dir("full-resume");
    let src = t.path().join("src");
    for i in 0..6 {
        write(&src.join(format!("f{i}")), &bytes(3 << 20, i));
    }
    write(&src.join("z-big"), &bytes(24 << 20, 9));
    let ballast = lfs.path().join("ballast");
    write(&ballast, &bytes(30 << 20, 1));
    let dst = lfs.path().join("dst");
    let args = ["--chunk-size", "1M", "-j", "2"];
    let out = copy(&src, &dst, &args);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_only_resume_state(&dst);
    assert_nothing_torn(&src, &dst);
    fs::remove_file(&ballast).unwrap();
    ok(&copy(&src, &dst, &args));
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

/// I/O errors on reads, writes and fsync fail the entry they hit (exit 1,
/// reported with its path), never commit it, and the rest is copied.
#[test]
fn io_errors_fail_only_their_entry() {
    let t = disk_dir("eio");
    let src = t.path().join("src");
    for i in 0..6 {
        write(&src.join(format!("f{i}")), &bytes(20_000, i));
    }
    for (syscall, extra) in [
        // the dynamic loader reads with pread64 too, so reads are failed
        // where only sluice reads: copy_file_range
        ("copy_file_range", "--reflink=auto"),
        ("pwrite64", "--reflink=never"),
        ("fsync", "--fsync"),
    ] {
        let dst = t.path().join(format!("dst-{syscall}"));
        let Some(mut cmd) = under_strace(
            syscall,
            "error=EIO:when=2",
            "copy",
            &src,
            &dst,
            &["-j", "1", extra],
        ) else {
            return;
        };
        let out = cmd.output().unwrap();
        assert_eq!(code(&out), 1, "{syscall}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("Input/output error"),
            "{syscall}: {}",
            stderr(&out)
        );
        let copied = (0..6)
            .filter(|i| dst.join(format!("f{i}")).exists())
            .count();
        assert_eq!(copied, 5, "{syscall}: one file fails, the rest is copied");
        assert_nothing_torn(&src, &dst);
        assert_no_temporaries(&dst);
        // The same command again completes the job.
        ok(&copy(&src, &dst, &["-j", "1", extra]));
        assert_same_tree(&src, &dst);
    }
}
