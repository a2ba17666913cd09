//! Metadata that goes with an entry's data: owner, extended attributes and
//! ACLs (in that order, since chown drops `security.capability`), and the
//! key that tells a hard-linked file's names apart.

use crate::error::{EntryError, Reason, Side};
use crate::source::Open;
use crate::state::{DirNode, Worker};
use sluice_sys::{FileType, Stat};
use std::ffi::CStr;
use std::os::fd::BorrowedFd;

/// The default ACL a directory hands down to what is created in it.
pub(crate) const ACL_DEFAULT: &CStr = c"system.posix_acl_default";
/// The access ACL an entry may inherit from its directory's default ACL.
pub(crate) const ACL_ACCESS: &CStr = c"system.posix_acl_access";

/// A hard-linked file's identity in SRC: device and inode.
pub(crate) type LinkKey = (u32, u32, u64);

pub(crate) fn link_key(st: &Stat) -> Option<LinkKey> {
    (st.nlink > 1 && st.file_type() == FileType::RegularFile).then(|| st.identity())
}

impl Worker {
    /// Owner (as root) then extended attributes and ACLs: in that order
    /// because chown drops `security.capability`.
    pub(crate) fn copy_owner_and_xattrs(
        &mut self,
        node: &DirNode,
        name: &CStr,
        src: Open<'_>,
        dst: BorrowedFd<'_>,
        st: &Stat,
    ) -> Result<(), EntryError> {
        if self.shared.opts.preserve_owner && !node.creates_owned_by(st) {
            sluice_sys::set_owner(dst, st)
                .map_err(|e| node.error(name, Side::Dst, "chown", Reason::Os(e)))?;
        }
        let Some(set) = self.shared.opts.xattrs else {
            return Ok(()); // --no-xattrs: what DST gives a new entry stays
        };
        let (s, source) = (&mut self.scratch, &*self.shared.source);
        let (names, value) = (&mut s.xattr_names, &mut s.xattr_value);
        crate::source::copy_xattrs(source, src, dst, set, names, value).map_err(|(e, what)| {
            node.error(
                name,
                Side::Dst,
                "copy extended attributes",
                Reason::Other(format!("{what}: {}", Reason::Os(e))),
            )
        })?;
        if self.drops_inherited_acls(node) {
            self.drop_inherited_acls(node, name, src, dst, st)?;
        }
        Ok(())
    }

    /// Whether what is created in `node` loses the ACLs its DST directory's
    /// default ACL hands down. Not with `--no-acls`, `--no-xattrs` or
    /// `--no-perms`: then what DST gives a new entry stays.
    pub(crate) fn drops_inherited_acls(&self, node: &DirNode) -> bool {
        let opts = &self.shared.opts;
        node.default_acl && opts.xattrs == Some(sluice_sys::XattrSet::All) && opts.perms
    }

    /// An entry created in a DST directory with a default ACL inherited an
    /// access ACL (and a directory, the default ACL too) and a mode masked
    /// by it: what SRC's entry does not have is removed and the mode set
    /// exactly, so DST ends with SRC's ACLs and nothing else.
    fn drop_inherited_acls(
        &self,
        node: &DirNode,
        name: &CStr,
        src: Open<'_>,
        dst: BorrowedFd<'_>,
        st: &Stat,
    ) -> Result<(), EntryError> {
        let err = |op, e| node.error(name, Side::Dst, op, Reason::Os(e));
        for acl in [ACL_ACCESS, ACL_DEFAULT] {
            if !crate::source::has_xattr(&*self.shared.source, src, acl) {
                sluice_sys::remove_xattr(dst, acl).map_err(|e| err("remove inherited ACL", e))?;
            }
        }
        // A directory stays owner-only until it is finished (its real mode
        // is set then, after its contents).
        let perm = if st.file_type() == FileType::Directory {
            0o700
        } else {
            self.shared.mode_for(st)
        };
        sluice_sys::set_perm(dst, perm).map_err(|e| err("chmod", e))
    }
}
