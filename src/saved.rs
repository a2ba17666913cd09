//! Probe results kept for later runs (`sluice probe --save`).
//!
//! The best parallelism belongs to a pair of file systems (the disks or
//! the share behind them), not to one directory: a saved probe applies to
//! any later job from SRC's file system to DST's. It is found by the exact
//! pair of directories first, then by the pair of devices, newest first.
//! `-j auto` starts from it instead of 16 streams (and tunes on from
//! there), and a saved chunk size replaces the default unless
//! `--chunk-size` is given. `-j N` ignores it.
//!
//! The file is `$XDG_STATE_HOME/sluice/probes.json` (by default
//! `~/.local/state/sluice/probes.json`): one JSON array, rewritten whole
//! through a temporary and a rename.

use serde_json::{json, Value};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One saved probe.
#[derive(Debug, Clone, PartialEq)]
pub struct Saved {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub src_dev: u64,
    pub dst_dev: u64,
    /// Seconds since the epoch.
    pub saved_at: u64,
    /// Streams recommended for small files.
    pub small: Option<usize>,
    /// Streams and chunk size recommended for big files.
    pub big: Option<(usize, u64)>,
}

impl Saved {
    pub fn new(
        src: &Path,
        dst: &Path,
        small: Option<usize>,
        big: Option<(usize, u64)>,
    ) -> io::Result<Saved> {
        let (src, src_dev) = identify(src)?;
        let (dst, dst_dev) = identify(dst)?;
        let saved_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Ok(Saved {
            src,
            dst,
            src_dev,
            dst_dev,
            saved_at,
            small,
            big,
        })
    }

    /// Where `-j auto` starts: enough streams for either kind of work
    /// (the tuner lowers it if the job needs fewer).
    pub fn start_streams(&self) -> Option<usize> {
        match (self.small, self.big.map(|b| b.0)) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).max(b.unwrap_or(0))),
        }
    }

    fn to_json(&self) -> Value {
        json!({
            "src": self.src, "dst": self.dst,
            "src_dev": self.src_dev, "dst_dev": self.dst_dev,
            "saved_at": self.saved_at,
            "small_streams": self.small,
            "big_streams": self.big.map(|b| b.0),
            "big_chunk_size": self.big.map(|b| b.1),
        })
    }

    fn from_json(v: &Value) -> Option<Saved> {
        let n = |k: &str| v.get(k).and_then(Value::as_u64);
        Some(Saved {
            src: PathBuf::from(v.get("src")?.as_str()?),
            dst: PathBuf::from(v.get("dst")?.as_str()?),
            src_dev: n("src_dev")?,
            dst_dev: n("dst_dev")?,
            saved_at: n("saved_at")?,
            small: n("small_streams").map(|x| x as usize),
            big: n("big_streams")
                .zip(n("big_chunk_size"))
                .map(|(s, c)| (s as usize, c)),
        })
    }
}

/// A path made absolute (through its nearest existing ancestor, for a DST
/// not created yet) and the device of the file system it is on.
fn identify(path: &Path) -> io::Result<(PathBuf, u64)> {
    let abs = std::path::absolute(path)?;
    let mut existing = abs.as_path();
    let mut rest = Vec::new();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(real) => {
                let dev = std::fs::metadata(&real)?.dev();
                let full = rest.iter().rev().fold(real, |p, part| p.join(part));
                return Ok((full, dev));
            }
            Err(e) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_owned());
                    existing = parent;
                }
                _ => return Err(e),
            },
        }
    }
}

fn file() -> io::Result<PathBuf> {
    Ok(sluice_engine::state_dir()?.join("probes.json"))
}

fn load(path: &Path) -> Vec<Saved> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| {
            v.as_array()
                .map(|a| a.iter().filter_map(Saved::from_json).collect())
        })
        .unwrap_or_default()
}

/// Keeps `rec`, replacing an earlier probe of the same pair; returns the
/// file it is in.
pub fn save(rec: &Saved) -> io::Result<PathBuf> {
    let path = file()?;
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir)?;
    let mut all = load(&path);
    all.retain(|r| (&r.src, &r.dst) != (&rec.src, &rec.dst));
    all.push(rec.clone());
    let text = serde_json::to_string_pretty(&all.iter().map(Saved::to_json).collect::<Vec<_>>())
        .expect("JSON of plain values");
    let tmp = dir.join(format!(".probes.json.{}", std::process::id()));
    std::fs::write(&tmp, text + "\n")?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// The saved probe for a job from `src` to `dst`, if any.
pub fn find(src: &Path, dst: &Path) -> Option<Saved> {
    let all = load(&file().ok()?);
    let (src, src_dev) = identify(src).ok()?;
    let (dst, dst_dev) = identify(dst).ok()?;
    let exact = all.iter().find(|r| r.src == src && r.dst == dst);
    exact
        .or_else(|| {
            all.iter()
                .filter(|r| r.src_dev == src_dev && r.dst_dev == dst_dev)
                .max_by_key(|r| r.saved_at)
        })
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_its_json() {
        let r = Saved {
            src: "/a".into(),
            dst: "/b/c".into(),
            src_dev: 2049,
            dst_dev: 42,
            saved_at: 1_800_000_000,
            small: Some(64),
            big: Some((4, 256 << 20)),
        };
        assert_eq!(Saved::from_json(&r.to_json()), Some(r.clone()));
        let none = Saved {
            small: None,
            big: None,
            ..r
        };
        assert_eq!(Saved::from_json(&none.to_json()), Some(none.clone()));
        assert_eq!(none.start_streams(), None);
    }

    #[test]
    fn a_dst_not_made_yet_is_named_through_its_parent() {
        let here = std::env::current_dir().unwrap();
        let (p, dev) = identify(Path::new("no/such/dir")).unwrap();
        assert_eq!(p, std::fs::canonicalize(&here).unwrap().join("no/such/dir"));
        assert_eq!(dev, std::fs::metadata(&here).unwrap().dev());
    }
}
