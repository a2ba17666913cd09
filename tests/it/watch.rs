//! `sluice watch`: the initial sync, then create, modify, rename and
//! delete propagated within seconds; an event-queue overflow caught by a
//! rescan; DST briefly gone and caught up with; `--no-delete`.

use crate::common::*;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// A running `sluice watch --json`, its stdout lines arriving on a channel;
/// stopped with SIGINT on drop.
struct Watch {
    child: Child,
    lines: Receiver<serde_json::Value>,
}

impl Watch {
    fn start(src: &Path, dst: &Path, args: &[&str]) -> Watch {
        let mut child = sluice()
            .arg("watch")
            .arg(src)
            .arg(dst)
            .args(["--json", "--no-progress"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sluice watch");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&l) {
                    if tx.send(v).is_err() {
                        break;
                    }
                }
            }
        });
        let w = Watch { child, lines };
        w.wait_for("the initial sync", |v| {
            v["type"] == "pass" && v["full"] == true
        });
        w
    }

    /// Waits (up to 20 s) for a line that `want` accepts.
    fn wait_for(&self, what: &str, want: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(v) if want(&v) => return v,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("no {what} within 20 s");
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }

    /// Stops the watch; returns its exit code and final summary.
    fn stop(mut self) -> (i32, serde_json::Value) {
        self.signal(rustix::process::Signal::INT);
        let summary = self.wait_for("summary", |v| v["type"] == "summary");
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        (code, summary)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls until `check` holds, up to `secs`; returns how long it took.
fn within(secs: u64, what: &str, check: impl Fn() -> bool) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "{what} did not happen within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

fn same_content(src: &Path, dst: &Path) -> bool {
    let (a, b) = (entries(src), entries(dst));
    a == b
        && a.iter().all(|rel| {
            let (s, d) = (src.join(rel), dst.join(rel));
            match (fs::symlink_metadata(&s), fs::symlink_metadata(&d)) {
                (Ok(sm), Ok(dm)) if sm.is_file() && dm.is_file() => {
                    fs::read(&s).ok() == fs::read(&d).ok()
                }
                (Ok(sm), Ok(dm)) => sm.file_type() == dm.file_type(),
                _ => false,
            }
        })
}

#[test]
fn create_modify_rename_delete_reach_dst_within_seconds() {
    let d = disk_dir("watch");
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    write(&src.join("keep.txt"), b"keep");
    write(&src.join("edit.txt"), b"old");
    write(&src.join("old-name.txt"), b"renamed");
    write(&src.join("gone.txt"), b"to delete");
    write(&src.join("dir/inner.txt"), b"inner");
    let w = Watch::start(&src, &dst, &[]);
    assert_same_tree(&src, &dst);

    write(&src.join("new.txt"), b"created");
    write(&src.join("edit.txt"), b"new content, longer");
    fs::rename(src.join("old-name.txt"), src.join("new-name.txt")).unwrap();
    fs::remove_file(src.join("gone.txt")).unwrap();
    write(&src.join("made/deep/er/file.txt"), b"in a new tree");
    fs::rename(src.join("dir"), src.join("moved-dir")).unwrap();
    let took = within(10, "propagation", || same_content(&src, &dst));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    // Metadata follows too, once the passes settle.
    within(5, "metadata", || {
        std::panic::catch_unwind(|| assert_same_tree(&src, &dst)).is_ok()
    });

    let (code, s) = w.stop();
    assert_eq!(code, 0, "{s}");
    assert!(s["changes"].as_u64().unwrap() >= 6, "{s}");
    assert!(s["deleted"].as_u64().unwrap() >= 2, "{s}");
    assert!(s["lag_max_s"].as_f64().unwrap() < 5.0, "{s}");
    assert_no_temporaries(&dst);
}

/// SIGSTOP the watch, make more events than the kernel queues (16,384 by
/// default), SIGCONT: the overflow triggers a full rescan that copies all.
#[test]
fn an_event_queue_overflow_is_caught_by_a_rescan() {
    let d = disk_dir("watch");
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    for k in 0..20 {
        write(&src.join(format!("d{k}/first")), b"x");
    }
    // Watched from the start, so every file made below queues events.
    let w = Watch::start(&src, &dst, &[]);
    let limit: usize = fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(16384);
    w.signal(rustix::process::Signal::STOP);
    let n = limit + 2000;
    for i in 0..n {
        // Each creation queues at least two events (create, close-write):
        // d0's files alone overflow the queue, so the events of the files
        // made after them in d1..d19 are lost; only a rescan finds those.
        let k = if i < limit { 0 } else { 1 + i % 19 };
        write(&src.join(format!("d{k}/f{i}")), b"x");
    }
    w.signal(rustix::process::Signal::CONT);
    let v = w.wait_for("a rescan after the overflow", |v| {
        v["type"] == "pass" && v["reason"] == "event queue overflow"
    });
    assert!(v["full"] == true);
    within(30, "all files copied", || {
        (0..20)
            .map(|k| fs::read_dir(dst.join(format!("d{k}"))).map_or(0, |r| r.count()))
            .sum::<usize>()
            == n + 20
    });
    assert!(same_content(&src, &dst));
    let (code, _) = w.stop();
    assert_eq!(code, 0);
}

/// DST vanishes (as an unmounted share would): the watch waits without
/// recreating it, then catches up when it returns.
#[test]
fn dst_briefly_gone_is_caught_up_with() {
    let d = disk_dir("watch");
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    let away = d.path().join("dst-away");
    write(&src.join("a"), b"a");
    let w = Watch::start(&src, &dst, &[]);
    fs::rename(&dst, &away).unwrap();
    write(&src.join("while-gone.txt"), b"made while DST was away");
    w.wait_for("the outage", |v| v["type"] == "dst_unavailable");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!dst.exists(), "the watch recreated DST while it was away");
    assert!(!away.join("while-gone.txt").exists());
    fs::rename(&away, &dst).unwrap();
    w.wait_for("DST back", |v| v["type"] == "dst_available");
    within(10, "catching up", || same_content(&src, &dst));
    let (code, _) = w.stop();
    assert_eq!(code, 0);
}

