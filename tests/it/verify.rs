//! `sluice verify`, and `--verify` on copy.

use crate::common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

fn tree(src: &Path) {
    write(&src.join("a/one"), b"one");
    write(&src.join("a/b/two"), &bytes(5000, 2));
    write(&src.join("big.bin"), &bytes(5 << 20, 3)); // 5 chunks of 1M
    write(&src.join("top"), b"top");
    std::os::unix::fs::symlink("a/one", src.join("link")).unwrap();
}

fn verify(src: &Path, dst: &Path, args: &[&str]) -> std::process::Output {
    run_cmd("verify", src, dst, args)
}

#[test]
fn identical_trees_verify_with_either_hash_and_nothing_is_touched() {
    let t = disk_dir("verify-same");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    ok(&copy(&src, &dst, &[]));
    let (before_src, before_dst) = (ctimes(&src), ctimes(&dst));
    for hash in ["xxh3", "blake3"] {
        let out = verify(
            &src,
            &dst,
            &["--json", "--hash", hash, "--chunk-size", "1M", "--metadata"],
        );
        ok(&out);
        let s = summary(&out);
        assert_eq!(s["files_verified"], 4, "{s}");
        assert_eq!(s["bytes_verified"], 3 + 5000 + (5 << 20) + 3, "{s}");
        assert_eq!(s["differences"], 0, "{s}");
        assert_eq!(s["files_copied"], 0, "{s}");
    }
    assert_eq!(ctimes(&src), before_src);
    assert_eq!(ctimes(&dst), before_dst, "verify wrote to DST");
}

#[test]
fn every_kind_of_difference_is_listed_with_its_path() {
    let t = disk_dir("verify-diff");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    write(&src.join("gone"), b"g");
    write(&src.join("kind"), b"k");
    ok(&copy(&src, &dst, &[]));
    // Same size and mtime, other bytes: only reading content finds it.
    let m = fs::metadata(src.join("a/one")).unwrap();
    write(&dst.join("a/one"), b"ONE");
    set_mtime(
        &dst.join("a/one"),
        std::os::unix::fs::MetadataExt::mtime(&m),
        std::os::unix::fs::MetadataExt::mtime_nsec(&m),
    );
    // One byte in the fourth chunk of the big file.
    let mut big = fs::read(dst.join("big.bin")).unwrap();
    big[(3 << 20) + 17] ^= 1;
    write(&dst.join("big.bin"), &big);
    write(&dst.join("a/b/two"), b"short");
    fs::remove_file(dst.join("gone")).unwrap();
    fs::remove_file(dst.join("kind")).unwrap();
    fs::create_dir(dst.join("kind")).unwrap();
    fs::remove_file(dst.join("link")).unwrap();
    std::os::unix::fs::symlink("top", dst.join("link")).unwrap();
    write(&dst.join("a/extra"), b"x");
    let out = verify(&src, &dst, &["--json", "--chunk-size", "1M"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let mut found: Vec<(String, String)> = json_lines(&out, "difference")
        .iter()
        .map(|v| {
            let p = v["path"].as_str().unwrap();
            let rel = p.rsplit_once("/src/").or(p.rsplit_once("/dst/")).unwrap().1;
            (rel.to_string(), v["what"].as_str().unwrap().to_string())
        })
        .collect();
    found.sort();
    let want = [
        ("a/b/two", "size 5000 in SRC, 5 in DST"),
        ("a/extra", "only in DST"),
        ("a/one", "content differs"),
        ("big.bin", "content differs"),
        ("gone", "missing in DST"),
        ("kind", "a file in SRC, a directory in DST"),
        ("link", "symlink target differs"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(found, want);
    assert_eq!(summary(&out)["differences"], 7);
    // Each is on stderr too, for people.
    assert!(stderr(&out).contains("differs: "), "{}", stderr(&out));
}

#[test]
fn metadata_differences_count_only_with_metadata() {
    let t = disk_dir("verify-meta");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    ok(&copy(&src, &dst, &[]));
    fs::set_permissions(dst.join("top"), fs::Permissions::from_mode(0o600)).unwrap();
    set_mtime(&dst.join("a/b/two"), 1_000_000_000, 0);
    ok(&verify(&src, &dst, &[]));
    let out = verify(&src, &dst, &["--metadata", "--json"]);
    assert_eq!(code(&out), 1);
    let whats: Vec<String> = json_lines(&out, "difference")
        .iter()
        .map(|v| v["what"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(whats.len(), 2, "{whats:?}");
    assert!(
        whats.iter().any(|w| w.starts_with("mode 644 in SRC, 600")),
        "{whats:?}"
    );
    assert!(whats.iter().any(|w| w.starts_with("mtime ")), "{whats:?}");
}

#[test]
fn verify_needs_an_existing_destination() {
    let t = disk_dir("verify-none");
    write(&t.path().join("src/f"), b"f");
    let out = verify(&t.path().join("src"), &t.path().join("nope"), &[]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(!t.path().join("nope").exists());
}

/// The `pread64` calls the dynamic loader makes before sluice's own code
/// runs, so an injection can target sluice's first read.
fn loader_preads() -> Option<usize> {
    if !have("strace") {
        eprintln!("skipped: strace is not installed");
        return None;
    }
    let t = disk_dir("loader");
    let log = t.path().join("log");
    let status = Command::new("strace")
        .args(["-f", "-e", "trace=pread64", "-o"])
        .arg(&log)
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(status.status.success());
    Some(
        fs::read_to_string(&log)
            .unwrap()
            .lines()
            .filter(|l| l.contains("pread64("))
            .count(),
    )
}

/// `--verify` reads back what was written: a read-back that does not
/// match (here strace makes the read return nothing) fails the file, which
/// never gets its final name; the rest is copied.
#[test]
fn verify_on_copy_refuses_a_copy_that_reads_back_wrong() {
    let t = disk_dir("verify-copy");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    tree(&src);
    ok(&copy(
        &src,
        &t.path().join("plain"),
        &["--verify", "--chunk-size", "1M"],
    ));
    assert_same_tree(&src, &t.path().join("plain"));
    let Some(loader) = loader_preads() else {
        return;
    };
    // Files are copied with copy_file_range; the first pread64 after the
    // loader's is the read-back of the first file written.
    let Some(mut cmd) = under_strace(
        "pread64",
        &format!("retval=0:when={}", loader + 1),
        "copy",
        &src,
        &dst,
        &["--verify", "-j", "1", "--json"],
    ) else {
        return;
    };
    let out = cmd.output().unwrap();
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let errors = json_lines(&out, "error");
    assert_eq!(errors.len(), 1, "{}", stdout(&out));
    assert_eq!(errors[0]["op"], "verify");
    let failed = errors[0]["path"].as_str().unwrap();
    assert!(!Path::new(failed).exists(), "{failed} was committed");
    assert_no_temporaries(&dst);
    assert_eq!(summary(&out)["files_copied"], 3);
}
