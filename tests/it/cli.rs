//! Habits people bring from rsync and cp: short flags, and a word where a
//! flag does not apply.

use crate::common::*;

#[test]
fn short_flags_and_habit_hints() {
    let t = disk_dir("cli");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"a");
    // -n is --dry-run: nothing written.
    let out = copy(&src, &dst, &["-n", "--json"]);
    ok(&out);
    assert_eq!(summary(&out)["files_copied"], 1);
    assert!(!dst.exists());
    // -q: no summary table, nothing on stdout.
    let out = copy(&src, &dst, &["-q"]);
    ok(&out);
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    assert_eq!(std::fs::read(dst.join("a")).unwrap(), b"a");
    for (flag, says) in [
        ("-a", "always copies recursively"),
        ("-av", "always copies recursively"),
        ("-r", "always copies recursively"),
        ("--delete", "`sluice sync` option"),
    ] {
        let out = copy(&src, &dst, &[flag]);
        assert_eq!(code(&out), 2, "{flag}");
        assert!(stderr(&out).contains(says), "{flag}: {}", stderr(&out));
    }
}

/// `copy FILE dir/` with `dir` missing makes the directory and puts FILE in
/// it, as the slash says.
#[test]
fn a_file_copied_to_a_path_ending_in_a_slash_lands_in_that_directory() {
    let t = disk_dir("slash");
    let f = t.path().join("f");
    write(&f, b"data");
    let dir = t.path().join("newdir");
    let out = copy(
        &f,
        std::path::Path::new(&format!("{}/", dir.display())),
        &[],
    );
    ok(&out);
    assert!(dir.is_dir());
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"data");
}

/// Completions for the shells people use, and a man page.
#[test]
fn completions_and_man_page() {
    for (shell, has) in [
        ("bash", "_sluice"),
        ("zsh", "#compdef sluice"),
        ("fish", "complete -c sluice"),
    ] {
        let out = sluice().args(["completions", shell]).output().unwrap();
        ok(&out);
        assert!(stdout(&out).contains(has), "{shell}");
        assert!(stdout(&out).contains("bwlimit"), "{shell}: options missing");
    }
    let out = sluice().arg("man").output().unwrap();
    ok(&out);
    assert!(stdout(&out).contains(".TH sluice 1"), "{}", stdout(&out));
}

/// `-v` lists what happened to each entry and why; with `-n`, what would
/// happen, and nothing does; with `--json`, the same as objects.
#[test]
fn verbose_lists_each_entry_with_its_reason() {
    let t = disk_dir("verbose");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"a");
    write(&src.join("d/b"), b"b");
    let out = copy(&src, &dst, &["-v"]);
    ok(&out);
    let o = stdout(&out);
    for want in ["copy ", "/a (new)", "/d/ (new)", "/d/b (new)"] {
        assert!(o.contains(want), "{want:?} missing:\n{o}");
    }
    write(&src.join("a"), b"longer");
    write(&dst.join("extra"), b"x");
    let before = ctimes(&dst);
    let out = sync(&src, &dst, &["-v", "-n", "--delete"]);
    ok(&out);
    let o = stdout(&out);
    assert!(
        o.contains("would update ") && o.contains("/a (size, mtime)"),
        "{o}"
    );
    assert!(o.contains("would delete ") && o.contains("/extra"), "{o}");
    assert!(!o.contains("/d/b"), "an unchanged entry was listed:\n{o}");
    assert_eq!(ctimes(&dst), before, "a dry run changed DST");
    let out = sync(&src, &dst, &["-v", "--delete", "--json"]);
    ok(&out);
    let entries = json_lines(&out, "entry");
    assert_eq!(entries.len(), 1, "{}", stdout(&out));
    assert_eq!(entries[0]["action"], "update");
    assert_eq!(entries[0]["why"], serde_json::json!(["size", "mtime"]));
    assert_eq!(json_lines(&out, "deleted").len(), 1);
}

