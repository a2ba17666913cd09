//! MPI ranks (a build with `--features mpi`): `mpirun -np N sluice ...`
//! leaves what one process would, every rank does part of the work, and
//! deletes wait for every rank's walk.

use crate::common::*;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

/// `mpirun -np N sluice COMMAND --no-progress ARGS SRC DST`, as root or
/// (with `nobody`) as user nobody.
fn mpirun(n: u32, command: &str, src: &Path, dst: &Path, args: &[&str], nobody: bool) -> Output {
    let mut c = if nobody {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "mpirun",
        ]);
        c.env("HOME", "/tmp");
        c
    } else {
        let mut c = Command::new("mpirun");
        c.arg("--allow-run-as-root");
        c
    };
    c.args(["--oversubscribe", "-np", &n.to_string()])
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args([command, "--no-progress"])
        .args(args)
        .arg(src)
        .arg(dst)
        .env(
            "XDG_STATE_HOME",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-saved-probes"),
        )
        .output()
        .expect("run mpirun")
}

/// `mpirun -np N sluice copy --json --chunk-size 1M -j 2 SRC DST` (as
/// nobody with `nobody`), checked: it succeeded, and DST is an exact copy
/// with no temporary left.
fn copy_on_ranks(n: u32, src: &Path, dst: &Path, nobody: bool) -> Output {
    let args = ["--json", "--chunk-size", "1M", "-j", "2"];
    let out = mpirun(n, "copy", src, dst, &args, nobody);
    ok(&out);
    assert_same_tree(src, dst);
    assert_no_temporaries(dst);
    out
}

/// A build with the `mpi` feature links Open MPI, so its launcher must be
/// there too: its absence fails the test rather than skip it.
fn have_mpirun() -> bool {
    assert!(
        have("mpirun"),
        "built with --features mpi but mpirun is missing (apt-get install openmpi-bin)"
    );
    true
}

/// A tree with a skew: many small files in nested directories, hard
/// links whose names lie in different directories, a symlink, and one
/// file of many chunks.
fn tree(src: &Path) {
    for d in 0..4 {
        for f in 0..200 {
            write(
                &src.join(format!("d{d}/s{}/f{f}", f % 4)),
                &bytes(64 + f * 7, (d * 1000 + f) as u64),
            );
        }
    }
    fs::hard_link(src.join("d0/s1/f1"), src.join("d3/s2/link")).unwrap();
    fs::hard_link(src.join("d0/s1/f1"), src.join("d1/link")).unwrap();
    std::os::unix::fs::symlink("d0/s0/f0", src.join("sym")).unwrap();
    write(&src.join("d2/huge.bin"), &bytes(40 << 20, 3));
    set_mtime(&src.join("d2"), 1_400_000_000, 5);
}

/// -np 1, 2 and 4 all leave an exact copy; with more than one rank,
/// every rank copied part of the one big file, more than one rank copied
/// small files (those of the directories it was lent), rank 0 alone
/// prints the summary, and its totals are the job's.
#[test]
fn any_number_of_ranks_leaves_the_same_tree_and_shares_the_work() {
    if !have_mpirun() {
        return;
    }
    let t = disk_dir("ranks-same");
    let src = t.path().join("src");
    tree(&src);
    for n in [1u32, 2, 4] {
        let dst = t.path().join(format!("dst{n}"));
        let out = copy_on_ranks(n, &src, &dst, false);
        let summaries = json_lines(&out, "summary");
        assert_eq!(
            summaries.len(),
            1,
            "one summary for the job: {}",
            stdout(&out)
        );
        let s = &summaries[0];
        assert_eq!(s["files_copied"], 801, "{s}");
        assert_eq!(s["hardlinks"], 2, "{s}");
        if n == 1 {
            assert!(s.get("ranks").is_none(), "one process is no MPI job: {s}");
            continue;
        }
        let ranks = s["ranks"].as_array().expect("per-rank figures");
        assert_eq!(ranks.len(), n as usize);
        let total: u64 = ranks
            .iter()
            .map(|r| r["bytes_copied"].as_u64().unwrap())
            .sum();
        assert_eq!(total, s["bytes_copied"].as_u64().unwrap());
        for r in ranks {
            // Every rank had a share of the big file (its 40 chunks are
            // dealt out between the ranks, at least 10 each).
            assert!(r["bytes_copied"].as_u64().unwrap() >= 10 << 20, "{r}");
        }
        // Rank 0 lists the root; its four subdirectories are lent to the
        // others as soon as they ask.
        assert!(
            ranks_with(s, "files_copied", 1) >= 2,
            "small files on one rank only: {s}"
        );
    }
}