#[test]
fn no_delete_keeps_what_src_removed() {
    let d = disk_dir("watch");
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    write(&src.join("a"), b"a");
    write(&src.join("b"), b"b");
    let w = Watch::start(&src, &dst, &["--no-delete"]);
    fs::remove_file(src.join("a")).unwrap();
    write(&src.join("c"), b"c");
    within(10, "the new file", || dst.join("c").exists());
    std::thread::sleep(Duration::from_millis(300));
    assert!(dst.join("a").exists(), "--no-delete deleted");
    let (code, s) = w.stop();
    assert_eq!(code, 0);
    assert_eq!(s["deleted"], 0);
}

#[test]
fn a_second_writer_is_refused() {
    let d = disk_dir("watch");
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    write(&src.join("a"), b"a");
    let w = Watch::start(&src, &dst, &[]);
    let o = copy(&src, &dst, &[]);
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("another sluice run"), "{}", stderr(&o));
    drop(w);
}

#[test]
fn excludes_hold_for_changes_below_src() {
    let d = disk_dir("watch");
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    write(&src.join("sub/first.txt"), b"1");
    let w = Watch::start(
        &src,
        &dst,
        &["--exclude", "cache", "--exclude", "sub/skip.txt"],
    );
    write(&src.join("cache/x"), b"excluded by name");
    write(&src.join("sub/skip.txt"), b"excluded by path");
    write(&src.join("sub/ok.txt"), b"copied");
    write(&src.join("sub/cache/y"), b"excluded by name, deeper");
    within(10, "the copied file", || dst.join("sub/ok.txt").exists());
    std::thread::sleep(Duration::from_millis(300));
    assert!(!dst.join("cache").exists());
    assert!(!dst.join("sub/skip.txt").exists());
    assert!(!dst.join("sub/cache").exists());
    let (code, _) = w.stop();
    assert_eq!(code, 0);
}

#[test]
fn overlapping_paths_stop_the_watch_at_once() {
    let d = disk_dir("watch");
    let src = d.path().join("src");
    write(&src.join("a"), b"a");
    let o = sluice()
        .arg("watch")
        .arg(&src)
        .arg(src.join("inside"))
        .arg("--no-progress")
        .output()
        .unwrap();
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("overlap"), "{}", stderr(&o));
    assert!(!src.join("inside").exists(), "DST was created inside SRC");
}

/// A directory replaced by a file of the same name: the pass for the
/// directory is skipped (a job on it would copy the file *into* DST's old
/// directory); the parent's pass deletes the directory and copies the file.
#[test]
fn a_directory_replaced_by_a_file_is_not_copied_into_itself() {
    let d = disk_dir("watch");
    let (src, dst) = (d.path().join("src"), d.path().join("dst"));
    write(&src.join("d/inner"), b"inner");
    let w = Watch::start(&src, &dst, &[]);
    fs::remove_dir_all(src.join("d")).unwrap();
    write(&src.join("d"), b"now a file");
    w.wait_for("the pass", |v| v["type"] == "pass" && v["full"] == false);
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        !dst.join("d/d").exists(),
        "the file was copied into the directory"
    );
    within(5, "the file replaces the directory", || {
        fs::read(dst.join("d")).is_ok_and(|b| b == b"now a file")
    });
    drop(w);
}

/// After its first sync a watch says it is alive and how much it watches.
#[test]
fn a_watch_says_it_is_watching_after_the_first_sync() {
    let t = disk_dir("alive");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a/b/f"), b"f");
    let w = Watch::start(&src, &dst, &[]);
    let v = w.wait_for("the watching line", |v| v["type"] == "watching");
    assert_eq!(v["dirs"], 3, "{v}"); // src, a, a/b
    let (code, _) = w.stop();
    assert_eq!(code, 0);
}