/// --size-only, --update, --ignore-existing decide what counts as up to
/// date; --exclude-from reads patterns from a file.
#[test]
fn quick_check_opt_outs_and_patterns_from_a_file() {
    let t = disk_dir("optouts");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("same-size"), b"aaaa");
    write(&src.join("newer-in-dst"), b"src");
    write(&src.join("exists"), b"from src");
    write(&src.join("skip.log"), b"log");
    write(&src.join("keep"), b"keep");
    std::fs::create_dir_all(&dst).unwrap();
    write(&dst.join("same-size"), b"bbbb");
    write(&dst.join("newer-in-dst"), b"dst!");
    write(&dst.join("exists"), b"old");
    set_mtime(&src.join("same-size"), 1_700_000_000, 0);
    set_mtime(&src.join("newer-in-dst"), 1_700_000_000, 0);
    set_mtime(&dst.join("newer-in-dst"), 1_800_000_000, 0);
    set_mtime(&dst.join("exists"), 1_600_000_000, 0); // older: --update copies it
    let patterns = t.path().join("patterns");
    write(&patterns, b"# logs\n\n*.log\n");
    let pat = patterns.to_str().unwrap();
    let out = copy(
        &src,
        &dst,
        &["--size-only", "--update", "--exclude-from", pat, "--json"],
    );
    ok(&out);
    let read = |n: &str| std::fs::read(dst.join(n)).unwrap();
    assert_eq!(
        read("same-size"),
        b"bbbb",
        "--size-only replaced a same-size file"
    );
    assert_eq!(
        read("newer-in-dst"),
        b"dst!",
        "--update replaced a newer DST file"
    );
    assert_eq!(read("exists"), b"from src");
    assert!(!dst.join("skip.log").exists(), "--exclude-from ignored");
    assert_eq!(read("keep"), b"keep");
    write(&src.join("exists"), b"changed again");
    write(&src.join("brand-new"), b"new");
    let out = copy(&src, &dst, &["--ignore-existing", "--json"]);
    ok(&out);
    assert_eq!(
        read("exists"),
        b"from src",
        "--ignore-existing replaced an entry"
    );
    assert_eq!(read("brand-new"), b"new");
}

/// --no-xattrs copies no extended attributes, --no-acls none of the ACLs.
#[test]
fn xattrs_and_acls_can_be_left_behind() {
    let t = disk_dir("noxattr");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("f"), b"f");
    let f = src.join("f");
    if rustix::fs::setxattr(&f, "user.test", b"v", rustix::fs::XattrFlags::empty()).is_err() {
        eprintln!("skipped: no user xattrs here");
        return;
    }
    let acl = have("setfacl") && run("setfacl", &["-m", "u:nobody:r", f.to_str().unwrap()]);
    ok(&copy(&src, &dst.join("none"), &["--no-xattrs"]));
    let names = |p: &std::path::Path| {
        let mut buf = vec![0u8; 4096];
        let n = rustix::fs::listxattr(p, &mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).to_string()
    };
    let none = names(&dst.join("none/f"));
    assert!(
        !none.contains("user.test") && !none.contains("posix_acl"),
        "{none}"
    );
    ok(&copy(&src, &dst.join("no-acls"), &["--no-acls"]));
    let some = names(&dst.join("no-acls/f"));
    assert!(some.contains("user.test"), "{some}");
    assert!(!some.contains("posix_acl"), "{some}");
    if acl {
        ok(&copy(&src, &dst.join("all"), &[]));
        assert!(names(&dst.join("all/f")).contains("posix_acl_access"));
    }
}

