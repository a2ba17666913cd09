//! `--delete`: removing what DST has and SRC does not, after the walk.
//!
//! Extras are only noted while the trees are walked ([`Extras`]); nothing
//! is removed until every stream is done and the job had no error at all,
//! so an unreadable source directory (which looks empty) never causes a
//! deletion. `--max-delete N` stops before the N+1th removal. A dry run
//! lists and counts what would go, and removes nothing.
//!
//! Two more refusals, each a class of data loss other tools have shipped:
//! an SRC root that lists nothing while DST's root has entries deletes
//! nothing (an unmounted share or an expired automount is an empty
//! directory; `--allow-empty-src` overrides), and a directory of DST on
//! another file system (a mount point inside DST) is never entered: it is
//! reported and kept, with the directories above it.

use crate::error::{EntryError, Reason, Side};
use crate::existing::join;
use crate::shard::Shard;
use crate::state::Shared;
use sluice_sys::Errno;
use sluice_walk::DirStream;
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;

/// Why deleting stopped early.
enum Stop {
    /// `--max-delete` reached.
    Limit,
    /// An entry could not be removed (reported); the rest of its directory
    /// is skipped.
    Failed,
}

/// Removes the extras noted during the walk; reaching `--max-delete` is
/// reported as an error (exit 1).
/// `all_clean`: whether the other members of the job's group (MPI ranks)
/// walked without error too; their extras are their own, as the entries
/// they copy are (each part deletes the extras whose path is its).
pub(crate) fn run(shared: &Shared, all_clean: bool) {
    let mut extras = shared.ledger.take_extras();
    // Shared out as it goes, a part found the extras of the directories it
    // listed, which no other part lists; split, every part found them all.
    if let Some(shard) = shared.opts.shard.filter(|_| shared.sharing.is_none()) {
        for group in &mut extras {
            let dir = &group.dir;
            group
                .names
                .retain(|(name, _)| shard.owns_path(Shard::path_hash(dir, name.to_bytes())));
        }
        extras.retain(|g| !g.names.is_empty());
    }
    // A member that had errors itself says so below, as any job does.
    if !all_clean && shared.stats.errors.load(Relaxed) == 0 {
        shared.reporter().entry_failed(
            &shared.error(
                Side::Dst,
                b"",
                "delete",
                Reason::Other(
                    "nothing deleted: another process of this job had errors in its walk or \
                 stopped, so SRC may look emptier than it is"
                        .into(),
                ),
            ),
        );
        shared.stats.errors.fetch_add(1, Relaxed);
        return;
    }
    // Across a group, --max-delete is the job's: each member may delete
    // its share of it, handed out in rank order by what each would delete
    // (every member asks, all being clean: the others wait for its count).
    let limit = match (shared.opts.max_delete, &shared.opts.group) {
        (Some(max), Some(group)) if all_clean => {
            let mine = Deleter::new(shared, true).count(&extras);
            Some(shared.stats.deleted.load(Relaxed) + group.delete_budget(mine, max))
        }
        (max, _) => max,
    };
    if extras.is_empty() {
        return;
    }
    let errors = shared.stats.errors.load(Relaxed);
    if errors > 0 {
        shared.reporter().entry_failed(&shared.error(
            Side::Dst,
            b"",
            "delete",
            Reason::Other(format!(
                "nothing deleted: the walk had {errors} {}, so SRC may look emptier than it is",
                if errors == 1 { "error" } else { "errors" }
            )),
        ));
        return;
    }
    let Some(root) = shared.dst_root_fd.as_ref() else {
        return; // a dry run into a DST that does not exist yet
    };
    let src_empty = shared.src_root_entries.load(Relaxed) == 0;
    let dst_has = shared.dst_root_entries.load(Relaxed);
    if src_empty && dst_has > 0 && shared.opts.sub.is_empty() && !shared.opts.allow_empty_src {
        shared.fail(shared.error(
            Side::Src,
            b"",
            "delete",
            Reason::Other(format!(
                "SRC is empty but DST has {dst_has} entries: nothing deleted (an unmounted \
                 share or an expired automount looks like this); if SRC is meant to be \
                 empty, run again with --allow-empty-src"
            )),
        ));
        return;
    }
    let mut deleter = Deleter::new(shared, false);
    deleter.limit = limit;
    if let Err(Stop::Limit) = deleter.sweep(root.as_fd(), &extras) {
        let max = shared.opts.max_delete.unwrap_or(0);
        shared.fail(shared.error(
            Side::Dst,
            b"",
            "delete",
            Reason::Other(format!(
                "--max-delete {max} reached; stopped before deleting more"
            )),
        ));
    }
}

