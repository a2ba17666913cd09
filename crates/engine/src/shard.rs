//! One part of a job split over independent processes (`--shard I/N`):
//! which entries and which chunks of a big file are this part's, decided
//! from names alone, so N processes started by anything (a Slurm array, a
//! Kubernetes indexed job, ssh in a loop) split a tree without talking to
//! each other.
//!
//! Every part walks every directory (a listing is cheap next to the files
//! in it) and creates it in DST; of the other entries it takes those whose
//! path hashes to it. A hard-linked file goes by its inode instead, so one
//! part sees all of its names and links them. A big file is split by
//! chunk: chunk `i` is part `(h + i) mod N`'s, `h` the path's hash, so one
//! huge file spreads over every part.
//!
//! The parts of a big file meet in one temporary whose name they all
//! derive from the file (its path, size, mtime, inode and the chunk size),
//! never opened with `O_TRUNC`. A part that has written and synced its
//! chunks leaves a marker beside it, under the temporary's lock; the part
//! that finds every other marker there renames the temporary into place
//! and removes the markers. So the last part to finish commits, whichever
//! it is, and a part that dies leaves its chunks for its rerun (its
//! journal) or the others' markers for whoever finishes the file.

use sluice_sys::Stat;
use xxhash_rust::xxh3::Xxh3;

/// This process's part of the job: `index` of `count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

/// Environment variables a launcher sets, as (index, count) pairs.
const LAUNCHERS: [(&str, Option<&str>); 4] = [
    ("SLURM_PROCID", Some("SLURM_NTASKS")),
    ("OMPI_COMM_WORLD_RANK", Some("OMPI_COMM_WORLD_SIZE")),
    ("PMI_RANK", Some("PMI_SIZE")),
    ("JOB_COMPLETION_INDEX", None),
];

