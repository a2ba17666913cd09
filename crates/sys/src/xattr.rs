//! Extended attributes (and with them POSIX ACLs, which live in
//! `system.posix_acl_*`), copied between open file descriptors.

use crate::{Errno, Result};
use std::ffi::{CStr, CString};
use std::os::fd::BorrowedFd;

/// Which extended attributes a job copies and compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum XattrSet {
    /// All of them, POSIX ACLs (`system.posix_acl_*`) included.
    #[default]
    All,
    /// All but POSIX ACLs (`--no-acls`).
    NoAcls,
}

impl XattrSet {
    /// Whether the attribute `name` belongs to this set.
    pub fn takes(self, name: &[u8]) -> bool {
        self == XattrSet::All || !name.starts_with(b"system.posix_acl_")
    }
}

/// Copies every extended attribute of `src` in `set` to `dst`. `names` and `value`
/// are scratch buffers reused across calls. Attributes the destination
/// refuses (an unsupported namespace, `trusted.*` without privilege) are
/// skipped; the first other failure is returned with the name it hit.
pub fn copy_xattrs(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    set: XattrSet,
    names: &mut Vec<u8>,
    value: &mut Vec<u8>,
) -> std::result::Result<(), (Errno, String)> {
    let n = match list(src, names) {
        Ok(n) => n,
        Err(Errno::OPNOTSUPP) => return Ok(()),
        Err(e) => return Err((e, "listxattr".into())),
    };
    if n == 0 {
        return Ok(());
    }
    let mut start = 0;
    while start < n {
        let Some(nul) = names[start..n].iter().position(|&b| b == 0) else {
            break;
        };
        let end = start + nul;
        let name = CStr::from_bytes_with_nul(&names[start..=end]).expect("one NUL at the end");
        start = end + 1;
        if name.is_empty() || !set.takes(name.to_bytes()) {
            continue;
        }
        let len = match get(src, name, value) {
            Ok(len) => len,
            Err(Errno::NODATA) => continue, // removed since listing
            Err(e) => return Err((e, format!("getxattr {}", name.to_string_lossy()))),
        };
        match rustix::fs::fsetxattr(dst, name, &value[..len], rustix::fs::XattrFlags::empty()) {
            Ok(()) => {}
            Err(Errno::OPNOTSUPP) | Err(Errno::PERM) => {}
            Err(e) => return Err((e, format!("setxattr {}", name.to_string_lossy()))),
        }
    }
    Ok(())
}

/// Every extended attribute of `fd` in `set`, names and values (what a
/// source across a wire sends; a local copy goes fd to fd instead).
pub fn read_xattrs(fd: BorrowedFd<'_>, set: XattrSet) -> Result<Vec<(CString, Vec<u8>)>> {
    let (mut names, mut value) = (Vec::new(), Vec::new());
    let n = match list(fd, &mut names) {
        Err(Errno::OPNOTSUPP) => return Ok(Vec::new()),
        other => other?,
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&c| c == 0) {
        if name.is_empty() || !set.takes(name) {
            continue;
        }
        let name = CString::new(name).expect("split at NUL");
        match get(fd, &name, &mut value) {
            Ok(len) => out.push((name, value[..len].to_vec())),
            Err(Errno::NODATA) => {} // removed since listing
            Err(e) => return Err(e),
        }
    }
    out.sort();
    Ok(out)
}

/// Sets the attributes `attrs` on `dst`, skipping those DST refuses (as
/// [`copy_xattrs`] does).
pub fn set_xattrs(
    dst: BorrowedFd<'_>,
    attrs: &[(CString, Vec<u8>)],
) -> std::result::Result<(), (Errno, String)> {
    for (name, value) in attrs {
        match rustix::fs::fsetxattr(dst, name, value, rustix::fs::XattrFlags::empty()) {
            Ok(()) | Err(Errno::OPNOTSUPP) | Err(Errno::PERM) => {}
            Err(e) => return Err((e, format!("setxattr {}", name.to_string_lossy()))),
        }
    }
    Ok(())
}

