//! Work that crosses between the processes of one job that share it out
//! as it goes (MPI ranks; see [`crate::options::Group`]).
//!
//! Part 0 lists the root; every other part starts with nothing. A part
//! that runs out of work asks another, which lends half of what waits in
//! its queue: subdirectories not yet entered (the oldest, with the most
//! below them), or else batches of a big directory's files. So each
//! directory is listed by exactly one part, which copies its files,
//! notes its extras for `--delete` and sets its metadata. A directory
//! that more than one part writes into (the lister, and the part it lent
//! a subdirectory or files of it to, or handed a file in it) waits: every
//! part that wrote into it sets its mode and times once every part is
//! done (`tree::finish_unfinished`), so a part never finds a directory
//! made read-only under it, and no write comes after the times are set.
//!
//! Two kinds of entry go to a part decided by the entry, not by who listed
//! it: a file with more than one name goes to the part its inode hashes
//! to (so one part sees every name of it and links them), and a big file
//! to every part that owns some of its chunks (the `--shard` split by
//! chunk, see [`crate::parts`]). The lister hands those over as
//! [`Item::Owned`].
//!
//! Keys are a process's own; what crosses names directories by their
//! path relative to the roots, and the part that takes it opens them
//! beneath its held roots, one component at a time, as `delete` does.

use crate::error::{Reason, Side};
use crate::plan::Action;
use crate::shard::Shard;
use crate::state::{DirNode, FileBatch, Listing, Shared, Task};
use sluice_sys::Stat;
use std::ffi::CString;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

pub use crate::options::{Desk, Item};

/// Where an entry goes when a job is shared out as it goes.
pub(crate) struct Route {
    /// This part copies it (or its share of chunks).
    pub keep: bool,
    /// It was handed to another part, which writes into its directory.
    pub handed: bool,
}

/// Sends the entry `name` of directory `dir` (relative to the roots), to
/// be handled by `action`, to the parts whose it is, and says whether it
/// is this part's too: a file with more than one name is the part's its
/// inode hashes to, a big file every part's with chunks of it (except in
/// `verify`, whose check is not split by chunk: the lister compares it
/// whole); everything else is its lister's. Without sharing, every entry
/// is kept.
pub(crate) fn route(shared: &Shared, dir: &[u8], name: &[u8], st: &Stat, action: Action) -> Route {
    let here = Route {
        keep: true,
        handed: false,
    };
    let Some((group, part)) = &shared.sharing else {
        return here;
    };
    let owners = match action {
        Action::Chunked { .. } if shared.checking() => return here,
        Action::Chunked { chunks } if Shard::splits(st) => {
            part.owners(Shard::path_hash(dir, name), chunks)
        }
        Action::Whole | Action::Chunked { .. } if !Shard::splits(st) => {
            vec![part.owner(Shard::path_hash(dir, name), st)]
        }
        _ => return here,
    };
    let mut handed = false;
    for &to in owners.iter().filter(|&&p| p != part.index) {
        let entries = vec![(name.to_vec(), *st)];
        let dir = dir.to_vec();
        group.send(to, vec![Item::Owned { dir, entries }]);
        handed = true;
    }
    Route {
        keep: owners.contains(&part.index),
        handed,
    }
}

/// The job's desk: its queue and tables, and the roots to open what it
/// takes beneath.
pub(crate) struct JobDesk {
    pub(crate) shared: Arc<Shared>,
    pub(crate) root: Arc<DirNode>,
}

impl Desk for JobDesk {
    fn idle(&self) -> bool {
        self.shared.queue.held_idle()
    }

    fn lend(&self) -> Vec<Item> {
        let sh = &self.shared;
        if sh.stopped() {
            return Vec::new();
        }
        let mut items = Vec::new();
        let lendable = |t: &Task| matches!(t, Task::Dir { .. } | Task::Files(_));
        for task in sh.queue.lend(lendable) {
            let Some(key) = task.holds() else { continue };
            let node = sh.ledger.dirs.get(key).expect("a task's directory is held");
            match task {
                Task::Dir { name, st, .. } => {
                    // Its listing is the taker's to count now.
                    drop(Listing::begun(&sh.stats));
                    items.push(Item::Dir {
                        dir: node.rel.clone(),
                        name: name.into_bytes(),
                        st,
                    });
                }
                Task::Files(batch) => items.push(Item::Files {
                    dir: node.rel.clone(),
                    entries: batch
                        .entries
                        .iter()
                        .map(|&(start, st)| (batch.name(start).to_bytes().to_vec(), st))
                        .collect(),
                }),
                other => unreachable!("only directories and batches are lent: {other:?}"),
            }
            // The taker writes into it: finished at the end of the job.
            node.shared_out.store(true, Relaxed);
            node.release();
        }
        items
    }