/// Removes, once every part of a split job is done and clean, the
/// temporaries of earlier runs its walk saw (each part those whose path
/// is its), and with part 0 the journals of earlier runs split another
/// way: all they describe is committed now, or a leftover removed here.
pub(crate) fn leftovers(shared: &Shared) {
    let (Some(root), Some(shard)) = (shared.dst_root_fd.as_ref(), &shared.opts.shard) else {
        return;
    };
    for group in shared.ledger.take_leftovers() {
        let Ok(dir) = crate::target::open_beneath(root.as_fd(), &group.dir) else {
            continue;
        };
        let mut removed = false;
        for (name, _) in &group.names {
            if shared.sharing.is_some()
                || shard.owns_path(Shard::path_hash(&group.dir, name.to_bytes()))
            {
                removed |= sluice_sys::unlink_at(dir.as_fd(), name).is_ok();
            }
        }
        if removed {
            let _ = sluice_sys::set_times(dir.as_fd(), &group.src_stat);
        }
    }
    if shard.index != 0 || !shared.owns_root {
        return;
    }
    // A descriptor of its own: the root's was read to its end already.
    let Ok(root) = crate::target::open_beneath(root.as_fd(), b"") else {
        return;
    };
    let mut stale = Vec::new();
    let mut stream = DirStream::default();
    let _ = stream.for_each(root.as_fd(), |e| {
        if crate::journal::is_other_split(e.name.to_bytes(), shard.count) {
            stale.push(e.name.to_owned());
        }
        true
    });
    for name in &stale {
        let _ = sluice_sys::unlink_at(root.as_fd(), name);
    }
    if !stale.is_empty() {
        let _ = sluice_sys::set_times(root.as_fd(), &shared.root_stat);
    }
}

struct Deleter<'a> {
    shared: &'a Shared,
    stream: DirStream,
    /// Stop before `deleted` passes this (`--max-delete`, or this member's
    /// share of it).
    limit: Option<u64>,
    /// Only count what would go: nothing is removed or reported.
    counting: bool,
    counted: u64,
}

