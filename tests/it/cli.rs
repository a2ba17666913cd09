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
