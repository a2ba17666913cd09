//! `sluice probe`.

use crate::common::*;
use std::fs;

#[test]
fn probe_measures_both_kinds_of_work_recommends_and_leaves_nothing() {
    let t = disk_dir("probe");
    let src = t.path().join("src");
    for i in 0..400 {
        write(&src.join(format!("d{}/f{i}", i % 8)), &bytes(2000, i));
    }
    write(&src.join("big.bin"), &bytes(8 << 20, 1));
    let dst = t.path().join("dst");
    write(&dst.join("keep"), b"the user's");
    let out = sluice()
        .args(["probe", "--seconds", "0.3", "--json", "--warm"])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    ok(&out);
    let rows = json_lines(&out, "probe");
    let classes: std::collections::BTreeSet<_> = rows
        .iter()
        .map(|r| r["class"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(classes.len(), 2, "{}", stdout(&out));
    assert!(
        rows.iter()
            .all(|r| r["files_per_s"].as_f64().unwrap() > 0.0),
        "{}",
        stdout(&out)
    );
    // 1, 2, 4, ... in order, for each class
    let small: Vec<u64> = rows
        .iter()
        .filter(|r| r["class"].as_str().unwrap().starts_with("small"))
        .map(|r| r["streams"].as_u64().unwrap())
        .collect();
    assert!(small.len() >= 3 && small[..3] == [1, 2, 4], "{small:?}");
    assert_eq!(
        json_lines(&out, "recommendation").len(),
        2,
        "{}",
        stdout(&out)
    );
    // Only what the user had is left in DST.
    let left: Vec<_> = fs::read_dir(&dst)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, ["keep"]);
}
