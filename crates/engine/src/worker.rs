//! One stream of the pool: takes tasks from the queue and runs them.

use crate::error::{Reason, Side};
use crate::gauge::Activity;
use crate::options::CopyOptions;
use crate::plan::{self, Action};
use crate::shard::Shard;
use crate::source::Open;
use crate::state::{DirNode, FileBatch, Listing, Shared, Task, TempName, Worker, BATCH};
use sluice_sys::{FileType, Stat};
use std::ffi::CStr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

impl Worker {
    /// Stream `id` of the job's pool, running tasks as this module does.
    pub fn stream(shared: Arc<Shared>, id: usize) -> Worker {
        Worker::new(shared, id, Worker::run_task)
    }

    /// Runs tasks until the job is complete.
    pub fn run(mut self) {
        loop {
            if self.id >= self.shared.gate.target() {
                self.doing(Activity::Parked);
                // A parked stream gives its buffer back.
                self.scratch.buf = None;
            }
            if !self.shared.gate.wait_turn(self.id) {
                break;
            }
            self.doing(Activity::Idle);
            let Some((lane, task)) = self.shared.queue.pop() else {
                // The job is complete: streams the tuner parked leave too.
                self.shared.gate.close();
                break;
            };
            self.doing(Activity::Walk);
            self.fit_buffer();
            self.run_task(task);
            self.shared.queue.done(lane);
        }
    }

    fn run_task(&mut self, task: Task) {
        let shared = self.shared.clone();
        // Ends when the listing is over (or never starts).
        let listing = matches!(task, Task::List { .. } | Task::Dir { .. })
            .then(|| Listing::begun(&shared.stats));
        let node = task.holds().map(|key| {
            shared
                .ledger
                .dirs
                .get(key)
                .expect("a task's directory is held until the task has run")
        });
        if !shared.stopped() {
            self.run_held(task, node.as_ref(), listing);
        }
        // Dropping a task unrun (a stopped job) releases nothing: nothing
        // is finished on a stopped job, and its table goes at the end.
        if let Some(node) = node {
            node.release();
        }
    }

    /// Runs a task; `node` is the directory it holds, `listing` the walk's
    /// count of it if it lists one.
    fn run_held(&mut self, task: Task, node: Option<&Arc<DirNode>>, listing: Option<Listing>) {
        let node = || node.expect("the task holds a directory");
        match task {
            Task::List { .. } => {
                let node = node();
                // The job's DST root is locked already (exclusively, by this
                // job or the watch that runs it) unless it is a watch pass's
                // subdirectory.
                let lock = !self.shared.opts.sub.is_empty();
                if node.existed
                    && !self.scan_existing(
                        &node.rel,
                        &node.src,
                        node.dst(),
                        node.dst_id,
                        &node.stat,
                        lock,
                    )
                {
                    return;
                }
                self.list(node, listing)
            }
            Task::Dir { name, st, .. } => self.enter_dir(node(), &name, st, listing),
            Task::Files(batch) => {
                let node = node();
                for &(start, st) in &batch.entries {
                    if self.shared.stopped() {
                        break;
                    }
                    let name = batch.name(start);
                    self.copy_entry(node, name, name, &st);
                }
            }
            Task::Chunk { big } => {
                if let Some(big) = self.shared.ledger.bigs.get(big) {
                    self.run_chunks(big)
                }
            }
            Task::Check { big } => {
                if let Some(big) = self.shared.ledger.checks.get(big) {
                    self.run_check_chunks(big)
                }
            }
            Task::Single {
                src_name,
                dst_name,
                st,
                ..
            } => {
                let node = node();
                let opts = &self.shared.opts;
                let action = source_action(node, &st, opts.chunk_size, opts.privileged);
                if !another_parts(opts, node, &dst_name, &st, action) {
                    self.copy_one(node, &src_name, &dst_name, &st)
                }
            }
        }
    }

    /// Copies one non-directory entry the way its kind and size call for.
    pub(crate) fn copy_one(
        &mut self,
        node: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
    ) {
        let opts = &self.shared.opts;
        let st = &source_stat(node, *st);
        match source_action(node, st, opts.chunk_size, opts.privileged) {
            Action::Chunked { chunks } => self.start_big(node, src_name, dst_name, st, chunks),
            Action::Skip(why) => self.skip(node, src_name, why),
            _ => self.copy_entry(node, src_name, dst_name, st),
        }
    }

