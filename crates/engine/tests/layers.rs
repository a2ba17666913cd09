//! The engine's modules form layers: no module depends, directly or
//! through others, on a module that depends on it. A loop is what let every
//! part reach every other (a task holding the job, the job holding tasks),
//! and what kept a task from being a value another process could run.
//!
//! A module depends on another when it names it (`crate::m`) or calls a
//! method only that module defines (`impl Worker` blocks spread over
//! several files hide a dependency no `use` line shows). Method names the
//! standard library also uses (`push`, `new`, ...) are left out of the
//! second rule: they would tie every module that touches a `Vec`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Method names too common to say which module a call reaches.
const COMMON: &[&str] = &[
    "new",
    "push",
    "pop",
    "take",
    "run",
    "name",
    "drop",
    "len",
    "get",
    "set",
    "insert",
    "remove",
    "next",
    "as_fd",
    "clone",
    "fmt",
    "from",
    "into",
    "default",
    "is_empty",
    "lock",
    "wait",
    "close",
    "done",
    "read",
    "write",
    "open",
    "finish",
    "error",
    "fail",
    "commit",
    "chunks",
    "hash",
    "list",
    "stat",
    "kind",
    "buf",
    "id",
    "start",
    "join",
    "flush",
    "sync",
    "forget",
    "record",
    "stream",
    "put",
    "err",
    "release",
    "hold",
    "of",
    "sum",
    "with_stat",
    "dst",
    "path",
    "load",
    "store",
    "skip",
    "map",
    "filter",
    "find",
    "iter",
    "swap",
    "split",
    "contains",
    "count",
    "reset",
    "add",
    "size",
    "copy",
    "min",
    "max",
    "parse",
    "check",
    "verify",
];

/// A module's text without its unit tests, comments and string contents
/// that could name other modules.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read a module");
    let body = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    body.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn idents_after<'a>(text: &'a str, pat: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(pat) {
        let tail = &rest[i + pat.len()..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(&tail[..end]);
        rest = &tail[end..];
    }
    out
}

/// Which modules each module depends on, and why (for the message).
fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut texts = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("list src") {
        let path = entry.expect("entry").path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
        if path.extension().is_some_and(|e| e == "rs") && name != "lib" {
            texts.insert(name, code(&path));
        }
    }
    // Methods (`fn x(&self` / `&mut self` / `self:`) and where they are
    // defined; a name defined in two modules says nothing.
    let mut defined: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (m, t) in &texts {
        for f in idents_after(t, "fn ") {
            let after = &t[t.find(&format!("fn {f}")).unwrap()..];
            let sig = &after[..after.find('{').unwrap_or(after.len()).min(400)];
            if sig.contains("self") && !COMMON.contains(&f) {
                defined.entry(f).or_default().insert(m);
            }
        }
    }
    let mut deps: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (m, t) in &texts {
        let d = deps.entry(m.clone()).or_default();
        for n in idents_after(t, "crate::") {
            if texts.contains_key(n) && n != m {
                d.insert(n.to_owned(), format!("crate::{n}"));
            }
        }
        for (f, ms) in &defined {
            if ms.len() == 1 && !ms.contains(m.as_str()) && t.contains(&format!(".{f}(")) {
                d.entry(ms.first().unwrap().to_string())
                    .or_insert_with(|| format!(".{f}()"));
            }
        }
    }
    deps
}

type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// A loop through `from`, if there is one.
fn cycle_through(deps: &Graph, from: &str) -> Option<Vec<String>> {
    fn walk(
        deps: &Graph,
        at: &str,
        goal: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in deps[at].keys() {
            if next == goal {
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(deps, next, goal, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![from.to_owned()];
    walk(deps, from, from, &mut path, &mut BTreeSet::new()).then(|| {
        path.push(from.to_owned());
        path
    })
}

#[test]
fn no_module_depends_on_itself_through_others() {
    let deps = graph();
    let loops: Vec<String> = deps
        .keys()
        .filter_map(|m| cycle_through(&deps, m))
        .map(|p| {
            p.windows(2)
                .map(|w| format!("{} -({})-> ", w[0], deps[&w[0]][&w[1]]))
                .collect::<String>()
                + p.last().unwrap()
        })
        .collect();
    assert!(loops.is_empty(), "module loops:\n{}", loops.join("\n"));
}

#[test]
fn the_check_sees_a_dependency() {
    // The rules above find what they should: the job runs the streams.
    let deps = graph();
    assert!(deps["job"].contains_key("worker"), "{deps:?}");
    assert!(deps["copy"].contains_key("state"), "{deps:?}");
}