/// Whether `dst` carries exactly `attrs` (sorted by name, as
/// [`read_xattrs`] returns them) among its attributes of `set`.
pub fn xattrs_are(
    dst: BorrowedFd<'_>,
    set: XattrSet,
    attrs: &[(CString, Vec<u8>)],
) -> Result<bool> {
    Ok(read_xattrs(dst, set)? == attrs)
}

fn list(fd: BorrowedFd<'_>, names: &mut Vec<u8>) -> Result<usize> {
    if names.len() < 1024 {
        names.resize(1024, 0);
    }
    loop {
        match rustix::fs::flistxattr(fd, &mut names[..]) {
            Err(Errno::RANGE) => {
                let want = rustix::fs::flistxattr(fd, &mut [0u8; 0][..])?;
                names.resize(want.max(names.len() * 2), 0);
            }
            other => return other,
        }
    }
}

fn get(fd: BorrowedFd<'_>, name: &CStr, value: &mut Vec<u8>) -> Result<usize> {
    if value.len() < 4096 {
        value.resize(4096, 0);
    }
    loop {
        match rustix::fs::fgetxattr(fd, name, &mut value[..]) {
            Err(Errno::RANGE) => {
                let want = rustix::fs::fgetxattr_query(fd, name)?;
                value.resize(want.max(value.len() * 2), 0);
            }
            other => return other,
        }
    }
}

/// Whether `src` and `dst` carry the same extended attributes of `set`
/// with the same values (a re-run leaves equal ones alone: setting them
/// changes the ctime).
pub fn xattrs_equal(src: BorrowedFd<'_>, dst: BorrowedFd<'_>, set: XattrSet) -> Result<bool> {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let names = |fd, buf: &mut Vec<u8>| -> Result<Vec<Vec<u8>>> {
        let n = match list(fd, buf) {
            Err(Errno::OPNOTSUPP) => 0,
            other => other?,
        };
        let mut v: Vec<Vec<u8>> = buf[..n]
            .split(|&c| c == 0)
            .filter(|s| !s.is_empty() && set.takes(s))
            .map(<[u8]>::to_vec)
            .collect();
        v.sort();
        Ok(v)
    };
    let (na, nb) = (names(src, &mut a)?, names(dst, &mut b)?);
    if na != nb {
        return Ok(false);
    }
    for name in na {
        let name = std::ffi::CString::new(name).expect("split at NUL");
        let la = get(src, &name, &mut a)?;
        let lb = get(dst, &name, &mut b)?;
        if a[..la] != b[..lb] {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether an open file or directory has the extended attribute `name`.
pub fn has_xattr(fd: BorrowedFd<'_>, name: &CStr) -> bool {
    rustix::fs::fgetxattr_query(fd, name).is_ok()
}

/// Removes the extended attribute `name` (absent is not an error).
pub fn remove_xattr(fd: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    match rustix::fs::fremovexattr(fd, name) {
        Err(Errno::NODATA) | Err(Errno::OPNOTSUPP) => Ok(()),
        other => other,
    }
}

/// Removes the extended attribute `xattr` of the entry `name` in `dir`
/// without following it (a FIFO or device node, which cannot be opened to
/// use [`remove_xattr`]); absent is not an error.
pub fn remove_xattr_at(dir: BorrowedFd<'_>, name: &CStr, xattr: &CStr) -> Result<()> {
    use std::os::fd::AsRawFd;
    crate::one(name)?;
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name.to_bytes());
    let path = std::ffi::CString::new(path).map_err(|_| Errno::INVAL)?;
    match rustix::fs::lremovexattr(path.as_c_str(), xattr) {
        Err(Errno::NODATA) | Err(Errno::OPNOTSUPP) => Ok(()),
        other => other,
    }
}
