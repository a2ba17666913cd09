//! `--shard I/N`: N runs that never talk to each other split one job, and
//! together leave exactly what one run would.

use crate::common::*;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

const CHUNK: &[&str] = &["--chunk-size", "1M", "--reflink", "never"];

/// A tree with something of every kind: nested directories with many
/// small files, an empty directory, a symlink, hard links whose names are
/// in different directories, odd modes and times, and two big files that
/// are split by chunk.
fn tree(src: &Path) -> u64 {
    let mut total = 0u64;
    for d in 0..6 {
        for f in 0..70 {
            let data = bytes(100 + f * 13, (d * 100 + f) as u64);
            total += data.len() as u64;
            write(&src.join(format!("d{d}/sub{}/f{f}", f % 3)), &data);
        }
    }
    fs::create_dir_all(src.join("empty")).unwrap();
    symlink("../d0/sub0/f0", src.join("d1/link-to-f0")).unwrap();
    fs::hard_link(src.join("d0/sub1/f1"), src.join("d5/hard-f1")).unwrap();
    fs::hard_link(src.join("d0/sub1/f1"), src.join("d3/sub2/hard-f1")).unwrap();
    for (name, size, seed) in [
        ("d2/big.bin", 24usize << 20, 1u64),
        ("huge.bin", 9 << 20, 2),
    ] {
        write(&src.join(name), &bytes(size, seed));
        total += size as u64;
    }
    fs::set_permissions(src.join("d4/sub0/f3"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(src.join("d4"), fs::Permissions::from_mode(0o750)).unwrap();
    set_mtime(&src.join("d2/big.bin"), 1_500_000_000, 123);
    for d in ["d0/sub1", "d2", "empty", ""] {
        set_mtime(&src.join(d), 1_400_000_000, 456_789);
    }
    total
}

fn part(i: u32, n: u32, src: &Path, dst: &Path, more: &[&str]) -> Command {
    let mut c = sluice();
    c.args([
        "copy",
        "--no-progress",
        "--json",
        "--shard",
        &format!("{i}/{n}"),
    ])
    .args(CHUNK)
    .args(more)
    .arg(src)
    .arg(dst)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

/// Three parts at once, each its own process: the union is the whole
/// tree, exact in bytes, metadata and hard links, every byte was copied
/// by exactly one part, and nothing of the parts' bookkeeping is left.
#[test]
fn the_parts_of_a_split_copy_together_equal_the_whole() {
    let t = disk_dir("shard-union");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let total = tree(&src);
    let children: Vec<_> = (0..3)
        .map(|i| part(i, 3, &src, &dst, &[]).spawn().unwrap())
        .collect();
    let mut copied = 0;
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        ok(&out);
        let mine = summary(&out)["bytes_copied"].as_u64().unwrap();
        assert!(mine > 0, "part {i} copied nothing");
        copied += mine;
    }
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
    // Every byte once: the hard link's second and third names are links.
    assert_eq!(copied, total, "the parts copied {copied} bytes of {total}");
    let verify = run_cmd("verify", &src, &dst, &["--metadata"]);
    ok(&verify);
}

/// Parts run one after another: each alone leaves the tree incomplete
/// (and the big files, whose chunks every part has some of, under no
/// final name), and the last one completes them.
#[test]
fn parts_run_one_after_another_complete_the_job_with_the_last() {
    let t = disk_dir("shard-sequence");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    ok(&part(0, 3, &src, &dst, &[]).output().unwrap());
    assert!(
        !dst.join("d2/big.bin").exists(),
        "a big file committed by one part of three"
    );
    assert_eq!(
        code(&run_cmd("verify", &src, &dst, &[])),
        1,
        "one part did everything"
    );
    ok(&part(2, 3, &src, &dst, &[]).output().unwrap());
    assert!(!dst.join("d2/big.bin").exists());
    ok(&part(1, 3, &src, &dst, &[]).output().unwrap());
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
    // A part run again over the finished job writes nothing.
    let again = part(1, 3, &src, &dst, &[]).output().unwrap();
    ok(&again);
    assert_eq!(summary(&again)["bytes_copied"], 0);
}

/// A part killed in the middle of its chunks of a big file: the other
/// part finishes its own and cannot commit the file alone; the killed
/// part's rerun copies only its chunks that had not landed, and commits.
#[test]
fn a_part_killed_mid_file_resumes_its_own_chunks() {
    if !have("strace") {
        eprintln!("skipped: strace is not installed");
        return;
    }
    let t = disk_dir("shard-kill");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let size = 48u64 << 20;
    write(&src.join("big.bin"), &bytes(size as usize, 9));
    let args = ["-j", "2"];
    let log = t.path().join("strace.log");
    // Each 1 MiB chunk is one pwrite64 of 1048576 bytes; the 40th pwrite64
    // (journal writes included) kills the part.
    let mut part0 = vec!["--shard", "0/2"];
    part0.extend(CHUNK);
    part0.extend(args);
    let (killed, landed) = copy_killed_at_write(40, &log, &src, &dst, &part0);
    assert_ne!(code(&killed), 0, "not killed: {}", stderr(&killed));
    assert!(
        landed >= 4,
        "only {landed} chunks landed; the set-up is wrong"
    );
    assert!(
        dst.join(".sluice-journal-part-0-of-2.redb").exists(),
        "no journal after the kill"
    );
    ok(&part(1, 2, &src, &dst, &args).output().unwrap());
    assert!(
        !dst.join("big.bin").exists(),
        "committed with part 0's chunks missing"
    );
    let rerun = part(0, 2, &src, &dst, &args).output().unwrap();
    ok(&rerun);
    let copied = summary(&rerun)["bytes_copied"].as_u64().unwrap();
    // Part 0 owns half the chunks; of those that landed, at most one per
    // stream is copied again.
    let allowed = (24 - (landed - 2)) << 20;
    assert!(
        copied <= allowed,
        "rerun copied {copied} bytes; {landed} chunks had landed"
    );
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

/// No part sees the whole tree, so none may delete; a part number that
/// does not exist, or none given and none in the environment, is refused
/// before DST is touched; a launcher's variables give the part.
#[test]
fn deletes_and_parts_that_do_not_exist_are_refused() {
    let t = disk_dir("shard-refused");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"a");
    let del = sync(&src, &dst, &["--delete", "--shard", "0/2"]);
    assert_eq!(code(&del), 2);
    assert!(
        stderr(&del).contains("--delete cannot be used with --shard"),
        "{}",
        stderr(&del)
    );
    for spec in ["2/2", "x/2", "auto"] {
        let o = sluice()
            .args(["copy", "--no-progress", "--shard", spec])
            .arg(&src)
            .arg(&dst)
            .env_remove("SLURM_PROCID")
            .env_remove("OMPI_COMM_WORLD_RANK")
            .env_remove("PMI_RANK")
            .env_remove("JOB_COMPLETION_INDEX")
            .output()
            .unwrap();
        assert_eq!(code(&o), 2, "--shard {spec}");
    }
    assert!(!dst.exists());
    // Parts 0 and 1 of 2 from Slurm's variables: together, the whole.
    for i in ["0", "1"] {
        let o = sluice()
            .args(["copy", "--no-progress", "--shard", "auto"])
            .arg(&src)
            .arg(&dst)
            .env("SLURM_PROCID", i)
            .env("SLURM_NTASKS", "2")
            .output()
            .unwrap();
        ok(&o);
    }
    assert_same_tree(&src, &dst);
}

/// The same part started twice at once (parts lock DST shared, so both
/// start): the second finds the first's journal in use and stops with
/// that said, leaving the journal alone; the first finishes, and with the
/// other part the tree is whole.
#[test]
fn the_same_part_started_twice_leaves_the_first_ones_journal_alone() {
    let t = disk_dir("shard-twice");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("big.bin"), &bytes(24 << 20, 7));
    let first = part(0, 2, &src, &dst, &["--bwlimit", "6M"])
        .spawn()
        .unwrap();
    let journal = dst.join(".sluice-journal-part-0-of-2.redb");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !journal.exists() {
        assert!(std::time::Instant::now() < deadline, "no journal appeared");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let second = part(0, 2, &src, &dst, &[]).output().unwrap();
    assert_ne!(code(&second), 0, "a second run of the same part went ahead");
    assert!(
        stderr(&second).contains("another sluice run is using it"),
        "{}",
        stderr(&second)
    );
    assert!(
        journal.exists(),
        "the second run removed the first's journal"
    );
    ok(&first.wait_with_output().unwrap());
    ok(&part(1, 2, &src, &dst, &[]).output().unwrap());
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}
