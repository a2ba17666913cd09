//! `--bwlimit` and `--mem-limit`.

use crate::common::*;
use std::fs;

#[test]
fn bwlimit_holds_the_rate_within_ten_percent() {
    // On tmpfs and well under what one core moves, so the machine (two
    // cores, shared with the rest of the suite and, in CI, a busy disk)
    // never falls below the limit on its own: what is measured is the
    // throttle, not the disk. Every test's ceiling stays 10 %.
    let t = tmpfs_dir("bwlimit").unwrap_or_else(|| disk_dir("bwlimit"));
    let src = t.path().join("src");
    write(&src.join("big.bin"), &bytes(40 << 20, 1));
    for i in 0..200 {
        write(&src.join(format!("small/f{i}")), &bytes(100 << 10, i));
    }
    let total = (40u64 << 20) + 200 * (100 << 10);
    let rate = 20_000_000f64;
    let out = copy(
        &src,
        &t.path().join("dst"),
        &["--bwlimit", "20MB/s", "--chunk-size", "4M", "--json"],
    );
    ok(&out);
    let s = summary(&out);
    assert_eq!(s["bytes_copied"], total);
    let got = total as f64 / s["elapsed_s"].as_f64().unwrap();
    assert!(
        (0.9 * rate..=1.1 * rate).contains(&got),
        "{got:.0} B/s against a limit of {rate:.0}"
    );
    assert_same_tree(&src, &t.path().join("dst"));
}

#[test]
fn mem_limit_caps_what_the_process_holds() {
    let t = disk_dir("memlimit");
    let src = t.path().join("src");
    write(&src.join("big.bin"), &bytes(64 << 20, 2));
    for i in 0..2000 {
        write(&src.join(format!("d{}/f{i}", i % 20)), &bytes(2000, i));
    }
    let rss = |args: &[&str], dst: &str| {
        let mut a = vec!["-j", "8", "--chunk-size", "4M", "--json"];
        a.extend(args);
        let out = copy(&src, &t.path().join(dst), &a);
        ok(&out);
        assert_same_tree(&src, &t.path().join(dst));
        summary(&out)["max_rss_bytes"].as_u64().unwrap()
    };
    // 24M: the test binary is a debug build, whose own resident code is a
    // few MiB more than a release build's, and the budget counts it.
    let capped = rss(&["--mem-limit", "24M"], "capped");
    let free = rss(&[], "free");
    eprintln!("resident: {capped} bytes capped, {free} bytes free");
    assert!(
        capped <= 24 << 20,
        "{capped} bytes resident under --mem-limit 24M"
    );
    assert!(capped < free, "the cap changed nothing: {capped} vs {free}");
    // Too small to run at all is a usage error, before anything is written.
    let out = copy(&src, &t.path().join("tiny"), &["--mem-limit", "1M"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(!t.path().join("tiny").exists());
}

/// Without `--mem-limit`, many streams share one pool of buffer memory:
/// 64 streams copying the chunks of a big file (from tmpfs, so every byte
/// passes through their buffers) hold about what 8 do, each with 384 KiB
/// rather than 4 MiB (by hand, release builds: 32 MiB against 264 MiB).
#[test]
fn many_streams_share_one_pool_of_buffers() {
    let (src, t) = (
        tmpfs_dir("mempool-src").unwrap_or_else(|| disk_dir("mempool-src")),
        disk_dir("mempool"),
    );
    write(&src.path().join("big.bin"), &bytes(256 << 20, 5));
    let dst = t.path().join("dst");
    let args = ["-j", "64", "--chunk-size", "4M", "--json"];
    let out = copy(src.path(), &dst, &args);
    ok(&out);
    assert_same_tree(src.path(), &dst);
    let rss = summary(&out)["max_rss_bytes"].as_u64().unwrap();
    eprintln!("64 streams: {rss} bytes resident");
    // 24 MiB of buffers and the debug binary's own ~15 MiB; 4 MiB buffers
    // on 64 streams would be 256 MiB of them.
    assert!(rss <= 80 << 20, "{rss} bytes resident with 64 streams");
}

/// The benchmark's dense set (200,000 files of 1 KiB in 20 x 10 x 1,000
/// directories) and a 4 GiB file, each copied with `-j auto` under
/// `--mem-limit 24M`: the tuner may want up to 64 streams, the budget
/// decides how many exist and how big their buffers are.
#[test]
fn mem_limit_holds_on_full_size_dense_and_huge_sets() {
    const CAP: u64 = 24 << 20;
    let t = disk_dir("memfull");
    let dense = t.path().join("dense");
    let data = bytes(1024, 3);
    std::thread::scope(|s| {
        for a in 0..20 {
            let (dense, data) = (&dense, &data);
            s.spawn(move || {
                for b in 0..10 {
                    let dir = dense.join(format!("d{a:02}/e{b}/f"));
                    fs::create_dir_all(&dir).unwrap();
                    for i in 0..1000 {
                        fs::write(dir.join(format!("file{i:04}")), data).unwrap();
                    }
                }
            });
        }
    });
    let huge = t.path().join("huge");
    fs::create_dir(&huge).unwrap();
    let f = fs::File::create(huge.join("huge.img")).unwrap();
    // Allocated, not sparse: every byte is read and written (as zeros).
    rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::empty(), 0, 4 << 30).unwrap();
    drop(f);
    // -j 64 on the big file too: without the cap, 64 streams with 4 MiB
    // buffers hold some 256 MiB, so this case fails if the cap is ignored.
    let cases = [
        (&dense, 200_000u64, 1024u64, "auto"),
        (&huge, 1, 4 << 30, "auto"),
        (&huge, 1, 4 << 30, "64"),
    ];
    for (src, files, size, jobs) in cases {
        let dst = t.path().join("out");
        let out = copy(src, &dst, &["--mem-limit", "24M", "-j", jobs, "--json"]);
        ok(&out);
        let s = summary(&out);
        assert_eq!(s["files_copied"], files, "{s}");
        assert_eq!(s["bytes_copied"], files * size, "{s}");
        let rss = s["max_rss_bytes"].as_u64().unwrap();
        eprintln!(
            "{}: {rss} bytes resident, streams {}",
            src.display(),
            s["streams"]
        );
        assert!(
            rss <= CAP,
            "{rss} bytes resident under --mem-limit 24M: {s}"
        );
        fs::remove_dir_all(&dst).unwrap();
    }
}

/// `-j auto` (the default) tunes the streams while the job runs and ends
/// with a copy identical to a fixed `-j` one; bad stream counts are usage
/// errors.
#[test]
fn auto_jobs_copies_the_same_and_reports_its_streams() {
    let t = tmpfs_dir("auto").unwrap_or_else(|| disk_dir("auto"));
    let src = t.path().join("src");
    for i in 0..3000 {
        write(&src.join(format!("d{}/f{i}", i % 30)), &bytes(1500, i));
    }
    write(&src.join("big.bin"), &bytes(32 << 20, 9));
    let out = copy(
        &src,
        &t.path().join("dst"),
        &["-j", "auto", "--chunk-size", "2M", "--json"],
    );
    ok(&out);
    let s = summary(&out);
    let streams = s["streams"].as_u64().unwrap();
    assert!((1..=64).contains(&streams), "{s}");
    assert!(s["stream_seconds"]["parked"].is_number(), "{s}");
    assert_same_tree(&src, &t.path().join("dst"));
    for bad in ["0", "banana"] {
        let out = copy(&src, &t.path().join("bad"), &["-j", bad]);
        assert_eq!(code(&out), 2, "-j {bad}: {}", stderr(&out));
    }
}
