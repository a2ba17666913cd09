//! `host:PATH` sources: sluice starts `sluice serve --stdio` through the
//! remote shell command (`-e`), here a stand-in for ssh that runs the
//! command on this host the way ssh would run it on another (the words
//! after the host joined and handed to a shell), so the whole path is
//! exercised: handshake, frames, the far source, the engine writing here.
//! The same commands over a real sshd in a network namespace are left to
//! the network tests.

use crate::common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// A stand-in for ssh in `dir`: drops the host, runs the rest in `sh -c`,
/// and leaves its process id in `dir/far.pid` (the far end, or its
/// parent shell), so a test kills its own far end and no other test's.
fn fake_ssh(dir: &Path) -> PathBuf {
    let path = dir.join("fake-ssh");
    let script = format!(
        // The far end's pid is the control connection's (a data stream's
        // relay is another process).
        "#!/bin/sh\ncase \"$*\" in *--stdio*) echo $$ > {};; esac\nshift\nexec sh -c \"$*\"\n",
        dir.join("far.pid").display()
    );
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// Waits until a copy into `dst` is surely under way: its journal exists
/// (a big file has begun) and a few chunks have had time to land. A busy
/// machine may take a while to start the far end.
fn under_way(dst: &Path) {
    // The stand-in writes far.pid beside DST as it starts the far end.
    let far = dst.with_file_name("far.pid");
    let begun = (0..400).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        dst.join(".sluice-journal.redb").exists() && far.exists()
    });
    assert!(begun, "the copy never began");
    std::thread::sleep(Duration::from_millis(500));
}

/// `sluice COMMAND host:SRC DST ARGS` through the stand-in.
fn remote(command: &str, rsh: &Path, src: &Path, dst: &Path, args: &[&str]) -> Command {
    let mut c = sluice();
    c.arg(command)
        .arg(format!("somehost:{}", src.display()))
        .arg(dst)
        .arg("-e")
        .arg(rsh)
        .args(["--remote-path", env!("CARGO_BIN_EXE_sluice")])
        .args(args)
        .arg("--no-progress");
    c
}

fn run_remote(command: &str, rsh: &Path, src: &Path, dst: &Path, args: &[&str]) -> Output {
    remote(command, rsh, src, dst, args)
        .output()
        .expect("run sluice")
}

fn mixed_tree(src: &Path) {
    write(&src.join("small/a.txt"), b"hello");
    for i in 0..50 {
        write(
            &src.join(format!("small/many/f{i}")),
            &bytes(3000 + i, i as u64),
        );
    }
    // Not a multiple of the block: the last piece of a direct write is cut.
    write(&src.join("big.bin"), &bytes((9 << 20) + 123, 3));
    std::os::unix::fs::symlink("small/a.txt", src.join("link")).unwrap();
    fs::hard_link(src.join("small/a.txt"), src.join("small/hard")).unwrap();
    let sparse = fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(8 << 20).unwrap();
    drop(sparse);
    set_mtime(&src.join("small/a.txt"), 1_500_000_000, 123_456_789);
    assert!(run(
        "setfattr",
        &[
            "-n",
            "user.note",
            "-v",
            "kept",
            src.join("big.bin").to_str().unwrap()
        ]
    ));
}