impl<'a> Deleter<'a> {
    fn new(shared: &'a Shared, counting: bool) -> Deleter<'a> {
        Deleter {
            shared,
            stream: DirStream::default(),
            limit: None,
            counting,
            counted: 0,
        }
    }

    /// How many entries removing `extras` would remove (none of a mount
    /// point's, which is kept).
    fn count(mut self, extras: &[crate::state::Extras]) -> u64 {
        let Some(root) = self.shared.dst_root_fd.as_ref() else {
            return 0;
        };
        let _ = self.sweep(root.as_fd(), extras);
        self.counted
    }

    /// Removes (or counts) every extra, directory by directory; in a
    /// directory, a failure stops its removals, `--max-delete` all.
    fn sweep(&mut self, root: BorrowedFd<'_>, extras: &[crate::state::Extras]) -> Result<(), Stop> {
        for group in extras {
            if self.shared.stopped() {
                return Ok(());
            }
            let opened = crate::target::open_beneath(root, &group.dir)
                .map_err(|e| self.fail(&group.dir, "open directory", e))
                .and_then(|dir| match sluice_sys::stat_fd(dir.as_fd()) {
                    Ok(st) => Ok((dir, st.dev)),
                    Err(e) => Err(self.fail(&group.dir, "stat", e)),
                });
            let Ok((dir, dev)) = opened else {
                continue;
            };
            let mut outcome = Ok(true);
            for (name, is_dir) in &group.names {
                let rel = join(&group.dir, name.to_bytes());
                outcome = self.remove(dir.as_fd(), dev, name, *is_dir, &rel);
                if outcome.is_err() && !self.counting {
                    break;
                }
            }
            if self.shared.deletes_for_real && !self.counting {
                // Removing entries changed the directory's times; put SRC's back.
                let _ = sluice_sys::set_times(dir.as_fd(), &group.src_stat);
                if self.shared.opts.fsync {
                    let _ = sluice_sys::sync(dir.as_fd());
                }
            }
            if let Err(Stop::Limit) = outcome {
                return Err(Stop::Limit);
            }
        }
        Ok(())
    }

    /// Takes one deletion from the `--max-delete` budget.
    fn take_one(&self) -> Result<(), Stop> {
        let done = self.shared.stats.deleted.load(Relaxed);
        match self.limit {
            Some(max) if done >= max => Err(Stop::Limit),
            _ => Ok(()),
        }
    }

    /// Reports a failure (counting, only says so: deleting reports it).
    fn fail(&self, rel: &[u8], op: &'static str, e: Errno) -> Stop {
        if !self.counting {
            let err: EntryError = self.shared.error(Side::Dst, rel, op, Reason::Os(e));
            self.shared.fail(err);
        }
        Stop::Failed
    }

    /// Removes `name` (a whole tree if it is a directory), never following
    /// a symlink (directories are opened with `O_NOFOLLOW`) and never
    /// entering another file system (`dev` is that of `dir`). `Ok(false)`:
    /// kept, because a mount point is inside (reported).
    fn remove(
        &mut self,
        dir: BorrowedFd<'_>,
        dev: (u32, u32),
        name: &CStr,
        is_dir: bool,
        rel: &[u8],
    ) -> Result<bool, Stop> {
        if is_dir {
            let fd = match sluice_sys::open_dir_at(dir, name) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Ok(true),
                Err(e) => return Err(self.fail(rel, "open directory", e)),
            };
            if crate::target::is_mount_point(fd.as_fd(), dev) {
                if self.counting {
                    return Ok(false);
                }
                self.shared.fail(
                    self.shared.error(
                        Side::Dst,
                        rel,
                        "delete",
                        Reason::Other(
                            "a mount point of another file system: not deleted, nor anything in it"
                                .into(),
                        ),
                    ),
                );
                return Ok(false);
            }
            if !self.empty(fd, dev, rel)? {
                return Ok(false);
            }
        }
        if self.counting {
            self.counted += 1;
            return Ok(true);
        }
        self.take_one()?;
        let res = if !self.shared.deletes_for_real {
            Ok(()) // counted and listed, not removed
        } else if is_dir {
            sluice_sys::rmdir_at(dir, name)
        } else {
            sluice_sys::unlink_at(dir, name)
        };
        match res {
            Ok(()) => {
                self.shared.stats.deleted.fetch_add(1, Relaxed);
                self.shared
                    .reporter()
                    .entry_deleted(&self.shared.full_path(Side::Dst, rel));
                Ok(true)
            }
            Err(Errno::NOENT) => Ok(true),
            Err(e) => Err(self.fail(rel, "delete", e)),
        }
    }

    /// Removes everything inside an open directory, depth first; false if
    /// something was kept (a mount point below).
    fn empty(&mut self, fd: OwnedFd, dev: (u32, u32), rel: &[u8]) -> Result<bool, Stop> {
        let mut names = Vec::new();
        let listed = self.stream.for_each(fd.as_fd(), |e| {
            names.push(e.name.to_owned());
            true
        });
        if let Err(e) = listed {
            return Err(self.fail(rel, "list", e));
        }
        let mut all = true;
        for name in names {
            let is_dir = crate::target::is_dir_at(fd.as_fd(), &name);
            let child = join(rel, name.to_bytes());
            all &= self.remove(fd.as_fd(), dev, &name, is_dir, &child)?;
        }
        Ok(all)
    }
}
