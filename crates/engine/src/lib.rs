//! sluice's engine: runs one job — walk, plan, copy — on one fixed pool of
//! streams, and reports what happened.
//!
//! ```text
//!  roots ─► pool of N streams pulling from one bounded two-lane queue ─► stats, errors
//!           a stream lists a directory (getdents64 + statx), creates it in
//!           DST, queues its small files in batches, its subdirectories as
//!           new tasks, and each big file as chunk tasks any stream may take
//! ```
//!
//! Walking and copying share the pool (rather than separate walker threads
//! feeding copier threads) so that no stream idles while either kind of work
//! waits, and so that a directory exists in DST before any of its children
//! is written. The engine owns no terminal and prints nothing: errors go to
//! a [`Reporter`], counters to [`Stats`].

#![forbid(unsafe_code)]

pub mod budget;
mod chunkmap;
pub mod compare;
mod copy;
mod delete;
mod delta;
pub mod error;
pub mod exchange;
mod existing;
pub mod gauge;
pub mod hash;
pub mod image;
mod job;
mod journal;
mod ledger;
mod meta;
pub mod options;
mod parts;
pub mod plan;
mod queue;
pub mod shard;
pub mod source;
mod state;
pub mod target;
mod throttle;
mod tree;
pub mod tune;
mod verify;
pub mod watch;
mod worker;

pub use error::{escape, EntryError, JobError, Reason, Side};
pub use job::{copy, copy_from};
pub use options::{
    Check, CopyOptions, HashKind, Outcome, Reflink, Reporter, Stats, Summary, DEFAULT_CHUNK,
    DEFAULT_JOBS, JUDGE_AFTER,
};
pub use sluice_sys::XattrSet;
pub use sluice_walk::Filter;

/// Whether this process may drop the page cache (root), as `sluice probe`
/// does between trials.
pub fn can_drop_caches() -> bool {
    sluice_sys::is_root()
}

/// Writes out everything dirty on the file system holding `path` (a trial
/// of `sluice probe` counts the time its data takes to reach the disk).
pub fn sync_file_system(path: &std::path::Path) -> std::io::Result<()> {
    let dir = std::fs::File::open(path)?;
    Ok(sluice_sys::sync_fs(std::os::fd::AsFd::as_fd(&dir))?)
}

/// Writes dirty data out and drops the page cache.
pub fn drop_caches() {
    sluice_sys::drop_caches()
}

/// Where sluice keeps state between runs that belongs to no DST (saved
/// probes, chunk maps of block devices): `$XDG_STATE_HOME/sluice`, by
/// default `~/.local/state/sluice`.
pub fn state_dir() -> std::io::Result<std::path::PathBuf> {
    use std::path::PathBuf;
    let state = match std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        Some(s) => PathBuf::from(s),
        None => std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .ok_or_else(|| std::io::Error::other("no $HOME to keep state in"))?
            .join(".local/state"),
    };
    Ok(state.join("sluice"))
}

/// The most memory this process had resident, in bytes.
pub fn peak_rss() -> u64 {
    sluice_sys::peak_rss()
}