#[test]
fn a_remote_tree_copies_syncs_and_verifies_like_a_local_one() {
    let t = disk_dir("remote-pull");
    let rsh = fake_ssh(t.path());
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    mixed_tree(&src);
    let args = ["--chunk-size", "1M", "--json"];
    let out = run_remote("copy", &rsh, &src, &dst, &args);
    ok(&out);
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
    assert_eq!(summary(&out)["hardlinks"], 1);
    // The sparse file stayed sparse.
    let sparse = fs::metadata(dst.join("sparse")).unwrap();
    assert!(std::os::unix::fs::MetadataExt::blocks(&sparse) < 64);
    // A rerun over an unchanged tree copies nothing.
    let again = run_remote("copy", &rsh, &src, &dst, &args);
    ok(&again);
    assert_eq!(summary(&again)["bytes_copied"], 0);
    // verify hashes on both ends: identical, then one changed byte found.
    ok(&run_remote("verify", &rsh, &src, &dst, &["-q"]));
    let mut data = fs::read(dst.join("big.bin")).unwrap();
    data[5 << 20] ^= 1;
    fs::write(dst.join("big.bin"), &data).unwrap();
    let meta = fs::metadata(src.join("big.bin")).unwrap();
    let mtime = std::os::unix::fs::MetadataExt::mtime(&meta);
    let nsec = std::os::unix::fs::MetadataExt::mtime_nsec(&meta);
    set_mtime(&dst.join("big.bin"), mtime, nsec);
    let differs = run_remote("verify", &rsh, &src, &dst, &[]);
    assert_eq!(code(&differs), 1, "{}", stderr(&differs));
    assert!(stderr(&differs).contains("big.bin"), "{}", stderr(&differs));
    // sync --delete: a changed file is replaced, an extra removed, and
    // the source side's name is written host:path.
    write(&src.join("small/a.txt"), b"changed");
    write(&dst.join("extra"), b"x");
    let out = run_remote("sync", &rsh, &src, &dst, &["--delete", "-v"]);
    ok(&out);
    assert!(stdout(&out).contains("delete"), "{}", stdout(&out));
    fs::remove_file(dst.join("big.bin")).unwrap();
    ok(&run_remote("sync", &rsh, &src, &dst, &["--delete", "-q"]));
    assert_same_tree(&src, &dst);
    // One file by itself, to a new name.
    let one = t.path().join("one.txt");
    ok(&run_remote(
        "copy",
        &rsh,
        &src.join("small/a.txt"),
        &one,
        &["-q"],
    ));
    assert_eq!(fs::read(&one).unwrap(), b"changed");
}

#[test]
fn killing_the_far_end_stops_with_exit_2_and_the_rerun_resumes() {
    let t = disk_dir("remote-kill");
    let rsh = fake_ssh(t.path());
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let size = 48u64 << 20;
    write(&src.join("big.bin"), &bytes(size as usize, 5));
    write(&src.join("small"), b"small");
    let args = ["--chunk-size", "1M", "-j", "2", "--json"];
    // Held to 16 MB/s so the far end is surely killed mid-file.
    let child = remote("copy", &rsh, &src, &dst, &args)
        .args(["--bwlimit", "16MB/s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    under_way(&dst);
    let pid = fs::read_to_string(t.path().join("far.pid")).unwrap();
    let pid = pid.trim();
    // The far end is the shell itself (it exec'd) or its child.
    let killed = run("pkill", &["-9", "-P", pid]) | run("kill", &["-9", pid]);
    assert!(killed, "no far end to kill");
    let first = child.wait_with_output().unwrap();
    assert_eq!(code(&first), 2, "{}", stderr(&first));
    assert!(
        stderr(&first).contains("connection to the remote host was lost"),
        "{}",
        stderr(&first)
    );
    let before = summary(&first)["bytes_copied"].as_u64().unwrap();
    assert!(before < size, "copied {before} before the kill");
    assert_no_partial_files(&src, &dst);
    let out = run_remote("copy", &rsh, &src, &dst, &args);
    ok(&out);
    let after = summary(&out)["bytes_copied"].as_u64().unwrap();
    // At most one chunk per stream is sent again.
    assert!(
        before + after <= size + 5 + (2 << 20),
        "{before} + {after} bytes for {size} + 5"
    );
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

#[test]
fn a_far_end_that_is_not_sluice_gets_a_clear_error() {
    let t = disk_dir("remote-bad");
    let rsh = fake_ssh(t.path());
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("f"), b"f");
    let with_remote = |remote_path: &str| {
        sluice()
            .arg("copy")
            .arg(format!("h:{}", src.display()))
            .arg(&dst)
            .arg("-e")
            .arg(&rsh)
            .args(["--remote-path", remote_path])
            .output()
            .unwrap()
    };
    // No sluice there.
    let out = with_remote("/nonexistent/sluice");
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("--remote-path"), "{}", stderr(&out));
    // Another protocol version.
    let other = t.path().join("other-sluice");
    fs::write(
        &other,
        "#!/bin/sh\necho 'sluice-protocol 999 sluice/9.9.9'\ncat >/dev/null\n",
    )
    .unwrap();
    fs::set_permissions(&other, fs::Permissions::from_mode(0o755)).unwrap();
    let out = with_remote(other.to_str().unwrap());
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("protocol 999") && stderr(&out).contains("same version"),
        "{}",
        stderr(&out)
    );
    // A login script that talks on stdout, then no sluice.
    let chatty = t.path().join("chatty");
    fs::write(&chatty, "#!/bin/sh\necho 'Welcome to the cluster'\n").unwrap();
    fs::set_permissions(&chatty, fs::Permissions::from_mode(0o755)).unwrap();
    let out = with_remote(chatty.to_str().unwrap());
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Welcome to the cluster"),
        "{}",
        stderr(&out)
    );
    // A remote shell that cannot be run.
    let out = sluice()
        .arg("copy")
        .arg(format!("h:{}", src.display()))
        .arg(&dst)
        .args(["-e", "/nonexistent/ssh"])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    // None of these created DST.
    assert!(!dst.exists());
}