/// Rank 0's progress line is the job's: what every rank found and did,
/// not only its own share.
#[test]
fn rank_0_shows_the_progress_of_every_rank() {
    if !have_mpirun() {
        return;
    }
    let t = disk_dir("ranks-progress");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    // Slowed (4 MiB/s a rank), so that the job outlasts a few progress
    // lines (one a second) while every rank copies its third of the big
    // file.
    let args = ["--json", "--chunk-size", "1M", "-j", "2", "--bwlimit", "4M"];
    let out = mpirun(3, "copy", &src, &dst, &args, false);
    ok(&out);
    let s = summary(&out);
    let last = json_lines(&out, "progress")
        .pop()
        .unwrap_or_else(|| panic!("no progress line: {}", stdout(&out)));
    // By then the ranks together had copied more than rank 0 did in all.
    let rank0 = s["ranks"][0]["bytes_copied"].as_u64().unwrap();
    assert!(
        last["bytes_done"].as_u64().unwrap() > rank0,
        "rank 0 showed only its own bytes ({rank0} in all): {last}"
    );
}

/// A skewed tree, one directory of many entries beside a big file: the
/// directory's files are lent out in batches, so every rank copies some
/// of them, and the copy is exact.
#[test]
fn one_big_directory_spreads_over_every_rank() {
    if !have_mpirun() {
        return;
    }
    let t = disk_dir("ranks-skew");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    for f in 0..30_000u64 {
        write(&src.join(format!("many/f{f}")), &bytes(100, f));
    }
    // Names of files in the big directory elsewhere: the batches lent out
    // hold hard-linked files, which only their owner may copy and link.
    fs::create_dir(src.join("links")).unwrap();
    for f in (0..30_000).step_by(300) {
        fs::hard_link(
            src.join(format!("many/f{f}")),
            src.join(format!("links/l{f}")),
        )
        .unwrap();
    }
    write(&src.join("huge.bin"), &bytes(24 << 20, 7));
    let out = copy_on_ranks(3, &src, &dst, false);
    let s = summary(&out);
    assert_eq!(s["files_copied"], 30_001, "{s}");
    assert_eq!(s["hardlinks"], 100, "{s}");
    for r in s["ranks"].as_array().unwrap() {
        assert!(
            r["files_copied"].as_u64().unwrap() > 100,
            "a rank left out: {s}"
        );
        assert!(r["bytes_copied"].as_u64().unwrap() >= 8 << 20, "{s}");
    }
}