/// Progress without a terminal: `--progress` prints a line a second (with
/// a percentage once the walk is over); `--json` carries progress objects
/// with a timestamp.
#[test]
fn progress_lines_and_json_progress_events() {
    let t = disk_dir("progress");
    let src = t.path().join("src");
    for i in 0..3 {
        write(&src.join(format!("f{i}")), &bytes(2 << 20, i));
    }
    // 6 MiB at 3 MiB/s: about two seconds.
    // (run_cmd would add --no-progress)
    let out = sluice()
        .args(["copy", "--bwlimit", "3M", "--progress"])
        .arg(&src)
        .arg(t.path().join("a"))
        .output()
        .unwrap();
    ok(&out);
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("entries")).collect();
    assert!(!lines.is_empty(), "no progress lines: {err}");
    assert!(
        lines.iter().any(|l| l.contains('%')),
        "no percentage: {err}"
    );
    let out = copy(&src, &t.path().join("b"), &["--bwlimit", "3M", "--json"]);
    ok(&out);
    let ticks = json_lines(&out, "progress");
    assert!(!ticks.is_empty(), "{}", stdout(&out));
    assert!(ticks.iter().all(|p| p["time"].as_f64().unwrap() > 1.7e9));
    let last = ticks.last().unwrap();
    assert_eq!(last["walk_done"], true, "{last}");
    assert_eq!(last["bytes_found"], 6 << 20);
}

/// `--log-file` gets every entry's event, with or without `-v`; a dry run's
/// summary gives no rates.
#[test]
fn log_file_and_dry_run_summary() {
    let t = disk_dir("logfile");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"a");
    write(&src.join("d/b"), b"b");
    let log = t.path().join("sluice.log");
    let out = copy(&src, &dst, &["--log-file", log.to_str().unwrap()]);
    ok(&out);
    assert!(
        !stdout(&out).contains("(new)"),
        "listed without -v: {}",
        stdout(&out)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    for want in ["copy ", "/a (new)", "/d/b (new)"] {
        assert!(text.contains(want), "{want:?} not in the log:\n{text}");
    }
    write(&dst.join("extra"), b"x");
    let out = sync(
        &src,
        &dst,
        &["--delete", "-n", "--log-file", log.to_str().unwrap()],
    );
    ok(&out);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("would delete ") && text.contains("/extra"),
        "{text}"
    );
    assert!(
        stdout(&out).contains("dry run: nothing written"),
        "{}",
        stdout(&out)
    );
    assert!(
        !stdout(&out).contains("/s"),
        "rates in a dry run: {}",
        stdout(&out)
    );
}

/// `sluice copy A B DIR`: each source lands under its own name in DIR, one
/// summary for all.
#[test]
fn several_sources_go_into_the_last_path() {
    let t = disk_dir("several");
    let (a, b, f) = (t.path().join("a"), t.path().join("b"), t.path().join("f"));
    write(&a.join("x"), b"x");
    write(&b.join("y/z"), b"z");
    write(&f, b"file");
    let dir = t.path().join("dir");
    let out = sluice()
        .args(["copy", "--json", "--no-progress"])
        .args([&a, &b, &f, &dir])
        .output()
        .unwrap();
    ok(&out);
    assert_eq!(std::fs::read(dir.join("a/x")).unwrap(), b"x");
    assert_eq!(std::fs::read(dir.join("b/y/z")).unwrap(), b"z");
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"file");
    assert_eq!(summary(&out)["files_copied"], 3);
    let out = sluice()
        .args(["verify", "--no-progress"])
        .args([&a, &b, &dir])
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