#[test]
fn a_changed_big_file_moves_only_the_pieces_that_differ() {
    let t = disk_dir("remote-delta");
    let rsh = fake_ssh(t.path());
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let size = 32usize << 20;
    let mut data = bytes(size, 9);
    write(&src.join("big.bin"), &data);
    let args = ["--chunk-size", "4M", "--json"];
    ok(&run_remote("copy", &rsh, &src, &dst, &args));
    // Two small changes, 20 MiB apart: two 1 MiB pieces differ.
    data[3 << 20] ^= 0xff;
    data[(23 << 20) + 7] ^= 0xff;
    write(&src.join("big.bin"), &data);
    let out = run_remote("copy", &rsh, &src, &dst, &args);
    ok(&out);
    let moved = summary(&out)["bytes_copied"].as_u64().unwrap();
    assert_eq!(
        moved,
        2 << 20,
        "{moved} bytes fetched for two changed bytes"
    );
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

/// `sluice COMMAND SRC host:DST ARGS` through the stand-in.
fn push(command: &str, rsh: &Path, src: &Path, dst: &Path, args: &[&str]) -> Command {
    let mut c = sluice();
    c.arg(command)
        .arg(src)
        .arg(format!("somehost:{}", dst.display()))
        .arg("-e")
        .arg(rsh)
        .args(["--remote-path", env!("CARGO_BIN_EXE_sluice")])
        .args(args)
        .arg("--no-progress");
    c
}

#[test]
fn a_tree_pushed_to_another_host_lands_like_a_local_copy() {
    let t = disk_dir("remote-push");
    let rsh = fake_ssh(t.path());
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    mixed_tree(&src);
    let args = ["--chunk-size", "1M", "--json"];
    let out = push("copy", &rsh, &src, &dst, &args).output().unwrap();
    ok(&out);
    // The far end's JSON comes back on this stdout.
    assert_eq!(summary(&out)["hardlinks"], 1, "{}", stdout(&out));
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
    let again = push("copy", &rsh, &src, &dst, &args).output().unwrap();
    ok(&again);
    assert_eq!(summary(&again)["bytes_copied"], 0);
    write(&dst.join("small/extra"), b"x");
    write(&src.join("small/a.txt"), b"changed");
    let out = push("sync", &rsh, &src, &dst, &["--delete", "-v"])
        .output()
        .unwrap();
    ok(&out);
    assert!(stdout(&out).contains("delete"), "{}", stdout(&out));
    assert_same_tree(&src, &dst);
    ok(&push("verify", &rsh, &src, &dst, &["-q"]).output().unwrap());
    // Patterns from a file on this host are not read there: refused, not
    // silently ignored.
    fs::write(t.path().join("pats"), "*.bin\n").unwrap();
    let out = push("copy", &rsh, &src, &dst, &["--exclude-from"])
        .arg(t.path().join("pats"))
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

#[test]
fn a_push_stops_cleanly_when_interrupted_or_cut_and_resumes() {
    let t = disk_dir("remote-push-kill");
    let rsh = fake_ssh(t.path());
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let size = 48u64 << 20;
    write(&src.join("big.bin"), &bytes(size as usize, 6));
    let args = ["--chunk-size", "1M", "-j", "2", "--json"];
    let slow = |extra: &[&str]| {
        let _ = fs::remove_file(t.path().join("far.pid"));
        push("copy", &rsh, &src, &dst, &args)
            .args(["--bwlimit", "16MB/s"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // SIGINT on this side stops the job over there: exit 130, state kept.
    let child = slow(&[]);
    under_way(&dst);
    assert!(run("kill", &["-INT", &child.id().to_string()]));
    let first = child.wait_with_output().unwrap();
    assert_eq!(code(&first), 130, "{}", stderr(&first));
    let before = summary(&first)["bytes_copied"].as_u64().unwrap();
    assert!(before > 0 && before < size, "{before}");
    assert_only_resume_state(&dst);
    // The far end killed: exit 2 here, nothing torn there.
    let child = slow(&[]);
    under_way(&dst);
    let pid = fs::read_to_string(t.path().join("far.pid")).unwrap();
    let pid = pid.trim();
    assert!(run("pkill", &["-9", "-P", pid]) | run("kill", &["-9", pid]));
    let cut = child.wait_with_output().unwrap();
    assert_eq!(code(&cut), 2, "{}", stderr(&cut));
    assert!(stderr(&cut).contains("lost"), "{}", stderr(&cut));
    assert_no_partial_files(&src, &dst);
    // This side killed: the far end stops by itself (its input ended),
    // keeping its state, and leaves nothing torn.
    let mut child = slow(&[]);
    under_way(&dst);
    let pid = fs::read_to_string(t.path().join("far.pid")).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        !run("kill", &["-0", pid.trim()])
    });
    assert!(gone, "the far end kept running after its client was killed");
    assert_no_partial_files(&src, &dst);
    // The rerun finishes, sending again at most a chunk per stream.
    let out = push("copy", &rsh, &src, &dst, &args).output().unwrap();
    ok(&out);
    let after = summary(&out)["bytes_copied"].as_u64().unwrap();
    assert!(after < size, "the rerun copied {after} of {size}");
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

/// A 40 MiB image (ten 4 MiB chunks, one of them zeros) with `seed`'s data.
fn image_file(path: &Path, seed: u64) -> Vec<u8> {
    let mut data = bytes(40 << 20, seed);
    data[(8 << 20)..(12 << 20)].fill(0);
    write(path, &data);
    data
}

#[test]
fn an_image_pulled_or_pushed_moves_only_the_chunks_that_changed() {
    let t = disk_dir("remote-image");
    let rsh = fake_ssh(t.path());
    let src = t.path().join("disk.img");
    let mut data = image_file(&src, 11);
    let dst = t.path().join("pulled.img");
    let pushed = t.path().join("pushed.img");
    let json = ["--json"];
    // A first copy each way moves every chunk that is not zeros.
    let pull = |args: &[&str]| {
        let out = run_remote("image", &rsh, &src, &dst, args);
        ok(&out);
        summary(&out)
    };
    let push_it = |args: &[&str]| {
        let out = push("image", &rsh, &src, &pushed, args).output().unwrap();
        ok(&out);
        summary(&out)
    };
    for s in [pull(&json), push_it(&json)] {
        assert_eq!(s["mode"], "full", "{s}");
        assert_eq!(s["chunks_written"], 9, "{s}");
        assert_eq!(s["bytes_read"], 40 << 20, "{s}");
        // Each side's load is reported, as for a tree.
        assert!(s["wire"]["source_host"]["cores"].as_u64() >= Some(1), "{s}");
        assert!(
            s["wire"]["destination_host"]["cpu_s"].as_f64() > Some(0.0),
            "{s}"
        );
    }
    assert_eq!(fs::read(&dst).unwrap(), data);
    assert_eq!(fs::read(&pushed).unwrap(), data);
    assert!(dst.with_file_name("pulled.img.sluice-map").exists());
    // One chunk changes: the map's digests are compared with ones the
    // source's end computes, and only that chunk's bytes cross.
    data[(21 << 20)..(21 << 20) + 100].fill(7);
    write(&src, &data);
    for s in [pull(&json), push_it(&json)] {
        assert_eq!(s["mode"], "incremental", "{s}");
        assert_eq!(s["chunks_written"], 1, "{s}");
        assert_eq!(s["chunks_unchanged"], 9, "{s}");
        assert_eq!(s["bytes_read"], 4 << 20, "{s}");
    }
    assert_eq!(fs::read(&dst).unwrap(), data);
    assert_eq!(fs::read(&pushed).unwrap(), data);
    // Without the map (--rehash), DST is compared by digests at both ends:
    // a chunk changed behind sluice's back is found and only it crosses.
    let mut behind = data.clone();
    behind[(30 << 20) + 5] ^= 1;
    write(&dst, &behind);
    let s = pull(&["--json", "--rehash"]);
    assert_eq!(s["mode"], "compare", "{s}");
    assert_eq!(s["chunks_written"], 1, "{s}");
    assert_eq!(s["bytes_read"], 4 << 20, "{s}");
    assert_eq!(fs::read(&dst).unwrap(), data);
    // What is not a file or device is refused by the far end, by name.
    let out = run_remote("image", &rsh, t.path(), &t.path().join("x.img"), &[]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("neither a block device nor a file"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_probe_reaches_another_host_either_way_and_leaves_nothing() {
    let t = disk_dir("remote-probe");
    let rsh = fake_ssh(t.path());
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    for i in 0..200 {
        write(&src.join(format!("s/f{i}")), &bytes(2000, i));
    }
    write(&src.join("big"), &bytes(6 << 20, 9));
    fs::create_dir_all(&dst).unwrap();
    // (probe draws no bar: no --no-progress, as the helpers above add)
    let probe = |src: String, dst: String, more: &[&str]| {
        sluice()
            .args(["probe", &src, &dst, "-e"])
            .arg(&rsh)
            .args(["--remote-path", env!("CARGO_BIN_EXE_sluice")])
            .args(more)
            .output()
            .unwrap()
    };
    let (far_src, far_dst) = (
        format!("somehost:{}", src.display()),
        format!("somehost:{}", dst.display()),
    );
    let (here_src, here_dst) = (src.display().to_string(), dst.display().to_string());
    let args = ["--seconds", "0.3", "--json"];
    let pulled = probe(far_src.clone(), here_dst.clone(), &args);
    let pushed = probe(here_src, far_dst, &args);
    for out in [pulled, pushed] {
        ok(&out);
        let lines = stdout(&out);
        let events: Vec<serde_json::Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // Trials copied files of both kinds across the connection, and
        // each kind got a recommendation.
        let best = |class: &str, what: &str| {
            events
                .iter()
                .filter(|e| e["type"] == "probe" && e["class"].as_str().unwrap().starts_with(class))
                .map(|e| e[what].as_f64().unwrap())
                .fold(0.0, f64::max)
        };
        assert!(best("small", "files_per_s") > 0.0, "{lines}");
        assert!(best("big", "bytes_per_s") > 0.0, "{lines}");
        let picks = events
            .iter()
            .filter(|e| e["type"] == "recommendation")
            .count();
        assert_eq!(picks, 2, "{lines}");
        assert!(events.iter().any(|e| e["type"] == "probe_done"), "{lines}");
        // The trials' scratch directory is gone.
        assert_eq!(fs::read_dir(&dst).unwrap().count(), 0);
    }
    // A probe across hosts is not saved (saved probes are kept per pair
    // of local file systems), and says so.
    let out = probe(far_src, here_dst, &["--save"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("not saved"), "{}", stderr(&out));
}

#[test]
fn file_data_crosses_direct_streams_beside_the_control_connection() {
    let t = disk_dir("remote-streams");
    let rsh = fake_ssh(t.path());
    let src = t.path().join("src");
    mixed_tree(&src);
    // "localhost" resolves here; the stand-in sets no SSH_CONNECTION, so
    // the streams go to the host name as given.
    let run = |from: String, to: String, more: &[&str]| {
        let out = sluice()
            .args(["copy", &from, &to, "-e"])
            .arg(&rsh)
            .args(["--remote-path", env!("CARGO_BIN_EXE_sluice")])
            .args(["--chunk-size", "1M", "--json", "--no-progress"])
            .args(more)
            .output()
            .unwrap();
        ok(&out);
        summary(&out)
    };
    let here = |p: &Path| p.display().to_string();
    let far = |p: &Path| format!("localhost:{}", p.display());
    for (i, more) in [
        &["--streams", "3"][..],
        &["--streams", "2", "--no-encryption"],
    ]
    .into_iter()
    .enumerate()
    {
        let want = more[1].parse::<u64>().unwrap();
        let pulled = t.path().join(format!("pulled{i}"));
        let s = run(far(&src), here(&pulled), more);
        assert_eq!(s["wire"]["data_streams"], want, "{s}");
        // The wire is counted apart from what was written: all of SRC's
        // data came in (the sparse file's zeros among it), little went out.
        let came = s["wire"]["bytes_received"].as_u64().unwrap();
        let wrote = s["bytes_copied"].as_u64().unwrap();
        assert!(came >= wrote - (8 << 20) && came < wrote + (1 << 20), "{s}");
        assert!(s["wire"]["bytes_sent"].as_u64().unwrap() < 1 << 20, "{s}");
        assert_same_tree(&src, &pulled);
        let pushed = t.path().join(format!("pushed{i}"));
        let s = run(here(&src), far(&pushed), more);
        assert_eq!(s["wire"]["data_streams"], want, "{s}");
        assert_same_tree(&src, &pushed);
        assert_no_temporaries(&pushed);
    }
    // --streams 0: everything over the control connection.
    let only = t.path().join("only-ssh");
    let s = run(far(&src), here(&only), &["--streams", "0"]);
    assert_eq!(s["wire"]["data_streams"], 0, "{s}");
    assert!(
        s["wire"]["bytes_received"].as_u64().unwrap() > 9 << 20,
        "{s}"
    );
    assert_same_tree(&src, &only);
}

/// A source whose file system answers slowly (the latency file system of
/// crates/latencyfs, 5 ms a request, on the far side): the summary says
/// the source host's disk held the job, not the link or this host.
#[test]
fn a_slow_source_disk_is_named_as_the_bound() {
    if !is_root() || !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: mounting the latency file system needs root and /dev/fuse");
        return;
    }
    let t = disk_dir("remote-slow-src");
    let rsh = fake_ssh(t.path());
    let back = tmpfs_dir("remote-slow-back").unwrap_or_else(|| disk_dir("remote-slow-back"));
    for i in 0..4 {
        write(&back.path().join(format!("f{i}.bin")), &bytes(8 << 20, i));
    }
    let mnt = t.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let _share = sluice_latencyfs::LatencyFs::new(back.path(), Duration::from_millis(5))
        .unwrap()
        .mount(&mnt, 64)
        .expect("mount the latency file system");
    let dst = t.path().join("dst");
    let out = run_remote("copy", &rsh, &mnt, &dst, &["--json"]);
    ok(&out);
    assert_same_tree(back.path(), &dst);
    let s = summary(&out);
    let said = s["bottleneck"].as_str().unwrap_or_default();
    assert!(said.starts_with("bound by the source host's disk"), "{s}");
    assert!(
        s["wire"]["source_host"]["disk_s"].as_f64().unwrap() > 0.3,
        "{s}"
    );
}