/// `verify` on ranks reports a big file that differs once, though its
/// chunks would be dealt to every rank for a copy.
#[test]
fn ranks_verify_a_changed_big_file_once() {
    if !have_mpirun() {
        return;
    }
    let t = disk_dir("ranks-verify");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    ok(&copy(&src, &dst, &["--chunk-size", "1M"]));
    let big = dst.join("d2/huge.bin");
    let mut data = fs::read(&big).unwrap();
    data[1000] ^= 0xff;
    fs::write(&big, &data).unwrap();
    let mtime = fs::metadata(src.join("d2/huge.bin"))
        .unwrap()
        .modified()
        .unwrap();
    fs::File::options()
        .write(true)
        .open(&big)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let out = mpirun(
        3,
        "verify",
        &src,
        &dst,
        &["--json", "--chunk-size", "1M"],
        false,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(summary(&out)["differences"], 1, "{}", stderr(&out));
}

/// `sync --delete` on ranks removes each extra once and leaves the tree
/// SRC has.
#[test]
fn ranks_delete_what_src_lacks_once() {
    if !have_mpirun() {
        return;
    }
    let t = disk_dir("ranks-delete");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    ok(&copy(&src, &dst, &[]));
    for i in 0..20 {
        write(&dst.join(format!("d{}/extra{i}", i % 4)), b"x");
    }
    write(&dst.join("gone/deep/x"), b"x");
    let out = mpirun(3, "sync", &src, &dst, &["--delete", "--json"], false);
    ok(&out);
    assert_eq!(summary(&out)["deleted"], 23, "{}", stdout(&out));
    assert_same_tree(&src, &dst);
}

/// `--max-delete` is the job's, not each rank's: the ranks, whichever
/// listed the directories that hold the extras, delete that many in all.
#[test]
fn max_delete_counts_over_every_rank() {
    if !have_mpirun() {
        return;
    }
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: the latency file system needs /dev/fuse");
        return;
    }
    let t = disk_dir("ranks-max-delete");
    let (back, src, dst) = (
        t.path().join("back"),
        t.path().join("src"),
        t.path().join("dst"),
    );
    // Many directories, behind 1 ms a request, so that every rank lists
    // some of them before the walk is over.
    for d in 0..40 {
        for f in 0..20 {
            write(&back.join(format!("d{d}/f{f}")), b"data");
        }
    }
    fs::create_dir(&src).unwrap();
    let _share = sluice_latencyfs::LatencyFs::new(&back, std::time::Duration::from_millis(1))
        .unwrap()
        .mount(&src, 64)
        .expect("mount the latency file system");
    ok(&copy(&src, &dst, &[]));
    let extra = |i: usize| dst.join(format!("d{}/extra{i}", i % 40));
    for i in 0..80 {
        write(&extra(i), b"x");
    }
    let out = mpirun(
        3,
        "sync",
        &src,
        &dst,
        &["--delete", "--max-delete", "10", "--json"],
        false,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let s = summary(&out);
    assert_eq!(s["deleted"], 10, "{s}");
    let left = (0..80).filter(|&i| extra(i).exists()).count();
    assert_eq!(left, 70, "{s}");
    assert!(
        ranks_with(&s, "entries", 0) >= 2,
        "one rank found every extra: {s}"
    );
}

/// A file only one rank reads fails there; no rank deletes anything,
/// though the others walked without error.
#[test]
fn an_error_on_one_rank_blocks_deletes_on_all() {
    if !have_mpirun() {
        return;
    }
    let Some(t) = nobody_dir("ranks-blocked", 0o777) else {
        return;
    };
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    for f in 0..100 {
        write(&src.join(format!("f{f}")), b"data");
    }
    let out = as_nobody("copy", &src, &dst, &[]);
    ok(&out);
    // Root's, unreadable by nobody: the one rank that owns it fails on it.
    write(&src.join("secret"), b"no");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(src.join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    for i in 0..10 {
        write(&dst.join(format!("extra{i}")), b"x");
    }
    Command::new("chown")
        .args(["-R", "nobody:nogroup"])
        .arg(&dst)
        .status()
        .unwrap();
    let out = mpirun(3, "sync", &src, &dst, &["--delete", "--json"], true);
    assert_eq!(code(&out), 1, "{}\n{}", stdout(&out), stderr(&out));
    let s = summary(&out);
    assert_eq!(s["deleted"], 0, "{s}");
    let ranks = s["ranks"].as_array().unwrap();
    let failed_reading = ranks
        .iter()
        .filter(|r| r["errors"].as_u64().unwrap() > 0)
        .count();
    assert_eq!(failed_reading, 3, "every rank reports the refusal: {s}");
    assert!(
        stderr(&out).contains("another process of this job had errors"),
        "{}",
        stderr(&out)
    );
    for i in 0..10 {
        assert!(dst.join(format!("extra{i}")).exists());
    }
}

/// A rank killed mid-copy ends the job with a non-zero code, and a rerun
/// with another number of ranks finishes it: exact, and no state left.
#[test]
fn a_rank_killed_mid_copy_fails_the_job_and_a_rerun_with_other_ranks_finishes() {
    if !have_mpirun() || !have("strace") {
        return;
    }
    let t = disk_dir("ranks-kill");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    // Every rank runs under strace; each kills itself at its 30th write
    // at an offset, so the job dies with chunks of the big file written.
    let out = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--oversubscribe",
            "-np",
            "2",
            "strace",
            "-f",
            "-o",
            "/dev/null",
        ])
        .args([
            "-e",
            "trace=pwrite64",
            "-e",
            "inject=pwrite64:signal=KILL:when=30",
        ])
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["copy", "--no-progress", "--chunk-size", "1M", "-j", "2"])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    assert_ne!(
        code(&out),
        0,
        "the job survived a killed rank: {}",
        stderr(&out)
    );
    assert!(
        !dst.join("d2/huge.bin").exists(),
        "a big file committed by a dying job"
    );
    let rerun = mpirun(
        3,
        "copy",
        &src,
        &dst,
        &["--json", "--chunk-size", "1M", "-j", "2"],
        false,
    );
    ok(&rerun);
    assert_same_tree(&src, &dst);
    // Split into 3, the rerun takes over the chunks the 2 killed ranks
    // had recorded in their journals or marked done: it copies less than
    // the whole tree by a few of them.
    let total: u64 = walkdir_bytes(&src);
    let copied = summary(&rerun)["bytes_copied"].as_u64().unwrap();
    assert!(
        copied + (2 << 20) <= total,
        "the rerun copied {copied} of {total} bytes: the killed ranks' chunks were copied again"
    );
    // What the killed job left (its parts' journals, temporaries and
    // markers of a split into 2) went with the rerun's clean end.
    assert_no_temporaries(&dst);
}