    /// Counts an entry that cannot be copied (not an error) and tells the
    /// reporter why. Entries left out by `--exclude` are only counted.
    fn skip(&self, node: &DirNode, name: &CStr, why: &'static str) {
        self.shared.stats.skipped.fetch_add(1, Relaxed);
        let path = self.shared.full_path(Side::Src, &node.child_rel(name));
        self.shared.reporter().entry_skipped(&path, why);
    }

    /// Opens a subdirectory, creates its copy in DST, then lists it.
    fn enter_dir(
        &mut self,
        parent: &Arc<DirNode>,
        name: &CStr,
        st: Stat,
        listing: Option<Listing>,
    ) {
        let sh = &self.shared;
        let src = match sh.source.open_dir(&parent.src, name) {
            Ok(fd) => fd,
            Err(sluice_sys::Errno::NOENT) => return vanished(sh, &parent.child_rel(name)),
            Err(e) => {
                return sh.fail(parent.error(name, Side::Src, "open directory", Reason::Os(e)))
            }
        };
        let (dst, existed, hidden) = if sh.opts.dry_run {
            // Only looks: an existing DST directory is opened to compare with.
            match parent
                .dst
                .as_ref()
                .map(|d| sluice_sys::open_dir_at(d.as_fd(), name))
            {
                Some(Ok(fd)) => (Some(fd), true, None),
                _ => (None, false, None),
            }
        } else if sh.checking() {
            let rel = parent.child_rel(name);
            match sluice_sys::open_dir_at(parent.dst(), name) {
                Ok(fd) => {
                    self.check_dir_meta(&rel, &st, fd.as_fd());
                    (Some(fd), true, None)
                }
                Err(sluice_sys::Errno::NOENT) => {
                    return sh.differs(Side::Src, &rel, "missing in DST");
                }
                Err(sluice_sys::Errno::NOTDIR | sluice_sys::Errno::LOOP) => {
                    return sh.differs(Side::Src, &rel, "a directory in SRC, not in DST");
                }
                Err(e) => {
                    return sh.fail(parent.error(name, Side::Dst, "open directory", Reason::Os(e)))
                }
            }
        } else {
            self.doing(Activity::Write);
            match self.make_dir(parent, name) {
                Ok((fd, existed, hidden)) => (Some(fd), existed, hidden),
                Err(err) => return self.shared.fail(err),
            }
        };
        self.doing(Activity::Walk);
        // A shallow job leaves the subdirectories DST has to their own
        // jobs: their metadata is brought up to date, their entries not.
        let descend_existing = !(self.shared.opts.shallow && parent.parent.is_none());
        // One statx of the DST directory serves the leftover check (its
        // identity tags temporaries) and what entries created in it get.
        let dst_st = match dst.as_ref().map(|d| sluice_sys::stat_fd(d.as_fd())) {
            None => None,
            Some(Ok(st)) => Some(st),
            Some(Err(e)) => {
                return self
                    .shared
                    .fail(parent.error(name, Side::Dst, "stat", Reason::Os(e)))
            }
        };
        if let (Some(dst), Some(dst_st)) = (&dst, &dst_st) {
            let rel = parent.child_rel(name);
            let id = dst_st.identity();
            if existed
                && descend_existing
                && !self.scan_existing(&rel, &src, dst.as_fd(), id, &st, true)
            {
                return;
            }
            if !self.shared.writes() {
                // a dry run or a verify: nothing is written
            } else if let Err(err) = self.dir_owner_and_xattrs(
                parent,
                name,
                Open::Dir(&src),
                dst.as_fd(),
                &st,
                existed.then_some(dst_st),
            ) {
                self.shared.fail(err);
            }
        }
        // One an interrupted run began is new to DST's readers too.
        let new = !existed || hidden.is_some();
        if new || self.shared.checking() {
            self.shared.stats.dirs_created.fetch_add(1, Relaxed);
        }
        if new && !self.shared.checking() {
            let rel = || {
                let mut rel = parent.child_rel(name);
                rel.push(b'/');
                rel
            };
            self.shared.changed(rel, "copy", &["new"]);
        }
        let descend = (!self.shared.opts.one_file_system || st.dev == self.shared.root_dev)
            && (descend_existing || !existed);
        let facts = crate::tree::DstFacts::with_stat(dst.as_ref(), dst_st);
        let src_kind = if st.dev == parent.stat.dev {
            parent.src_kind
        } else {
            self.shared.source.kind(&src)
        };
        // Its one hold is this listing's; it holds its parent until done.
        parent.hold();
        let key = self.shared.ledger.dirs.key();
        let node = Arc::new(DirNode {
            key,
            holds: AtomicU32::new(1),
            creates_as: facts.creates_as,
            dst_id: facts.id,
            default_acl: facts.default_acl,
            src_kind,
            src,
            dst,
            existed,
            rel: parent.child_rel(name),
            stat: st,
            owned: self.shared.writes(),
            parent: Some(parent.clone()),
            shared: self.shared.clone(),
            shared_out: std::sync::atomic::AtomicBool::new(false),
            hidden,
        });
        self.shared.ledger.dirs.insert(key, node.clone());
        if descend {
            self.list(&node, listing);
        }
        node.release();
    }