/// `--files-from`: only the listed paths (a directory whole) are copied;
/// with `--delete`, nothing outside them is removed.
#[test]
fn files_from_copies_only_what_is_listed() {
    let t = disk_dir("filesfrom");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a/b/wanted"), b"w");
    write(&src.join("a/b/unwanted"), b"u");
    write(&src.join("docs/x/y"), b"y");
    write(&src.join("top"), b"t");
    write(&dst.join("kept-extra"), b"not listed, not deleted");
    let list = t.path().join("list");
    write(&list, b"# what to copy\na/b/wanted\n./docs/\n");
    let out = sync(
        &src,
        &dst,
        &["--files-from", list.to_str().unwrap(), "--delete"],
    );
    ok(&out);
    assert_eq!(std::fs::read(dst.join("a/b/wanted")).unwrap(), b"w");
    assert_eq!(std::fs::read(dst.join("docs/x/y")).unwrap(), b"y");
    assert!(!dst.join("a/b/unwanted").exists());
    assert!(!dst.join("top").exists());
    assert!(
        dst.join("kept-extra").exists(),
        "--delete reached outside the list"
    );
}

/// `--no-perms`: new entries get SRC's bits less the umask, existing ones
/// keep DST's mode, and a mode difference alone copies nothing.
#[test]
fn no_perms_leaves_modes_to_dst() {
    use std::os::unix::fs::PermissionsExt;
    let t = disk_dir("noperms");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("open"), b"o");
    write(&src.join("kept"), b"k");
    std::fs::set_permissions(src.join("open"), std::fs::Permissions::from_mode(0o777)).unwrap();
    ok(&copy(&src, &dst, &[]));
    std::fs::set_permissions(dst.join("kept"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::remove_file(dst.join("open")).unwrap();
    let out = sluice()
        .args(["copy", "--no-perms", "--json", "--no-progress"])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    ok(&out);
    let mode = |n: &str| std::fs::metadata(dst.join(n)).unwrap().permissions().mode() & 0o7777;
    let umask = rustix::process::umask(rustix::fs::Mode::empty());
    rustix::process::umask(umask);
    assert_eq!(mode("open"), 0o777 & !umask.bits(), "umask not applied");
    assert_eq!(mode("kept"), 0o600, "an existing entry's mode was changed");
    assert_eq!(summary(&out)["files_copied"], 1, "{}", stdout(&out));
}

/// The JSON summary says which schema it follows and whether it was a dry
/// run; verify's outcome is "identical" or "differs".
#[test]
fn json_summary_fields_a_script_can_trust() {
    let t = disk_dir("jsonfields");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"a");
    let s = summary(&copy(&src, &dst, &["-n", "--json"]));
    assert_eq!(
        (s["schema"].clone(), s["dry_run"].clone()),
        (1.into(), true.into()),
        "{s}"
    );
    let s = summary(&copy(&src, &dst, &["--json"]));
    assert_eq!(s["dry_run"], false, "{s}");
    let out = run_cmd("verify", &src, &dst, &["--json"]);
    ok(&out);
    assert_eq!(summary(&out)["outcome"], "identical");
    write(&dst.join("a"), b"b");
    let out = run_cmd("verify", &src, &dst, &["--json"]);
    assert_eq!(code(&out), 1);
    assert_eq!(summary(&out)["outcome"], "differs");
}

/// verify names both paths of a difference and shows times as dates.
#[test]
fn verify_names_both_sides_and_dates() {
    let t = disk_dir("verifymsg");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write(&src.join("a"), b"a");
    ok(&copy(&src, &dst, &[]));
    set_mtime(&dst.join("a"), 1_000_000_000, 0);
    let out = run_cmd("verify", &src, &dst, &["--metadata", "--json"]);
    assert_eq!(code(&out), 1);
    let d = &json_lines(&out, "difference")[0];
    assert!(d["src"].as_str().unwrap().ends_with("src/a"), "{d}");
    assert!(d["dst"].as_str().unwrap().ends_with("dst/a"), "{d}");
    assert!(
        d["what"].as_str().unwrap().contains("2001-09-09 01:46:40"),
        "{d}"
    );
    assert!(stderr(&out).contains(" vs "), "{}", stderr(&out));
}

