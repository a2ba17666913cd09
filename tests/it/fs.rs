//! The same round trip on loop-mounted ext4, xfs and btrfs (root only),
//! and reflinks where the file system clones.

use crate::common::*;
use crate::copy::kitchen_sink;
use std::fs;

fn roundtrip(fstype: &str) {
    let Some(lfs) = LoopFs::new(fstype, 400) else {
        return;
    };
    let src = lfs.path().join("src");
    let dst = lfs.path().join("dst");
    kitchen_sink(&src);
    write(&src.join("chunked.bin"), &bytes(3 << 20, 9));
    ok(&copy(&src, &dst, &["--chunk-size", "256K"]));
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
    // Across file systems: disk tree into the loop fs.
    let other = disk_dir("cross");
    kitchen_sink(&other.path().join("src"));
    ok(&copy(
        &other.path().join("src"),
        &lfs.path().join("cross"),
        &["--direct", "--chunk-size", "4K"],
    ));
    assert_same_tree(&other.path().join("src"), &lfs.path().join("cross"));
}

#[test]
fn round_trip_on_ext4() {
    roundtrip("ext4");
}

#[test]
fn round_trip_on_xfs() {
    roundtrip("xfs");
}

#[test]
fn round_trip_on_btrfs() {
    roundtrip("btrfs");
}

/// `--reflink always` shares extents on btrfs and xfs (data still equal),
/// and fails per entry with exit 1 on ext4, which cannot clone.
#[test]
fn reflink_always_clones_where_possible() {
    for (fstype, clones) in [("btrfs", true), ("xfs", true), ("ext4", false)] {
        let Some(lfs) = LoopFs::new(fstype, 400) else {
            continue;
        };
        let src = lfs.path().join("src");
        write(&src.join("data.bin"), &bytes(1 << 20, 4));
        write(&src.join("chunked.bin"), &bytes(3 << 20, 6));
        let dst = lfs.path().join("dst");
        let out = copy(&src, &dst, &["--reflink", "always", "--chunk-size", "1M"]);
        if clones {
            ok(&out);
            assert_eq!(fs::read(dst.join("data.bin")).unwrap(), bytes(1 << 20, 4));
            assert_eq!(
                fs::read(dst.join("chunked.bin")).unwrap(),
                bytes(3 << 20, 6)
            );
        } else {
            assert!(
                !dst.join("chunked.bin").exists(),
                "a failed clone left a big file"
            );
            assert_eq!(code(&out), 1, "{fstype}: {}", stderr(&out));
            assert!(stderr(&out).contains("clone"), "{}", stderr(&out));
            assert!(!dst.join("data.bin").exists(), "a failed clone left a file");
        }
    }
}
