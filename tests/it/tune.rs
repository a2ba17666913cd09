//! `-j auto` on real targets: it holds still where the CPUs are the limit,
//! and climbs to many streams on a share whose every request has latency.

use crate::common::*;
use sluice_latencyfs::LatencyFs;
use std::path::Path;
use std::time::Duration;

fn tree(root: &Path, files: u64, dirs: u64) {
    for i in 0..files {
        write(&root.join(format!("d{}/f{i}", i % dirs)), &bytes(1024, i));
    }
}

fn trace(s: &serde_json::Value) -> Vec<u64> {
    s["streams_trace"]
        .as_array()
        .unwrap_or_else(|| panic!("no streams_trace under -j auto: {s}"))
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

fn files_per_s(s: &serde_json::Value) -> f64 {
    s["files_copied"].as_f64().unwrap() / s["elapsed_s"].as_f64().unwrap()
}

/// On a share that adds 1 ms to every request (the test utility file
/// system in crates/latencyfs), one stream spends its time waiting, and
/// the tuner must find that many streams pay.
#[test]
fn auto_climbs_to_many_streams_on_a_share_with_latency() {
    if !is_root() || !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: mounting the latency file system needs root and /dev/fuse");
        return;
    }
    let t = disk_dir("latency");
    let back = tmpfs_dir("latency-back").unwrap_or_else(|| disk_dir("latency-back"));
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let share = LatencyFs::new(back.path(), Duration::from_millis(1))
        .unwrap()
        .mount(&mnt, 64)
        .expect("mount the latency file system");
    let (few, many) = (t.path().join("few"), t.path().join("many"));
    tree(&few, 300, 3);
    tree(&many, 9000, 90);

    let one = copy(&few, &mnt.join("one"), &["-j", "1", "--json"]);
    ok(&one);
    let out = copy(&many, &mnt.join("auto"), &["-j", "auto", "--json"]);
    ok(&out);
    let (one, auto) = (summary(&one), summary(&out));
    let steps = trace(&auto);
    eprintln!(
        "-j 1: {:.0} files/s; -j auto: {:.0} files/s, streams {steps:?}; {} requests",
        files_per_s(&one),
        files_per_s(&auto),
        share.ops()
    );
    assert!(
        steps.iter().max().unwrap() >= &32,
        "never went past {steps:?} streams"
    );
    assert!(
        files_per_s(&auto) > 5.0 * files_per_s(&one),
        "-j auto {:.0} files/s against -j 1 {:.0}",
        files_per_s(&auto),
        files_per_s(&one)
    );
    // What landed on the share's disk (compared there, since every stat
    // through the share costs a millisecond).
    assert_same_tree(&many, &back.path().join("auto"));
    assert_same_tree(&few, &back.path().join("one"));
}

/// Between two RAM-backed file systems the cores are the limit: the tuner
/// sees its process using them all and adds no streams, run after run.
#[test]
fn auto_holds_still_when_the_cpus_are_the_limit() {
    let Some(t) = tmpfs_dir("cpu-bound") else {
        eprintln!("skipped: no tmpfs at /dev/shm");
        return;
    };
    let src = t.path().join("src");
    for i in 0..150_000u64 {
        write(&src.join(format!("d{}/f{i}", i % 150)), &[b'x'; 100]);
    }
    for run in 0..2 {
        let dst = t.path().join(format!("dst{run}"));
        let out = copy(&src, &dst, &["--json"]);
        ok(&out);
        let steps = trace(&summary(&out));
        eprintln!("run {run}: streams {steps:?}");
        assert!(
            steps.iter().all(|&s| s <= steps[0]),
            "added streams: {steps:?}"
        );
        assert_eq!(entries(&dst).len(), 150_150);
        std::fs::remove_dir_all(&dst).unwrap();
    }
}