    /// Creates (or finds) a directory in DST and opens it. Returns whether
    /// it existed before, and for a new one the temporary name it is
    /// filled under. A non-directory in the way is replaced, as any
    /// differing entry is; a symlink there is never followed.
    ///
    /// A new directory is made under a temporary name (the same in every
    /// run: an interrupted run's is taken up again, and its entries
    /// compared as in any existing directory) and renamed to its own name
    /// when finished ([`DirNode::release`]). Until then nothing in it has
    /// a final path, so its files are created under their own names, not
    /// unnamed and linked: ext4 then skips a link, the orphan list and a
    /// lookup per file (dense set: 8-10% less time, see design notes 21).
    fn make_dir(
        &self,
        parent: &DirNode,
        name: &CStr,
    ) -> Result<(OwnedFd, bool, Option<TempName>), crate::EntryError> {
        use sluice_sys::Errno;
        let err = |op, e| parent.error(name, Side::Dst, op, Reason::Os(e));
        if self.shared.hide_new_dirs {
            // A directory this run made has nothing under a name yet.
            let found = match parent.existed {
                true => sluice_sys::open_dir_at(parent.dst(), name),
                false => Err(Errno::NOENT),
            };
            match found {
                Ok(fd) => return Ok((fd, true, None)),
                Err(Errno::NOENT) => {
                    let hidden = TempName::hidden(parent.dst_id, name.to_bytes());
                    let existed = match sluice_sys::mkdir_at(parent.dst(), hidden.as_cstr(), 0o700)
                    {
                        Ok(()) => false,
                        Err(Errno::EXIST) => true,
                        Err(e) => return Err(err("mkdir", e)),
                    };
                    let fd = sluice_sys::open_dir_at(parent.dst(), hidden.as_cstr())
                        .map_err(|e| err("open directory", e))?;
                    return Ok((fd, existed, Some(hidden)));
                }
                // Not a directory: replaced below, as without hiding.
                Err(Errno::NOTDIR | Errno::LOOP) => {}
                Err(e) => return Err(err("open directory", e)),
            }
        }
        // Created owner-only, so nobody sees its contents before its real
        // mode is applied when it is finished.
        let existed = match sluice_sys::mkdir_at(parent.dst(), name, 0o700) {
            Ok(()) => false,
            Err(Errno::EXIST) => true,
            Err(e) => return Err(err("mkdir", e)),
        };
        // O_NOFOLLOW|O_DIRECTORY: a symlink or file in the way is never a
        // way out of DST.
        match sluice_sys::open_dir_at(parent.dst(), name) {
            Ok(fd) => Ok((fd, existed, None)),
            Err(Errno::NOTDIR | Errno::LOOP) if existed => {
                sluice_sys::unlink_at(parent.dst(), name).map_err(|e| err("replace", e))?;
                sluice_sys::mkdir_at(parent.dst(), name, 0o700).map_err(|e| err("mkdir", e))?;
                let fd = sluice_sys::open_dir_at(parent.dst(), name)
                    .map_err(|e| err("open directory", e))?;
                Ok((fd, false, None))
            }
            Err(e) => Err(err("open directory", e)),
        }
    }

