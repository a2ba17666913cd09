//! The bounded work queue shared by the fixed pool of streams.
//!
//! Three lanes. Chunks of big files (bandwidth-bound work) are taken first,
//! but by at most `chunk_limit` streams at once: the pool's streams are
//! split between the two kinds of work, and `-j auto` tunes the split (a
//! disk that streams one big file as fast as eight leaves the other seven
//! streams to small files). Batches of small files (metadata-bound work)
//! come next, first in first out, so memory held by listed-but-uncopied
//! entries stays small; directories last, last in first out, so the walk
//! goes depth first and the number of open directory descriptors stays
//! bounded.
//! A push into a full lane hands the task back: the caller runs it inline,
//! which is the back-pressure that keeps the queue bounded without ever
//! blocking a stream (and so without deadlock).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Condvar, Mutex};

/// Which lane a task belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    /// Chunks of big files.
    Chunk,
    /// Batches of small files.
    Data,
    Dir,
}

struct Lanes<T> {
    chunks: VecDeque<T>,
    /// Chunk tasks running now.
    chunks_running: usize,
    chunk_limit: usize,
    data: VecDeque<T>,
    dirs: Vec<T>,
    /// Tasks queued or running; the job is complete when it reaches zero.
    outstanding: usize,
    /// Streams waiting in `pop` for work.
    idle: usize,
    closed: bool,
}

/// A bounded three-lane queue with completion tracking.
pub struct Queue<T> {
    lanes: Mutex<Lanes<T>>,
    ready: Condvar,
    data_cap: AtomicUsize,
    dir_cap: usize,
}

