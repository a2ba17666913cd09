//! What a stream does when DST already has a directory: find the entries
//! that are up to date (and leave them untouched, so a re-run writes
//! nothing and changes no ctime), remove temporaries an interrupted run
//! left, and note the entries SRC no longer has for `--delete`.
//!
//! Only directories that existed before this run are checked; a directory
//! this run created costs nothing extra, so a first copy pays nothing for
//! resume.

use crate::compare;
use crate::error::{Reason, Side};
use crate::meta::link_key;
use crate::plan::{self, Existing};
use crate::source::{Open, SrcDir};
use crate::state::{DirNode, Extras, Replacement, Worker};
use sluice_sys::{Errno, FileType, Stat};
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl Worker {
    /// Checks `dst_name` in an existing DST directory against the source
    /// entry `st`. Returns true when the entry needs no copy: it is up to
    /// date (metadata fixed in place if needed), or it cannot be replaced
    /// and that was reported.
    pub(crate) fn up_to_date(
        &mut self,
        node: &Arc<DirNode>,
        src_name: &CStr,
        dst_name: &CStr,
        st: &Stat,
    ) -> bool {
        let sh = self.shared.clone();
        self.why.clear();
        let dst = match sluice_sys::stat_at(node.dst(), dst_name) {
            Ok(d) => d,
            Err(Errno::NOENT) => {
                self.why.push("new");
                return false;
            }
            Err(e) => {
                sh.fail(node.error(dst_name, Side::Dst, "stat", Reason::Os(e)));
                return true;
            }
        };
        // In a new directory an interrupted run was filling, a file may be
        // cut short under its final name: only size and time both right
        // (times are set last) say it is complete, whatever the options.
        let rules = match node.hidden {
            Some(_) => sh.opts.rules().exact(),
            None => sh.opts.rules(),
        };
        let closer = match plan::existing(st, &dst, &rules) {
            Existing::Keep => {
                sh.stats.unchanged.fetch_add(1, Relaxed);
                return true;
            }
            Existing::Replace(why) => {
                self.why = why;
                return false;
            }
            Existing::AfterDelete => {
                // The tree goes with the other extras after a clean walk;
                // the entry is copied after that (a dry run counts it now).
                sh.ledger.found_extras(Extras {
                    dir: node.rel.clone(),
                    src_stat: node.stat,
                    names: vec![(dst_name.to_owned(), true)],
                });
                if sh.opts.dry_run {
                    return false;
                }
                sh.ledger.replace_later(Replacement {
                    node: node.clone(),
                    src_name: src_name.to_owned(),
                    dst_name: dst_name.to_owned(),
                    st: *st,
                });
                return true;
            }
            Existing::Blocked => {
                sh.fail(node.error(
                    dst_name,
                    Side::Dst,
                    "replace",
                    Reason::Other("a directory is in the way (sync --delete replaces it)".into()),
                ));
                return true;
            }
            Existing::Looks(closer) => closer,
        };
        let differs = if closer.content && !self.same_content(node, src_name, dst_name) {
            Some("content")
        } else if closer.links && !self.links_intact(node, dst_name, st, &dst) {
            Some("hard links")
        } else if closer.xattrs && !self.same_xattrs(node, src_name, dst_name) {
            Some("xattrs")
        } else if closer.target && !self.same_target(node, src_name, dst_name) {
            Some("target")
        } else {
            None
        };
        if let Some(why) = differs {
            self.why.push(why);
            return false;
        }
        let (mask, owners) = (sh.opts.cmp_mask(), sh.opts.preserve_owner);
        let differences = || compare::differences(st, &dst, mask, owners);
        if closer.fix_meta {
            if !sh.opts.dry_run {
                if let Err(e) = self.fix_meta(node, dst_name, st) {
                    // Not fixable in place (say, a file DST cannot open): copy it.
                    if e == Errno::ACCESS || st.file_type() != FileType::RegularFile {
                        self.why = differences();
                        return false;
                    }
                    sh.fail(node.error(dst_name, Side::Dst, "set metadata", Reason::Os(e)));
                    return true;
                }
            }
            if sh.opts.verbose {
                let why = differences();
                sh.changed(|| node.child_rel(dst_name), "update metadata", &why);
            }
        }
        sh.stats.unchanged.fetch_add(1, Relaxed);
        true
    }

    /// Sets mode and owner of an up-to-date entry without rewriting it,
    /// through a descriptor opened without following links.
    fn fix_meta(&self, node: &DirNode, dst_name: &CStr, st: &Stat) -> Result<(), Errno> {
        let owners = self.shared.opts.preserve_owner;
        if st.file_type() == FileType::Symlink {
            return if owners {
                sluice_sys::set_owner_at(node.dst(), dst_name, st)
            } else {
                Ok(())
            };
        }
        if st.file_type() != FileType::RegularFile {
            return Err(Errno::OPNOTSUPP); // specials are cheaper to recreate
        }
        let fd = sluice_sys::open_read_at(node.dst(), dst_name)?;
        // Swapped for something else since it was compared: copy it.
        if sluice_sys::stat_fd(fd.as_fd())?.file_type() != FileType::RegularFile {
            return Err(Errno::ACCESS);
        }
        if owners {
            sluice_sys::set_owner(fd.as_fd(), st)?;
        }
        if !self.shared.opts.perms {
            return Ok(()); // --no-perms: DST's mode stays
        }
        sluice_sys::set_perm(fd.as_fd(), self.shared.mode_for(st))
    }

    /// Whether a file's extended attributes (and ACLs) match DST's. Asked
    /// only when SRC's inode changed after DST's (its ctime is later): a
    /// copy sets DST's times after writing, so an untouched pair never
    /// pays for the two listings, while `setfattr` or `setfacl` on SRC,
    /// which change nothing but the ctime, are seen.
    fn same_xattrs(&self, node: &DirNode, src_name: &CStr, dst_name: &CStr) -> bool {
        let (Ok(s), Ok(d)) = (
            self.shared.source.open(&node.src, src_name),
            sluice_sys::open_read_at(node.dst(), dst_name),
        ) else {
            return false;
        };
        let set = self.shared.opts.xattrs.unwrap_or(sluice_sys::XattrSet::All);
        crate::source::xattrs_match(&*self.shared.source, Open::File(&s), d.as_fd(), set)
    }

    /// Whether a hard-linked source file's name in DST is linked like in
    /// SRC: the first name seen stands for the group, later names must be
    /// the same DST inode.
    fn links_intact(&self, node: &DirNode, dst_name: &CStr, st: &Stat, dst: &Stat) -> bool {
        let Some(key) = link_key(st) else {
            return true;
        };
        (self.shared.ledger).link_intact(key, || node.child_rel(dst_name), dst.ino)
    }

    /// Whether a symlink in DST points where the source's does.
    fn same_target(&mut self, node: &DirNode, src_name: &CStr, dst_name: &CStr) -> bool {
        let reuse = std::mem::take(&mut self.scratch.link);
        let Ok(src) = self.shared.source.read_link(&node.src, src_name, reuse) else {
            return false;
        };
        let same =
            sluice_sys::readlink_at(node.dst(), dst_name, Vec::new()).is_ok_and(|dst| dst == src);
        self.scratch.link = src.into_bytes();
        same
    }

    /// `--checksum`: compares the two files byte for byte. Both are local,
    /// so comparing the bytes is cheaper than hashing them.
    fn same_content(&mut self, node: &DirNode, src_name: &CStr, dst_name: &CStr) -> bool {
        let (Ok(src), Ok(dst)) = (
            self.shared.source.open(&node.src, src_name),
            sluice_sys::open_read_at(node.dst(), dst_name),
        ) else {
            return false;
        };
        let source = &self.shared.source;
        let buf = self.scratch.buf();
        let (a, b) = buf.split_at_mut(buf.len() / 2);
        let mut off = 0u64;
        loop {
            let n = match source.read_at(&src, a, off) {
                Ok(n) => n,
                Err(_) => return false,
            };
            let m = match sluice_sys::read_full_at(dst.as_fd(), &mut b[..n.max(1)], off) {
                Ok(m) => m,
                Err(_) => return false,
            };
            if n != m || a[..n] != b[..n] {
                return false;
            }
            if n < a.len() {
                return true;
            }
            off += n as u64;
        }
    }

    /// Owner, extended attributes and ACLs of a directory in DST. One that
    /// existed (`existing`: its stat, as the caller read it) is only
    /// touched where it differs, so a re-run changes no ctime.
    pub(crate) fn dir_owner_and_xattrs(
        &mut self,
        parent: &DirNode,
        name: &CStr,
        src: Open<'_>,
        dst: BorrowedFd<'_>,
        st: &Stat,
        existing: Option<&Stat>,
    ) -> Result<(), crate::EntryError> {
        let Some(now) = existing else {
            return self.copy_owner_and_xattrs(parent, name, src, dst, st);
        };
        let err = |op, e| parent.error(name, Side::Dst, op, Reason::Os(e));
        if self.shared.opts.preserve_owner && (now.uid, now.gid) != (st.uid, st.gid) {
            sluice_sys::set_owner(dst, st).map_err(|e| err("chown", e))?;
        }
        let Some(set) = self.shared.opts.xattrs else {
            return Ok(());
        };
        let source = &*self.shared.source;
        if !crate::source::xattrs_match(source, src, dst, set) {
            let s = &mut self.scratch;
            let (names, value) = (&mut s.xattr_names, &mut s.xattr_value);
            crate::source::copy_xattrs(source, src, dst, set, names, value)
                .map_err(|(e, _)| err("copy extended attributes", e))?;
        }
        Ok(())
    }

    /// Lists a DST directory that existed before this run: removes
    /// temporaries an interrupted run left in it (only those whose tag
    /// proves sluice made them in this very directory, and not those a
    /// resumable journal record owns; each removal is reported) and, with
    /// `--delete`, notes entries SRC does not have; for `verify`, reports
    /// those as differences and removes nothing. Costs one listing per
    /// pre-existing directory, none on a first copy.
    ///
    /// `dst_id` is the DST directory's identity ([`crate::tree::dir_id`]).
    /// With `lock`, the directory is first marked as this run's (a shared
    /// `flock`); if another run holds it as its DST, nothing in it is
    /// touched and false is returned: the caller leaves the subtree alone.
    pub(crate) fn scan_existing(
        &mut self,
        rel: &[u8],
        src: &SrcDir,
        dst: BorrowedFd<'_>,
        dst_id: (u32, u32, u64),
        src_stat: &Stat,
        lock: bool,
    ) -> bool {
        let sh = self.shared.clone();
        let fail = |op, reason| sh.fail(sh.error(Side::Dst, rel, op, reason));
        if lock && sh.writes() && !crate::target::enter(dst) {
            fail(
                "enter",
                Reason::Other("another sluice run is writing to this directory; left alone".into()),
            );
            return false;
        }
        // With -x, entries of a DST directory on another file system than
        // DST's root are never extras (as rsync -x does).
        let other_fs =
            sh.opts.one_file_system && sh.dst_root_dev.is_some_and(|d| d != (dst_id.0, dst_id.1));
        let mut stream = self.scratch.stream.take().unwrap_or_default();
        let mut stale = Vec::new();
        let mut extras = Vec::new();
        let mut later = Vec::new();
        let at_root = rel.is_empty();
        let mut listed = 0u64;
        let res = stream.for_each(dst, |entry| {
            let name = entry.name;
            if sluice_sys::is_own_temp(name.to_bytes(), dst_id) {
                if sluice_sys::is_hidden_dir_name(name.to_bytes()) {
                    // A new directory an interrupted run was filling: its
                    // SRC directory takes it up, or it goes when this one
                    // is finished.
                    if sh.writes() && sh.hide_new_dirs {
                        sh.ledger.found_hidden(rel, name.to_owned());
                    }
                    return true;
                }
                // A part of a split job (`--shard`) cannot tell another
                // part's temporary in use from a leftover: it leaves them
                // all, or under MPI removes them once every rank is done
                // (`delete::leftovers`).
                if sh.writes() && !sh.journal_owns(rel, name) {
                    if sh.opts.shard.is_none() {
                        stale.push(name.to_owned());
                    } else if sh.opts.group.is_some() {
                        later.push((name.to_owned(), false));
                    }
                }
                return true;
            }
            if at_root && crate::journal::is_journal_name(name.to_bytes()) {
                return true;
            }
            listed += 1;
            let wants_extras = (sh.opts.delete && !other_fs) || sh.checking();
            if !wants_extras {
                return true;
            }
            if sh.source.has(src, name) != Ok(false) {
                return true; // in SRC, or unknown: never delete on doubt
            }
            let is_dir = crate::target::is_dir_at(dst, name);
            let filter = &sh.opts.filter;
            if !filter.is_empty() {
                let path = if filter.needs_path() {
                    sh.opts.filter_path(join(rel, name.to_bytes()))
                } else {
                    Vec::new()
                };
                // Excluded entries are not part of the job: kept.
                if filter.excludes(name.to_bytes(), &path, is_dir) {
                    return true;
                }
            }
            extras.push((name.to_owned(), is_dir));
            true
        });
        self.scratch.stream = Some(stream);
        if !later.is_empty() {
            sh.ledger.found_leftovers(Extras {
                dir: rel.to_vec(),
                src_stat: *src_stat,
                names: later,
            });
        }
        if let Err(e) = res {
            fail("list", Reason::Os(e));
            return true;
        }
        if at_root {
            sh.dst_root_entries.store(listed, Relaxed);
        }
        for name in stale {
            match sluice_sys::unlink_at(dst, &name) {
                Ok(()) => sh.reporter().notice(
                    &sh.full_path(Side::Dst, &join(rel, name.to_bytes())),
                    "removed a temporary an interrupted sluice run left",
                ),
                Err(Errno::NOENT) => {}
                Err(e) => fail("remove leftover temporary", Reason::Os(e)),
            }
        }
        if sh.checking() {
            for (name, _) in extras {
                sh.differs(Side::Dst, &join(rel, name.to_bytes()), "only in DST");
            }
        } else if !extras.is_empty() {
            sh.ledger.found_extras(Extras {
                dir: rel.to_vec(),
                src_stat: *src_stat,
                names: extras,
            });
        }
        true
    }
}

/// `dir/name`, or `name` at the root.
pub(crate) fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(dir.len() + 1 + name.len());
    p.extend_from_slice(dir);
    if !p.is_empty() {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}
