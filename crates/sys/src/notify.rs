//! inotify: the kernel's per-directory change events, for `sluice watch`.

use crate::{Errno, Result};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

/// What happened, as the bits of interest to a replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The watch (directory) it happened in.
    pub wd: i32,
    /// The entry's name in that directory; empty for the directory itself.
    pub name: Vec<u8>,
    /// The entry is a directory.
    pub dir: bool,
    pub kind: Kind,
    /// Pairs the two halves of a rename.
    pub cookie: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Created, written, closed after writing, or its metadata changed.
    Changed,
    /// Removed.
    Deleted,
    /// Renamed away from this directory (the `cookie` pairs it).
    MovedFrom,
    /// Renamed into this directory.
    MovedTo,
    /// The watched directory itself is gone (deleted or unmounted); its
    /// watch is over.
    Gone,
    /// The kernel's queue overflowed: events were lost.
    Overflow,
}

/// An inotify instance.
pub struct Inotify {
    fd: OwnedFd,
    buf: Vec<MaybeUninit<u8>>,
}

impl Inotify {
    pub fn new() -> Result<Inotify> {
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)?;
        Ok(Inotify {
            fd,
            buf: vec![MaybeUninit::uninit(); 256 << 10],
        })
    }

    /// Watches directory `path` (never through a symlink at its end).
    /// Watching an inode already watched returns its existing number.
    /// `ENOSPC` means `fs.inotify.max_user_watches` is reached.
    pub fn add(&self, path: &std::path::Path) -> Result<i32> {
        let mask = WatchFlags::CREATE
            | WatchFlags::DELETE
            | WatchFlags::MODIFY
            | WatchFlags::CLOSE_WRITE
            | WatchFlags::ATTRIB
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::DELETE_SELF
            | WatchFlags::ONLYDIR
            | WatchFlags::DONT_FOLLOW
            | WatchFlags::EXCL_UNLINK;
        inotify::add_watch(&self.fd, path, mask)
    }

    pub fn remove(&self, wd: i32) {
        let _ = inotify::remove_watch(&self.fd, wd);
    }

    /// Waits up to `timeout` for events and returns all that are queued.
    pub fn read(&mut self, timeout: Duration) -> Result<Vec<Event>> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let ts = Timespec {
            tv_sec: timeout.as_secs() as i64,
            tv_nsec: timeout.subsec_nanos() as i64,
        };
        match poll(&mut fds, Some(&ts)) {
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
        let mut out = Vec::new();
        let mut reader = inotify::Reader::new(self.fd.as_fd(), &mut self.buf);
        loop {
            let ev = match reader.next() {
                Ok(ev) => ev,
                Err(Errno::WOULDBLOCK) | Err(Errno::INTR) => break,
                Err(e) => return Err(e),
            };
            let f = ev.events();
            let kind = if f.contains(ReadFlags::QUEUE_OVERFLOW) {
                Kind::Overflow
            } else if f.intersects(ReadFlags::IGNORED | ReadFlags::DELETE_SELF) {
                Kind::Gone
            } else if f.contains(ReadFlags::MOVED_FROM) {
                Kind::MovedFrom
            } else if f.contains(ReadFlags::MOVED_TO) {
                Kind::MovedTo
            } else if f.contains(ReadFlags::DELETE) {
                Kind::Deleted
            } else {
                Kind::Changed
            };
            out.push(Event {
                wd: ev.wd(),
                name: ev
                    .file_name()
                    .map(|n| n.to_bytes().to_vec())
                    .unwrap_or_default(),
                dir: f.contains(ReadFlags::ISDIR),
                kind,
                cookie: ev.cookie(),
            });
        }
        Ok(out)
    }
}