    /// Lists a directory: subdirectories become tasks, big files become
    /// chunk tasks, everything else is batched.
    fn list(&mut self, node: &Arc<DirNode>, listing: Option<Listing>) {
        let mut stream = self.scratch.stream.take().unwrap_or_default();
        let mut batch = FileBatch::new(node.key);
        let shared = self.shared.clone();
        let opts = &shared.opts;
        let stats = &shared.stats;
        let filter = &opts.filter;
        let is_root = node.parent.is_none();
        // A directory DST did not have: all of it will be read.
        let prefetch = !node.existed && shared.writes();
        let res = shared
            .source
            .list(&node.src, &mut stream, prefetch, &mut |name, is_dir, st| {
                if shared.stopped() {
                    return false;
                }
                if is_root {
                    shared.src_root_entries.fetch_add(1, Relaxed);
                }
                self.doing(Activity::Walk);
                let st = match st {
                    Ok(st) => st,
                    Err(sluice_sys::Errno::NOENT) => {
                        if is_dir {
                            vanished(&shared, &node.child_rel(name));
                        }
                        return true;
                    }
                    Err(e) => {
                        shared.fail(node.error(name, Side::Src, "stat", Reason::Os(e)));
                        return true;
                    }
                };
                let st = source_stat(node, st);
                let action = source_action(node, &st, opts.chunk_size, opts.privileged);
                if !filter.is_empty() {
                    let rel = if filter.needs_path() {
                        opts.filter_path(node.child_rel(name))
                    } else {
                        Vec::new()
                    };
                    if filter.excludes(name.to_bytes(), &rel, action == Action::Dir) {
                        stats.skipped.fetch_add(1, Relaxed);
                        return true;
                    }
                }
                if let Some((lo, hi)) = opts.size_window {
                    // Only regular files in the window are part of the job.
                    let regular = matches!(action, Action::Whole | Action::Chunked { .. });
                    if action != Action::Dir && !(regular && st.size >= lo && st.size < hi) {
                        return true;
                    }
                }
                if shared.sharing.is_none() && another_parts(opts, node, name, &st, action) {
                    return true;
                }
                stats.entries_found.fetch_add(1, Relaxed);
                if !keep_or_hand_over(&shared, node, name, &st, action) {
                    stats.bytes_found.fetch_add(st.size, Relaxed);
                    return true;
                }
                match action {
                    Action::Dir => {
                        Listing::found(stats);
                        node.hold();
                        self.queue_task(Task::Dir {
                            parent: node.key,
                            name: name.to_owned(),
                            st,
                        })
                    }
                    Action::Chunked { chunks } => {
                        let mine = share_of_split(&shared, node, name, &st, chunks);
                        stats.bytes_found.fetch_add(mine, Relaxed);
                        self.start_big(node, name, name, &st, chunks);
                    }
                    Action::Skip(why) => self.skip(node, name, why),
                    Action::Whole | Action::Symlink | Action::Special => {
                        stats.bytes_found.fetch_add(st.size, Relaxed);
                        batch.push(name, st);
                        if batch.entries.len() >= BATCH {
                            let full = std::mem::replace(&mut batch, FileBatch::new(node.key));
                            node.hold();
                            // A directory's files stay on the stream that lists
                            // it: streams creating files in one directory contend
                            // for its lock (measured: half the CPU spent spinning
                            // on it with 2 streams). Only idle streams are handed
                            // a share, as in a single huge directory.
                            if shared.queue.has_idle()
                                || shared.sharing.as_ref().is_some_and(|(g, _)| g.hungry())
                            {
                                self.queue_task(Task::Files(full));
                            } else {
                                self.run_task(Task::Files(full));
                            }
                        }
                    }
                }
                true
            });
        if let Err(e) = res {
            shared.fail(node.self_error(Side::Src, "read directory", Reason::Os(e)));
        }
        // Listed: its entries are counted, whatever is left to copy.
        drop(listing);
        if !batch.entries.is_empty() {
            node.hold();
            self.run_task(Task::Files(batch));
        }
        self.scratch.stream = Some(stream);
    }
}

