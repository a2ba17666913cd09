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
    let state = t.path().join("state");
    let out = sluice()
        .args(["probe", "--seconds", "0.3", "--json", "--warm", "--save"])
        .arg(&src)
        .arg(&dst)
        .env("XDG_STATE_HOME", &state)
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
    let recs = json_lines(&out, "recommendation");
    assert_eq!(recs.len(), 2, "{}", stdout(&out));
    // ... and one command line a single job can take.
    let most = recs
        .iter()
        .map(|r| r["streams"].as_u64().unwrap())
        .max()
        .unwrap();
    let done = &json_lines(&out, "probe_done")[0];
    let command = done["command"].as_str().unwrap();
    assert!(command.starts_with("sluice copy "), "{command}");
    assert!(command.contains(&format!(" -j {most}")), "{command}");
    // Big files are tried at other chunk sizes too.
    let chunks: std::collections::BTreeSet<u64> = rows
        .iter()
        .filter(|r| r["class"].as_str().unwrap().starts_with("big"))
        .map(|r| r["chunk_size"].as_u64().unwrap())
        .collect();
    assert_eq!(
        chunks.into_iter().collect::<Vec<_>>(),
        [16 << 20, 64 << 20, 256 << 20]
    );

    // Saved: a later -j auto job between the same file systems starts
    // from the recommendation; -j N does not look.
    let saved = json_lines(&out, "saved");
    assert_eq!(saved.len(), 1, "{}", stdout(&out));
    let path = saved[0]["path"].as_str().unwrap();
    assert!(path.starts_with(state.to_str().unwrap()), "{path}");
    let start = recs
        .iter()
        .map(|r| r["streams"].as_u64().unwrap())
        .max()
        .unwrap();
    let later = sluice()
        .args(["copy", "--json"])
        .arg(&src)
        .arg(t.path().join("later"))
        .env("XDG_STATE_HOME", &state)
        .output()
        .unwrap();
    ok(&later);
    assert_eq!(
        summary(&later)["streams_trace"][0],
        start,
        "{}",
        stdout(&later)
    );
    assert_same_tree(&src, &t.path().join("later"));
    // The start really comes from the file (the recommendation above may
    // happen to equal the default of 8): rewrite it and look again.
    let text = fs::read_to_string(path).unwrap();
    let mut recs: serde_json::Value = serde_json::from_str(&text).unwrap();
    recs[0]["small_streams"] = 3.into();
    recs[0]["big_streams"] = serde_json::Value::Null;
    fs::write(path, recs.to_string()).unwrap();
    let edited = sluice()
        .args(["copy", "--json"])
        .arg(&src)
        .arg(t.path().join("edited"))
        .env("XDG_STATE_HOME", &state)
        .output()
        .unwrap();
    ok(&edited);
    assert_eq!(
        summary(&edited)["streams_trace"][0],
        3,
        "{}",
        stdout(&edited)
    );
    let pinned = sluice()
        .args(["copy", "--json", "-j", "3"])
        .arg(&src)
        .arg(t.path().join("pinned"))
        .env("XDG_STATE_HOME", &state)
        .output()
        .unwrap();
    ok(&pinned);
    assert_eq!(summary(&pinned)["streams"], 3);
    // Only what the user had is left in DST.
    let left: Vec<_> = fs::read_dir(&dst)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, ["keep"]);
}
