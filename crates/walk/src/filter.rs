//! `--exclude` / `--include` globs.
//!
//! A pattern without `/` matches an entry's name at any depth (`*.tmp`,
//! `.git`); a pattern with `/` matches the path relative to SRC (`logs/*.gz`,
//! a leading `/` is ignored); a trailing `/` restricts it to directories.
//! `*` never crosses `/`, `**` does. An entry is skipped when it matches an
//! exclude and no include; a skipped directory is not descended into.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A bad glob given on the command line.
#[derive(Debug, thiserror::Error)]
#[error("invalid pattern {pattern:?}: {reason}")]
pub struct FilterError {
    pub pattern: String,
    pub reason: String,
}

#[derive(Default, Clone)]
struct Side {
    by_name: Option<GlobSet>,
    by_path: Option<GlobSet>,
    dir_by_name: Option<GlobSet>,
    dir_by_path: Option<GlobSet>,
}

/// The compiled include/exclude rules of a job.
#[derive(Default, Clone)]
pub struct Filter {
    exclude: Side,
    include: Side,
    needs_path: bool,
    /// `--files-from`: only these paths (and what is below them, and the
    /// directories leading to them) are part of the job.
    only: Option<std::sync::Arc<Only>>,
}

/// The paths a `--files-from` list names, relative to SRC.
#[derive(Default)]
struct Only {
    listed: std::collections::HashSet<Vec<u8>>,
    /// Every directory on the way to a listed path.
    leading: std::collections::HashSet<Vec<u8>>,
}

impl Filter {
    /// Compiles the patterns; the empty filter passes everything.
    pub fn new(exclude: &[String], include: &[String]) -> Result<Filter, FilterError> {
        let exclude = build(exclude)?;
        let include = build(include)?;
        let needs_path = [&exclude, &include]
            .iter()
            .any(|s| s.by_path.is_some() || s.dir_by_path.is_some());
        Ok(Filter {
            exclude,
            include,
            needs_path,
            only: None,
        })
    }

    /// Limits the job to `paths` (relative to SRC, as `--files-from` lists
    /// them; a leading `/` or `./` is dropped): a listed file, a listed
    /// directory with everything in it, and the directories that lead to
    /// them. Everything else is excluded, so `--delete` leaves it alone.
    pub fn only(mut self, paths: &[Vec<u8>]) -> Filter {
        let mut only = Only::default();
        for p in paths {
            let parts: Vec<&[u8]> = p
                .split(|&b| b == b'/')
                .filter(|c| !c.is_empty() && *c != b".")
                .collect();
            if parts.is_empty() {
                continue;
            }
            for i in 1..parts.len() {
                only.leading.insert(parts[..i].join(&b'/'));
            }
            only.listed.insert(parts.join(&b'/'));
        }
        self.only = Some(std::sync::Arc::new(only));
        self.needs_path = true;
        self
    }

    /// True when no pattern was given: callers skip the per-entry check.
    pub fn is_empty(&self) -> bool {
        self.only.is_none()
            && self.exclude.by_name.is_none()
            && self.exclude.by_path.is_none()
            && self.exclude.dir_by_name.is_none()
            && self.exclude.dir_by_path.is_none()
    }

    /// True when some pattern needs the path relative to SRC, not just the
    /// name, so the caller must build it.
    pub fn needs_path(&self) -> bool {
        self.needs_path
    }

    /// Whether an entry is skipped. `rel` is its path relative to SRC; it is
    /// only read when [`Filter::needs_path`] is true.
    pub fn excludes(&self, name: &[u8], rel: &[u8], is_dir: bool) -> bool {
        if let Some(only) = &self.only {
            if !only.admits(rel, is_dir) {
                return true;
            }
        }
        self.exclude.matches(name, rel, is_dir) && !self.include.matches(name, rel, is_dir)
    }
}