/// An entry's stat as the rest of the job may take it: on a file system
/// that reports no blocks (FUSE), a file is not taken for a sparse one.
fn source_stat(node: &DirNode, mut st: Stat) -> Stat {
    if node.src_kind == sluice_sys::FsKind::NoBlocks && st.blocks == 0 {
        st.blocks = st.size.div_ceil(512);
    }
    st
}

/// What to do with a source entry: on a file system whose sizes are not
/// what a read returns (`/proc`, `/sys`), a regular file is always read
/// whole, to its end, never split at offsets its size made up.
fn source_action(node: &DirNode, st: &Stat, chunk_size: u64, privileged: bool) -> Action {
    match plan::action(st, chunk_size, privileged) {
        Action::Chunked { .. } if node.src_kind == sluice_sys::FsKind::Synthetic => Action::Whole,
        a => a,
    }
}

/// Whether the entry `name` of `node`, to be handled by `action`, is
/// another part's of a job split over processes (`--shard`): every part
/// takes every directory, and each big file split by chunk of which it
/// owns a chunk.
fn another_parts(
    opts: &CopyOptions,
    node: &DirNode,
    name: &CStr,
    st: &Stat,
    action: Action,
) -> bool {
    let Some(shard) = &opts.shard else {
        return false;
    };
    let chunks = match action {
        Action::Dir => return false,
        Action::Chunked { chunks } => Some(chunks),
        _ => None,
    };
    !shard.takes(Shard::path_hash(&node.rel, name.to_bytes()), st, chunks)
}

/// The bytes of a big file of `chunks` chunks this process copies: all
/// of them, or for a part of a job split by `--shard` (which counts only
/// its own work) those of its chunks. Ranks sharing a job count the file
/// once, where it was listed.
fn share_of_split(shared: &Shared, node: &DirNode, name: &CStr, st: &Stat, chunks: u64) -> u64 {
    match shared.opts.shard {
        Some(part) if shared.sharing.is_none() && Shard::splits(st) => {
            let path = Shard::path_hash(&node.rel, name.to_bytes());
            let chunk_size = shared.opts.chunk_size;
            (0..chunks)
                .filter(|&i| part.owns_chunk(path, i))
                .map(|i| plan::chunk_range(st.size, chunk_size, i).1)
                .sum()
        }
        _ => st.size,
    }
}

/// Whether the entry `name` of `node`, which this part of a job shared
/// out as it goes listed, is this part's to copy (see
/// [`crate::exchange::route`]); one it hands to another part makes the
/// directory one several parts write into.
fn keep_or_hand_over(
    shared: &Shared,
    node: &DirNode,
    name: &CStr,
    st: &Stat,
    action: Action,
) -> bool {
    let route = crate::exchange::route(shared, &node.rel, name.to_bytes(), st, action);
    if route.handed {
        node.shared_out.store(true, Relaxed);
    }
    route.keep
}

/// A source directory listed but gone before it could be read: said, not
/// an error (trees change while they are copied; its DST copy, if any, is
/// not an extra, since its parent's listing saw it).
fn vanished(shared: &Shared, rel: &[u8]) {
    shared.stats.skipped.fetch_add(1, Relaxed);
    let path = shared.full_path(Side::Src, rel);
    shared
        .reporter()
        .notice(&path, "directory vanished during the walk; skipped");
}

/// Copies the entries whose names held directories, now that `--delete`
/// removed them, on the calling thread (a rare path: a big file's chunks
/// run one after another). A directory still there (deletes were skipped
/// or stopped, which was reported) is reported again for this entry.
pub(crate) fn replace(shared: &Arc<Shared>) {
    let replaced = shared.ledger.take_replacements();
    if replaced.is_empty() {
        return;
    }
    let mut worker = Worker::stream(shared.clone(), 0);
    for r in replaced {
        if shared.stopped() {
            return;
        }
        let node = &r.node;
        if sluice_sys::stat_at(node.dst(), &r.dst_name)
            .is_ok_and(|d| d.file_type() == FileType::Directory)
        {
            shared.fail(node.error(
                &r.dst_name,
                Side::Dst,
                "replace",
                Reason::Other("the directory in the way was not deleted".into()),
            ));
        } else {
            worker.copy_one(node, &r.src_name, &r.dst_name, &r.st);
        }
        node.release();
    }
}