impl<T> Queue<T> {
    /// A queue holding at most `data_cap` data tasks and `dir_cap` directories.
    pub fn new(data_cap: usize, dir_cap: usize) -> Self {
        Queue {
            lanes: Mutex::new(Lanes {
                chunks: VecDeque::with_capacity(data_cap),
                chunks_running: 0,
                chunk_limit: usize::MAX,
                data: VecDeque::with_capacity(data_cap),
                dirs: Vec::with_capacity(dir_cap),
                outstanding: 0,
                idle: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            data_cap: AtomicUsize::new(data_cap),
            dir_cap,
        }
    }

    /// Queues a task, or gives it back when its lane is full or the queue
    /// closed; the caller then runs it itself.
    pub fn push(&self, lane: Lane, task: T) -> Result<(), T> {
        let mut l = self.lanes.lock().expect("queue lock");
        if l.closed {
            return Err(task);
        }
        let data_cap = self.data_cap.load(Relaxed);
        match lane {
            Lane::Chunk if l.chunks.len() < data_cap => l.chunks.push_back(task),
            Lane::Data if l.data.len() < data_cap => l.data.push_back(task),
            Lane::Dir if l.dirs.len() < self.dir_cap => l.dirs.push(task),
            _ => return Err(task),
        }
        l.outstanding += 1;
        drop(l);
        self.ready.notify_one();
        Ok(())
    }

    /// A new cap for the chunk and data lanes (`-j auto` keeps it in
    /// proportion to the streams at work: with 64 streams on a share and
    /// room for the 32 batches 8 streams need, the extra streams ran
    /// their batches inline, a few directories at a time).
    pub fn set_data_cap(&self, n: usize) {
        self.data_cap.store(n.max(1), Relaxed);
    }

    /// How many streams may run chunk tasks at once (at least one).
    pub fn set_chunk_limit(&self, n: usize) {
        self.lanes.lock().expect("queue lock").chunk_limit = n.max(1);
        self.ready.notify_all();
    }

    /// Chunk tasks queued or running: is bandwidth-bound work going on?
    pub fn chunk_work(&self) -> usize {
        let l = self.lanes.lock().expect("queue lock");
        l.chunks.len() + l.chunks_running
    }

    /// Takes the next task and its lane (to hand back to [`Queue::done`]),
    /// waiting while others are still running (they may queue more).
    /// Returns `None` once nothing is queued or running, or the queue was
    /// closed.
    pub fn pop(&self) -> Option<(Lane, T)> {
        let mut l = self.lanes.lock().expect("queue lock");
        loop {
            if l.closed {
                return None;
            }
            if l.chunks_running < l.chunk_limit {
                if let Some(t) = l.chunks.pop_front() {
                    l.chunks_running += 1;
                    return Some((Lane::Chunk, t));
                }
            }
            if let Some(t) = l.data.pop_front() {
                return Some((Lane::Data, t));
            }
            if let Some(t) = l.dirs.pop() {
                return Some((Lane::Dir, t));
            }
            if l.outstanding == 0 {
                l.closed = true;
                self.ready.notify_all();
                return None;
            }
            l.idle += 1;
            l = self.ready.wait(l).expect("queue lock");
            l.idle -= 1;
        }
    }

    /// True when some stream waits for work with nothing queued: handing it
    /// work is better than keeping that work local.
    pub fn has_idle(&self) -> bool {
        let l = self.lanes.lock().expect("queue lock");
        l.idle > 0 && l.data.is_empty() && l.dirs.is_empty() && l.chunks.is_empty()
    }

    /// Marks a task popped from `lane` finished.
    pub fn done(&self, lane: Lane) {
        let mut l = self.lanes.lock().expect("queue lock");
        l.outstanding -= 1;
        let freed_chunk = lane == Lane::Chunk && !l.chunks.is_empty();
        if lane == Lane::Chunk {
            l.chunks_running -= 1;
        }
        if l.outstanding == 0 {
            self.ready.notify_all();
        } else if freed_chunk {
            drop(l);
            self.ready.notify_one();
        }
    }

    /// Holds the pool open while it has nothing to do: other processes of
    /// the job may still hand it work ([`Queue::push_over`]). `pop` waits
    /// until [`Queue::unhold`].
    pub fn hold(&self) {
        self.lanes.lock().expect("queue lock").outstanding += 1;
    }

    /// Gives back [`Queue::hold`]: with nothing else queued or running,
    /// the streams end.
    pub fn unhold(&self) {
        let mut l = self.lanes.lock().expect("queue lock");
        l.outstanding -= 1;
        if l.outstanding == 0 {
            self.ready.notify_all();
        }
    }

    /// True when, but for its hold, nothing is queued or running: only
    /// work from elsewhere can give the pool something to do.
    pub fn held_idle(&self) -> bool {
        self.lanes.lock().expect("queue lock").outstanding <= 1
    }

    /// Queues a task whatever its lane holds (work another process lent,
    /// bounded by what one loan carries).
    pub fn push_over(&self, lane: Lane, task: T) {
        let mut l = self.lanes.lock().expect("queue lock");
        match lane {
            Lane::Chunk => l.chunks.push_back(task),
            Lane::Data => l.data.push_back(task),
            Lane::Dir => l.dirs.push(task),
        }
        l.outstanding += 1;
        drop(l);
        self.ready.notify_one();
    }

    /// Takes queued work to lend to another process: half the queued
    /// directories that `lendable` accepts, oldest first (the shallowest,
    /// with the most below them), or with none, half such batches of
    /// files. The tasks are no longer this queue's.
    pub fn lend(&self, lendable: impl Fn(&T) -> bool) -> Vec<T> {
        let mut l = self.lanes.lock().expect("queue lock");
        let mut lent = Vec::new();
        let dirs = std::mem::take(&mut l.dirs);
        l.dirs = lend_half(dirs, &lendable, &mut lent);
        if lent.is_empty() {
            let data = Vec::from(std::mem::take(&mut l.data));
            l.data = lend_half(data, &lendable, &mut lent).into();
        }
        l.outstanding -= lent.len();
        lent
    }

    /// Stops the pool: queued tasks are dropped, `pop` returns `None`.
    pub fn close(&self) -> Vec<T> {
        let mut l = self.lanes.lock().expect("queue lock");
        l.closed = true;
        let mut dropped: Vec<T> = l.chunks.drain(..).collect();
        dropped.extend(l.data.drain(..));
        dropped.append(&mut l.dirs);
        drop(l);
        self.ready.notify_all();
        dropped
    }
}

/// Moves the first half (rounded up) of the tasks `lendable` accepts from
/// `tasks` to `lent`; returns the others, in order.
fn lend_half<T>(tasks: Vec<T>, lendable: &impl Fn(&T) -> bool, lent: &mut Vec<T>) -> Vec<T> {
    let n = tasks.iter().filter(|t| lendable(t)).count().div_ceil(2);
    let mut taken = 0;
    tasks
        .into_iter()
        .filter_map(|t| {
            if taken < n && lendable(&t) {
                taken += 1;
                lent.push(t);
                None
            } else {
                Some(t)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_lane_hands_task_back_and_pop_ends_when_idle() {
        let q = Queue::new(1, 1);
        assert!(q.push(Lane::Data, 1).is_ok());
        assert_eq!(q.push(Lane::Data, 2), Err(2));
        assert!(q.push(Lane::Dir, 3).is_ok());
        assert_eq!(q.pop(), Some((Lane::Data, 1)));
        q.done(Lane::Data);
        assert_eq!(q.pop(), Some((Lane::Dir, 3)));
        q.done(Lane::Dir);
        assert_eq!(q.pop(), None);
    }

    /// Chunks go first, but to no more streams than the limit; the others
    /// take small files meanwhile, and a finished chunk lets the next in.
    #[test]
    fn chunks_run_on_at_most_the_limit_of_streams() {
        let q = Queue::new(8, 8);
        q.set_chunk_limit(1);
        for t in [10, 11] {
            q.push(Lane::Chunk, t).unwrap();
        }
        q.push(Lane::Data, 1).unwrap();
        assert_eq!(q.pop(), Some((Lane::Chunk, 10)));
        assert_eq!(q.pop(), Some((Lane::Data, 1)));
        assert_eq!(q.chunk_work(), 2);
        q.done(Lane::Data);
        q.done(Lane::Chunk);
        assert_eq!(q.pop(), Some((Lane::Chunk, 11)));
        q.done(Lane::Chunk);
        assert_eq!(q.chunk_work(), 0);
        assert_eq!(q.pop(), None);
    }

    /// A held pool waits for work from elsewhere rather than ending; what
    /// it lends is no longer outstanding here.
    #[test]
    fn a_held_queue_lends_its_oldest_directories_and_waits_for_more() {
        let q = Queue::new(8, 8);
        q.hold();
        for t in [1, 2, 3, 4] {
            q.push(Lane::Dir, t).unwrap();
        }
        q.push(Lane::Data, 5).unwrap();
        // Only what may be lent (odd numbers here) goes, half at a time.
        let odd = |t: &i32| t % 2 == 1;
        assert_eq!(q.lend(odd), vec![1]);
        assert_eq!(q.lend(odd), vec![3]);
        assert_eq!(q.lend(odd), vec![5]);
        assert!(!q.held_idle());
        assert_eq!(q.pop(), Some((Lane::Dir, 4)));
        q.done(Lane::Dir);
        assert_eq!(q.pop(), Some((Lane::Dir, 2)));
        q.done(Lane::Dir);
        assert!(q.held_idle());
        q.push_over(Lane::Data, 4);
        assert_eq!(q.pop(), Some((Lane::Data, 4)));
        q.done(Lane::Data);
        q.unhold();
        assert_eq!(q.pop(), None);
    }

    /// A stream that finds only chunks, all slots taken, waits for a slot
    /// rather than spinning or ending the job.
    #[test]
    fn a_stream_waits_for_a_chunk_slot() {
        use std::sync::Arc;
        let q = Arc::new(Queue::new(8, 8));
        q.set_chunk_limit(1);
        q.push(Lane::Chunk, 1).unwrap();
        q.push(Lane::Chunk, 2).unwrap();
        assert_eq!(q.pop(), Some((Lane::Chunk, 1)));
        let q2 = q.clone();
        let waiter = std::thread::spawn(move || q2.pop());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished());
        q.done(Lane::Chunk);
        assert_eq!(waiter.join().unwrap(), Some((Lane::Chunk, 2)));
    }

    #[test]
    fn pop_waits_for_running_tasks_that_may_push_more() {
        use std::sync::Arc;
        let q = Arc::new(Queue::new(4, 4));
        q.push(Lane::Dir, 0).unwrap();
        assert_eq!(q.pop(), Some((Lane::Dir, 0)));
        let q2 = q.clone();
        let waiter = std::thread::spawn(move || q2.pop());
        std::thread::sleep(std::time::Duration::from_millis(50));
        q.push(Lane::Data, 7).unwrap();
        q.done(Lane::Dir);
        assert_eq!(waiter.join().unwrap(), Some((Lane::Data, 7)));
    }
}