impl Only {
    /// A listed path, a directory leading to one, or anything below a
    /// listed directory.
    fn admits(&self, rel: &[u8], is_dir: bool) -> bool {
        if self.listed.contains(rel) || (is_dir && self.leading.contains(rel)) {
            return true;
        }
        rel.iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'/')
            .any(|(i, _)| self.listed.contains(&rel[..i]))
    }
}

impl Side {
    fn matches(&self, name: &[u8], rel: &[u8], is_dir: bool) -> bool {
        let name = Path::new(OsStr::from_bytes(name));
        let rel = Path::new(OsStr::from_bytes(rel));
        let hit = |set: &Option<GlobSet>, p: &Path| set.as_ref().is_some_and(|s| s.is_match(p));
        hit(&self.by_name, name)
            || hit(&self.by_path, rel)
            || (is_dir && (hit(&self.dir_by_name, name) || hit(&self.dir_by_path, rel)))
    }
}

fn build(patterns: &[String]) -> Result<Side, FilterError> {
    let mut sets: [Option<GlobSetBuilder>; 4] = Default::default();
    for pattern in patterns {
        let mut p = pattern.as_str();
        let dir_only = p.len() > 1 && p.ends_with('/');
        if dir_only {
            p = &p[..p.len() - 1];
        }
        let anchored = p.contains('/');
        let p = p.trim_start_matches('/');
        let glob = GlobBuilder::new(p)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| FilterError {
                pattern: pattern.clone(),
                reason: e.kind().to_string(),
            })?;
        let slot = usize::from(anchored) + 2 * usize::from(dir_only);
        sets[slot].get_or_insert_with(GlobSetBuilder::new).add(glob);
    }
    let [a, b, c, d] = sets.map(|b| b.map(|b| b.build().expect("globs already validated")));
    Ok(Side {
        by_name: a,
        by_path: b,
        dir_by_name: c,
        dir_by_path: d,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(ex: &[&str], inc: &[&str]) -> Filter {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Filter::new(&s(ex), &s(inc)).unwrap()
    }

    #[test]
    fn name_patterns_match_at_any_depth() {
        let f = f(&["*.tmp"], &[]);
        assert!(f.excludes(b"a.tmp", b"x/y/a.tmp", false));
        assert!(!f.excludes(b"a.txt", b"x/y/a.txt", false));
    }

    #[test]
    fn path_patterns_are_anchored_and_star_stays_in_component() {
        let f = f(&["logs/*.gz"], &[]);
        assert!(f.excludes(b"a.gz", b"logs/a.gz", false));
        assert!(!f.excludes(b"a.gz", b"logs/old/a.gz", false));
        assert!(!f.excludes(b"a.gz", b"x/logs/a.gz", false));
    }

    #[test]
    fn include_overrides_exclude_and_dir_only_patterns() {
        let f = f(&["*.log", "cache/"], &["keep.log"]);
        assert!(!f.excludes(b"keep.log", b"keep.log", false));
        assert!(f.excludes(b"other.log", b"other.log", false));
        assert!(f.excludes(b"cache", b"a/cache", true));
        assert!(!f.excludes(b"cache", b"a/cache", false));
    }

    #[test]
    fn files_from_admits_listed_paths_their_parents_and_contents() {
        let f = Filter::new(&[], &[])
            .unwrap()
            .only(&[b"a/b/file".to_vec(), b"./docs/".to_vec()]);
        assert!(!f.excludes(b"a", b"a", true), "leads to a listed file");
        assert!(!f.excludes(b"b", b"a/b", true));
        assert!(!f.excludes(b"file", b"a/b/file", false));
        assert!(f.excludes(b"other", b"a/b/other", false));
        assert!(
            f.excludes(b"a", b"a", false),
            "a file named like a leading dir"
        );
        assert!(
            !f.excludes(b"x", b"docs/deep/x", false),
            "inside a listed dir"
        );
        assert!(f.excludes(b"top", b"top", false));
    }

    #[test]
    fn bad_pattern_is_reported() {
        assert!(Filter::new(&["a[".to_string()], &[]).is_err());
    }
}