/// Progress of one big file counts bytes as they are written: mid-copy the
/// count is strictly between 0 and the total (not per finished chunk).
#[test]
fn progress_of_one_big_file_moves_between_zero_and_the_total() {
    let t = disk_dir("bigprogress");
    let src = t.path().join("src");
    let total = 9u64 << 20;
    write(&src.join("big"), &bytes(total as usize, 4));
    let out = copy(
        &src,
        &t.path().join("dst"),
        &["--bwlimit", "3M", "--chunk-size", "4M", "--json"],
    );
    ok(&out);
    let mid: Vec<u64> = json_lines(&out, "progress")
        .iter()
        .map(|p| p["bytes_done"].as_u64().unwrap())
        .filter(|&b| b > 0 && b < total)
        .collect();
    assert!(!mid.is_empty(), "no progress mid-copy: {}", stdout(&out));
    assert!(
        mid.iter().any(|&b| b % (4 << 20) != 0),
        "counted per chunk: {mid:?}"
    );
}

/// A bare --bwlimit number is KiB/s on the real binary: 1 MiB at 2000
/// takes about half a second (as bytes/s it would take over eight minutes).
#[test]
fn a_bare_bwlimit_number_is_kib_per_second() {
    let t = disk_dir("bwunits");
    let src = t.path().join("src");
    write(&src.join("f"), &bytes(1 << 20, 2));
    let out = copy(
        &src,
        &t.path().join("dst"),
        &["--bwlimit", "2000", "--json"],
    );
    ok(&out);
    let secs = summary(&out)["elapsed_s"].as_f64().unwrap();
    assert!(
        (0.3..5.0).contains(&secs),
        "1 MiB at 2000 KiB/s took {secs} s"
    );
}

/// The user's umask holds for every job of one run (the second of several
/// sources used to see the umask the first job had cleared).
#[test]
fn no_perms_applies_the_umask_to_every_source() {
    use std::os::unix::fs::PermissionsExt;
    let t = disk_dir("umask2");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    for f in [a.join("f"), b.join("g")] {
        write(&f, b"x");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let dir = t.path().join("dir");
    let out = sluice()
        .args(["copy", "--no-perms", "--no-progress"])
        .args([&a, &b, &dir])
        .output()
        .unwrap();
    ok(&out);
    let umask = rustix::process::umask(rustix::fs::Mode::empty());
    rustix::process::umask(umask);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let want = 0o777 & !umask.bits();
    assert_ne!(want, 0o777, "the test needs a umask");
    assert_eq!(mode(&dir.join("a/f")), want);
    assert_eq!(
        mode(&dir.join("b/g")),
        want,
        "the second source lost the umask"
    );
}

#[test]
fn a_remote_looking_path_is_never_a_local_directory() {
    let t = disk_dir("colon");
    write(&t.path().join("d/f"), b"data");
    let run = |args: &[&str]| {
        sluice()
            .current_dir(t.path())
            .args(args)
            .output()
            .expect("run sluice")
    };
    // Each side, each command: refused with exit 2 and a word on how to
    // write a local path with a colon; nothing created in the cwd.
    // (One remote side of copy, sync, verify, image or probe is reached:
    // tests/it/remote.rs. Both sides remote, several sources with a
    // remote side, or a remote side of watch, are not.)
    for args in [
        &["copy", "h:/d", "user@host:/x"][..],
        &["sync", "--delete", "h:d", "host:x"],
        &["copy", "d", "e", "[::1]:/x"],
        &["copy", "h:/d", "e", "x"],
        &["watch", "d", "h:"],
        &["watch", "h:/d", "d"],
        &["image", "h:/dev/sda", "k:x.img"],
        &["probe", "h:/d", "k:x"],
    ] {
        let out = run(args);
        assert_eq!(code(&out), 2, "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("./"), "{args:?}: {}", stderr(&out));
    }
    let mut left: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["d"]);
    // A local path with a colon, written as such.
    ok(&run(&["copy", "-q", "d", "./a:b"]));
    assert_eq!(std::fs::read(t.path().join("a:b/f")).unwrap(), b"data");
}