/// Run as a user (not root), read-only directories whose files, hard
/// links and big file chunks are written by several ranks come out
/// exact: no rank finds a directory made read-only under it, and each
/// directory's times are set after the last write into it.
#[test]
fn read_only_directories_written_by_several_ranks_come_out_exact() {
    if !have_mpirun() {
        return;
    }
    let Some(t) = nobody_dir("ranks-ro", 0o777) else {
        return;
    };
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    for f in 0..6000u64 {
        write(&src.join(format!("ro/f{f}")), &bytes(50, f));
    }
    for s in 0..4u64 {
        for f in 0..300u64 {
            write(&src.join(format!("ro/s{s}/f{f}")), &bytes(80, s * 1000 + f));
        }
    }
    fs::hard_link(src.join("ro/s0/f1"), src.join("ro/s2/link")).unwrap();
    fs::hard_link(src.join("ro/s0/f1"), src.join("ro/link")).unwrap();
    write(&src.join("ro/huge.bin"), &bytes(16 << 20, 9));
    // Nobody's own tree: its owner is what a copy as nobody can keep.
    Command::new("chown")
        .args(["-R", "nobody:nogroup"])
        .arg(&src)
        .status()
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    for d in ["ro/s0", "ro/s1", "ro/s2", "ro/s3", "ro"] {
        fs::set_permissions(src.join(d), fs::Permissions::from_mode(0o555)).unwrap();
        set_mtime(&src.join(d), 1_500_000_000, 7);
    }
    let out = copy_on_ranks(3, &src, &dst, true);
    let s = summary(&out);
    assert_eq!(s["hardlinks"], 2, "{s}");
    let ranks = s["ranks"].as_array().unwrap();
    assert!(
        ranks
            .iter()
            .all(|r| r["bytes_copied"].as_u64().unwrap() >= 4 << 20),
        "every rank writes chunks of the big file into the read-only directory: {s}"
    );
}

/// The bytes of the regular files under `dir`.
fn walkdir_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            total += walkdir_bytes(&e.path());
        } else if t.is_file() {
            total += e.metadata().unwrap().len();
        }
    }
    total
}

/// How many ranks of a summary have more than `floor` of `field`.
fn ranks_with(s: &serde_json::Value, field: &str, floor: u64) -> usize {
    let ranks = s["ranks"].as_array().expect("per-rank figures");
    ranks
        .iter()
        .filter(|r| r[field].as_u64().unwrap() > floor)
        .count()
}
