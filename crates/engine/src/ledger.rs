//! The bookkeeping parts of a job's state, as pure logic: the tables that
//! give what is in flight a key a task can carry ([`Table`]), and the
//! hard-link groups ([`Links`]), which decide who copies a group's data,
//! who waits, and what a later name links to. The streams do the I/O and
//! report its outcome; what follows from it is decided here, and tested
//! here without a file system. `state::Ledger` holds one of each for a job.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// The key of a value in flight in a [`Table`]: what a task names a
/// directory or a big file by. Keys are never reused within a job, so a
/// task that outlived its value finds nothing rather than another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub(crate) struct Key(pub(crate) u64);

/// Values in flight that tasks name by [`Key`]: a stream looks one up when
/// it takes a task. Lookups happen once per task (a batch of files, a
/// directory, a chunk), never per file.
pub(crate) struct Table<T> {
    map: Mutex<HashMap<u64, Arc<T>>>,
    next: AtomicU64,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            map: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
        }
    }
}

impl<T> Table<T> {
    /// A fresh key, for a value about to be inserted (which may need to
    /// know its own key).
    pub fn key(&self) -> Key {
        Key(self.next.fetch_add(1, Relaxed))
    }

    pub fn insert(&self, key: Key, value: Arc<T>) {
        self.map.lock().expect("table lock").insert(key.0, value);
    }

    /// The value `key` names, unless it was removed.
    pub fn get(&self, key: Key) -> Option<Arc<T>> {
        self.map.lock().expect("table lock").get(&key.0).cloned()
    }

    pub fn remove(&self, key: Key) -> Option<Arc<T>> {
        self.map.lock().expect("table lock").remove(&key.0)
    }

    /// Lets every value go (the end of a job, stopped or not): what their
    /// `Drop` does (a big file's temporary) happens here.
    pub fn clear(&self) {
        let all = std::mem::take(&mut *self.map.lock().expect("table lock"));
        drop(all);
    }
}

/// Where one hard-link group (a source inode with more than one name)
/// stands.
enum Group<W> {
    /// Its first name is being copied; later names wait here.
    Copying(Vec<W>),
    /// Copied; later names link to this path relative to DST, whose inode
    /// in DST is given.
    Done(Vec<u8>, u64),
    /// The first copy failed; later names fail too.
    Failed,
}

/// What claiming a name of a hard-link group decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// This name copies the data; later names will link to it.
    First,
    /// The first name is being copied: this one waits, and is handed back
    /// by [`Links::settle`].
    Waits,
    /// Already copied: link this name to that path (relative to DST), which
    /// must still be that inode.
    LinkTo(Vec<u8>, u64),
    /// The first copy failed: this name fails too.
    Failed,
}

/// The hard-link groups of a job; `W` is what a waiting name is (its
/// directory and name).
pub(crate) struct Links<K, W> {
    groups: HashMap<K, Group<W>>,
}

impl<K, W> Default for Links<K, W> {
    fn default() -> Self {
        Links {
            groups: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq, W> Links<K, W> {
    /// A name of group `key` is to be copied: decides whether it copies the
    /// data, waits (`waiter` makes what is kept), links, or fails.
    pub fn claim(&mut self, key: K, waiter: impl FnOnce() -> W) -> Claim {
        match self.groups.get_mut(&key) {
            None => {
                self.groups.insert(key, Group::Copying(Vec::new()));
                Claim::First
            }
            Some(Group::Copying(waiting)) => {
                waiting.push(waiter());
                Claim::Waits
            }
            Some(Group::Done(rel, ino)) => Claim::LinkTo(rel.clone(), *ino),
            Some(Group::Failed) => Claim::Failed,
        }
    }

    /// The first name's copy ended: at `rel` as inode `ino`, or (`None`)
    /// failed. Returns the names that waited, to link or fail.
    pub fn settle(&mut self, key: K, copied: Option<(Vec<u8>, u64)>) -> Vec<W> {
        let group = match copied {
            Some((rel, ino)) => Group::Done(rel, ino),
            None => Group::Failed,
        };
        match self.groups.insert(key, group) {
            Some(Group::Copying(waiting)) => waiting,
            _ => Vec::new(),
        }
    }

    /// A name of group `key` that DST already has as inode `ino` (a job
    /// over an existing copy): the first name seen stands for the group,
    /// and a later one is intact only if it is the same inode.
    pub fn intact(&mut self, key: K, rel: impl FnOnce() -> Vec<u8>, ino: u64) -> bool {
        match self.groups.get(&key) {
            None => {
                self.groups.insert(key, Group::Done(rel(), ino));
                true
            }
            Some(Group::Done(_, have)) => *have == ino,
            Some(_) => false,
        }
    }

    /// Lets every waiting name go (the end of a job).
    pub fn clear(&mut self) {
        self.groups.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_name_copies_later_ones_wait_then_link() {
        let mut l: Links<u64, &str> = Links::default();
        assert_eq!(l.claim(1, || "a"), Claim::First);
        assert_eq!(l.claim(1, || "b"), Claim::Waits);
        assert_eq!(l.claim(1, || "c"), Claim::Waits);
        assert_eq!(l.claim(2, || "x"), Claim::First, "another group");
        assert_eq!(l.settle(1, Some((b"d/a".to_vec(), 9))), vec!["b", "c"]);
        assert_eq!(l.claim(1, || "e"), Claim::LinkTo(b"d/a".to_vec(), 9));
        assert!(l.settle(2, None).is_empty());
        assert_eq!(l.claim(2, || "y"), Claim::Failed);
    }

    #[test]
    fn a_failed_first_copy_hands_back_its_waiters() {
        let mut l: Links<u64, u32> = Links::default();
        assert_eq!(l.claim(5, || 0), Claim::First);
        assert_eq!(l.claim(5, || 1), Claim::Waits);
        assert_eq!(l.settle(5, None), vec![1]);
        assert_eq!(l.claim(5, || 2), Claim::Failed);
    }

    #[test]
    fn existing_names_are_intact_only_as_one_inode() {
        let mut l: Links<u64, ()> = Links::default();
        assert!(l.intact(3, || b"a".to_vec(), 40));
        assert!(l.intact(3, || b"b".to_vec(), 40));
        assert!(!l.intact(3, || b"c".to_vec(), 41));
        assert_eq!(l.claim(3, || ()), Claim::LinkTo(b"a".to_vec(), 40));
        l.claim(4, || ());
        assert!(!l.intact(4, || b"z".to_vec(), 1), "still being copied");
    }

    #[test]
    fn keys_are_not_reused() {
        let t: Table<u32> = Table::default();
        let a = t.key();
        t.insert(a, Arc::new(1));
        assert_eq!(t.remove(a).as_deref(), Some(&1));
        let b = t.key();
        assert_ne!(a, b);
        assert!(t.get(a).is_none());
    }
}