    fn take(&self, items: Vec<Item>) {
        let sh = &self.shared;
        for mut item in items {
            if sh.stopped() {
                return;
            }
            if let Item::Files { dir, entries } = &mut item {
                self.pass_on_linked(dir, entries);
                if entries.is_empty() {
                    continue;
                }
            }
            let (dir, tasks) = match &item {
                Item::Dir { dir, .. } | Item::Files { dir, .. } => (dir, 1),
                Item::Owned { dir, entries } => (dir, entries.len()),
            };
            let node = match self.adopt(dir, tasks as u32) {
                Ok(node) => node,
                Err(err) => {
                    sh.fail(err);
                    continue;
                }
            };
            let name = |n: Vec<u8>| CString::new(n).expect("a listed name has no NUL");
            let queue = |task: Task| sh.queue.push_over(task.lane(), task);
            match item {
                Item::Dir { name: n, st, .. } => {
                    Listing::found(&sh.stats);
                    queue(Task::Dir {
                        parent: node.key,
                        name: name(n),
                        st,
                    });
                }
                Item::Files { entries, .. } => {
                    let mut batch = FileBatch::new(node.key);
                    for (n, st) in entries {
                        batch.push(&name(n), st);
                    }
                    queue(Task::Files(batch));
                }
                Item::Owned { entries, .. } => {
                    for (n, st) in entries {
                        let n = name(n);
                        queue(Task::Single {
                            dir: node.key,
                            src_name: n.clone(),
                            dst_name: n,
                            st,
                        });
                    }
                }
            }
        }
    }

    fn close(&self) {
        self.shared.queue.unhold();
    }
}

impl JobDesk {
    /// Hands the files among `entries` (a batch another part lent) that
    /// are not this part's to their owners ([`route`]): a lender keeps the
    /// hard-linked files it owns in its batches, and only their owner may
    /// copy and link them.
    fn pass_on_linked(&self, dir: &[u8], entries: &mut Vec<(Vec<u8>, Stat)>) {
        // A batch holds what is copied whole (big files never are in one).
        entries.retain(|(name, st)| route(&self.shared, dir, name, st, Action::Whole).keep);
    }

    /// Opens the directory `rel` on both sides, beneath the roots, as a
    /// directory of this part's with `holds` tasks to come: it existed (its
    /// lister made it), and its metadata is set again once they are done.
    fn adopt(&self, rel: &[u8], holds: u32) -> Result<Arc<DirNode>, crate::EntryError> {
        let sh = &self.shared;
        let fail = |side, op, e| sh.error(side, rel, op, Reason::Os(e));
        let mut src = None;
        for part in rel.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
            let name = CString::new(part)
                .map_err(|_| fail(Side::Src, "open directory", sluice_sys::Errno::INVAL))?;
            let from = src.as_ref().unwrap_or(&self.root.src);
            src = Some(
                sh.source
                    .open_dir(from, &name)
                    .map_err(|e| fail(Side::Src, "open directory", e))?,
            );
        }
        let src = match src {
            Some(s) => s,
            // The root again, a descriptor of its own (the root's is
            // another stream's to read).
            None => match self.root.src.fd() {
                Some(fd) => sluice_sys::open_dir_beneath(fd, b"").map(crate::source::SrcDir::local),
                None => sh.source.open_dir(&self.root.src, c"."),
            }
            .map_err(|e| fail(Side::Src, "open directory", e))?,
        };
        let stat = sh
            .source
            .stat_dir(&src)
            .map_err(|e| fail(Side::Src, "stat", e))?;
        let dst = match &sh.dst_root_fd {
            None => None,
            Some(root) => match crate::target::open_beneath(root.as_fd(), rel) {
                Ok(fd) => Some(fd),
                // A dry run's directory that would have been created.
                Err(_) if sh.opts.dry_run => None,
                Err(e) => return Err(fail(Side::Dst, "open directory", e)),
            },
        };
        let facts = crate::tree::DstFacts::of(dst.as_ref());
        let key = sh.ledger.dirs.key();
        let node = Arc::new(DirNode {
            key,
            holds: AtomicU32::new(holds),
            creates_as: facts.creates_as,
            dst_id: facts.id,
            default_acl: facts.default_acl,
            src_kind: sh.source.kind(&src),
            src,
            existed: dst.is_some(),
            dst,
            rel: rel.to_vec(),
            stat,
            owned: sh.writes() && (!rel.is_empty() || sh.owns_root),
            parent: None,
            shared: sh.clone(),
            shared_out: std::sync::atomic::AtomicBool::new(true),
            hidden: None,
        });
        sh.ledger.dirs.insert(key, node.clone());
        Ok(node)
    }
}