impl Shard {
    /// Parses `I/N`; an `I` or `N` left out (`/N`, `I/`, or `auto` for
    /// both) is taken from the launcher's environment (`env` looks a
    /// variable up): Slurm, Open MPI, a PMI launcher, or a Kubernetes
    /// indexed job (which gives only the index).
    pub fn parse(spec: &str, env: impl Fn(&str) -> Option<String>) -> Result<Shard, String> {
        let (i, n) = match spec {
            "auto" => ("", ""),
            _ => spec.split_once('/').ok_or_else(|| {
                format!("--shard {spec}: expected I/N (part I of N, counting from 0), or auto")
            })?,
        };
        let num = |s: &str, what: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("--shard {spec}: {what} {s:?} is not a number"))
        };
        let from_env = |vars: Vec<&'static str>, what: &str| match vars
            .iter()
            .find_map(|&var| env(var).map(|v| (var, v)))
        {
            Some((var, v)) => num(&v, var),
            None => Err(format!(
                "--shard {spec}: no {what} given, and none of {} is set",
                vars.join(", ")
            )),
        };
        let indexes = LAUNCHERS.iter().map(|l| l.0).collect();
        let counts = LAUNCHERS.iter().filter_map(|l| l.1).collect();
        let index = if i.is_empty() {
            from_env(indexes, "part")?
        } else {
            num(i, "part")?
        };
        let count = if n.is_empty() {
            from_env(counts, "count")?
        } else {
            num(n, "count")?
        };
        if count == 0 || index >= count {
            return Err(format!(
                "--shard {spec}: part {index} of {count} does not exist (parts count from 0 to N-1)"
            ));
        }
        Ok(Shard { index, count })
    }

    /// What the split goes by for the entry `name` in directory `dir`
    /// (relative to the roots, empty at the root): the hash of its path,
    /// taken without building the path.
    pub fn path_hash(dir: &[u8], name: &[u8]) -> u64 {
        let mut h = Xxh3::new();
        if !dir.is_empty() {
            h.update(dir);
            h.update(b"/");
        }
        h.update(name);
        h.digest()
    }

    /// Whether the entry whose path hashes to `path`, with metadata `st`,
    /// is this part's: by its inode when it is a file with more than one
    /// name, else by its path.
    pub fn owns(&self, path: u64, st: &Stat) -> bool {
        self.owner(path, st) == self.index
    }

    /// The part whose the entry whose path hashes to `path` is (see
    /// [`Shard::owns`]).
    pub fn owner(&self, path: u64, st: &Stat) -> u32 {
        let h = if Self::linked(st) {
            let mut h = Xxh3::new();
            h.update(&st.dev.0.to_le_bytes());
            h.update(&st.dev.1.to_le_bytes());
            h.update(&st.ino.to_le_bytes());
            h.digest()
        } else {
            path
        };
        (h % u64::from(self.count)) as u32
    }

    /// Whether an entry known by its path alone (an extra DST has, to
    /// delete) is this part's.
    pub fn owns_path(&self, path: u64) -> bool {
        path % u64::from(self.count) == u64::from(self.index)
    }

    /// Whether this part has anything to do with a non-directory entry:
    /// one it owns, or a big file of `chunks` chunks (`Some`) split
    /// between parts, of which it owns a chunk.
    pub fn takes(&self, path: u64, st: &Stat, chunks: Option<u64>) -> bool {
        match chunks {
            // Its first chunk is number (index - start) mod count.
            Some(n) if Self::splits(st) => {
                let n_parts = u64::from(self.count);
                (u64::from(self.index) + n_parts - Self::start(path, n_parts)) % n_parts < n
            }
            _ => self.owns(path, st),
        }
    }

    /// Whether a file is split by chunk across parts: a file with more
    /// than one name is one part's, whole.
    pub fn splits(st: &Stat) -> bool {
        !Self::linked(st)
    }

    fn linked(st: &Stat) -> bool {
        st.file_type() == sluice_sys::FileType::RegularFile && st.nlink > 1
    }

    /// The part chunk 0 of the file at `path` belongs to; chunk `i` is
    /// the next part's after chunk `i - 1`'s.
    fn start(path: u64, count: u64) -> u64 {
        path % count
    }

    fn chunk_owner(&self, path: u64, i: u64) -> u32 {
        let n = u64::from(self.count);
        ((Self::start(path, n) + i % n) % n) as u32
    }

    /// Whether chunk `i` of the big file at `path` is this part's.
    pub fn owns_chunk(&self, path: u64, i: u64) -> bool {
        self.chunk_owner(path, i) == self.index
    }

    /// This part's chunks of a big file of `chunks` chunks.
    pub fn chunks(&self, path: u64, chunks: u64) -> Vec<u64> {
        (0..chunks)
            .filter(|&i| self.chunk_owner(path, i) == self.index)
            .collect()
    }

    /// The parts that own at least one of those chunks: the markers a
    /// commit waits for.
    pub fn owners(&self, path: u64, chunks: u64) -> Vec<u32> {
        let mut v: Vec<u32> = (0..chunks.min(u64::from(self.count)))
            .map(|i| self.chunk_owner(path, i))
            .collect();
        v.sort_unstable();
        v
    }

    /// The sequence field shared by every part's name for one big file's
    /// temporary and markers: the file as listed, cut into `chunk_size`
    /// chunks. A changed source gets other names, so a temporary of its
    /// older version is never written into.
    pub fn file_seq(rel: &[u8], st: &Stat, chunk_size: u64) -> u64 {
        let mut h = Xxh3::new();
        h.update(rel);
        for v in [
            st.size,
            st.ino,
            st.mtime.0 as u64,
            u64::from(st.mtime.1),
            chunk_size,
        ] {
            h.update(&v.to_le_bytes());
        }
        h.digest()
    }

    /// The "process" field of the names: 0 for the temporary itself (no
    /// process has id 0), and for part `i`'s marker a value that names `i`
    /// and the count, so markers of a run split another way are not taken
    /// for this one's.
    pub fn marker_field(&self, part: u32) -> u64 {
        (u64::from(self.count) << 32) | u64::from(part)
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn a_part_is_given_or_taken_from_the_launcher() {
        let none = env(&[]);
        assert_eq!(Shard::parse("2/4", &none), Ok(Shard { index: 2, count: 4 }));
        let slurm = env(&[("SLURM_PROCID", "3"), ("SLURM_NTASKS", "8")]);
        assert_eq!(
            Shard::parse("auto", &slurm),
            Ok(Shard { index: 3, count: 8 })
        );
        assert_eq!(Shard::parse("/5", &slurm), Ok(Shard { index: 3, count: 5 }));
        let k8s = env(&[("JOB_COMPLETION_INDEX", "1")]);
        assert_eq!(Shard::parse("/3", &k8s), Ok(Shard { index: 1, count: 3 }));
        assert!(Shard::parse("auto", &k8s)
            .unwrap_err()
            .contains("SLURM_NTASKS"));
        assert!(Shard::parse("4/4", &none)
            .unwrap_err()
            .contains("does not exist"));
        assert!(Shard::parse("0/0", &none).is_err());
        assert!(Shard::parse("x/4", &none).is_err());
        assert!(Shard::parse("3", &none).unwrap_err().contains("I/N"));
    }

    /// Every entry and every chunk has exactly one owner, and the work
    /// spreads: the parts of 4 take 10,000 names and a 1,000-chunk file
    /// within a few percent of a quarter each.
    #[test]
    fn the_parts_cover_everything_once_and_evenly() {
        let n = 4u32;
        let parts: Vec<Shard> = (0..n).map(|index| Shard { index, count: n }).collect();
        let st = Stat {
            mode: 0o100644,
            nlink: 1,
            ..Stat::default()
        };
        let mut per = vec![0u32; n as usize];
        for k in 0..10_000 {
            let rel = format!("dir{}/file{k}", k % 37);
            let owners: Vec<u32> = parts
                .iter()
                .filter(|p| p.owns(Shard::path_hash(b"", rel.as_bytes()), &st))
                .map(|p| p.index)
                .collect();
            assert_eq!(owners.len(), 1, "{rel}");
            per[owners[0] as usize] += 1;
        }
        assert!(per.iter().all(|&c| (2300..2700).contains(&c)), "{per:?}");
        let mut seen = vec![0u32; 1000];
        for p in &parts {
            let mine = p.chunks(Shard::path_hash(b"", b"big"), 1000);
            assert!((240..=260).contains(&mine.len()), "{}", mine.len());
            for i in mine {
                seen[i as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&c| c == 1));
        // A file of 3 chunks has 3 owners; every part agrees which, and a
        // part takes a split file exactly when it owns one of its chunks.
        let small = Shard::path_hash(b"", b"small-big");
        let owners = parts[0].owners(small, 3);
        assert_eq!(owners.len(), 3);
        for p in &parts {
            assert_eq!(p.owners(small, 3), owners);
        }
        for k in 0..200u64 {
            let path = Shard::path_hash(b"d", format!("f{k}").as_bytes());
            for chunks in 1..7 {
                for p in &parts {
                    let has = !p.chunks(path, chunks).is_empty();
                    assert_eq!(p.takes(path, &st, Some(chunks)), has, "{k} {chunks} {p}");
                    assert_eq!(p.owners(path, chunks).contains(&p.index), has);
                }
            }
        }
    }

    /// A path's hash is the same whether it is taken whole or as its
    /// directory and name, as each of the split's callers has it.
    #[test]
    fn a_path_hashes_the_same_whole_or_in_parts() {
        assert_eq!(
            Shard::path_hash(b"a/b", b"c"),
            Shard::path_hash(b"", b"a/b/c")
        );
        assert_eq!(
            Shard::path_hash(b"", b"c"),
            xxhash_rust::xxh3::xxh3_64(b"c")
        );
        assert_ne!(Shard::path_hash(b"a", b"bc"), Shard::path_hash(b"ab", b"c"));
    }

    /// The names of a hard-linked file, wherever they are, go to one part.
    #[test]
    fn every_name_of_a_hard_linked_file_goes_to_one_part() {
        let st = Stat {
            mode: 0o100644,
            nlink: 3,
            ino: 77,
            dev: (8, 1),
            ..Stat::default()
        };
        for count in 2..6 {
            let parts: Vec<Shard> = (0..count).map(|index| Shard { index, count }).collect();
            let owner = |rel: &[u8]| {
                let path = Shard::path_hash(b"", rel);
                parts.iter().position(|p| p.owns(path, &st)).unwrap()
            };
            assert_eq!(owner(b"a/x"), owner(b"b/c/y"));
            assert_eq!(owner(b"a/x"), owner(b"z"));
        }
    }
}
