//! The bounded work queue shared by the fixed pool of streams.
//!
//! Two lanes: data work (batches of small files, chunks of big ones) is taken
//! first, first in first out, so memory held by listed-but-uncopied entries
//! stays small; directories are taken last in first out, so the walk goes
//! depth first and the number of open directory descriptors stays bounded.
//! A push into a full lane hands the task back: the caller runs it inline,
//! which is the back-pressure that keeps the queue bounded without ever
//! blocking a stream (and so without deadlock).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};

/// Which lane a task belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lane {
    Data,
    Dir,
}

struct Lanes<T> {
    data: VecDeque<T>,
    dirs: Vec<T>,
    /// Tasks queued or running; the job is complete when it reaches zero.
    outstanding: usize,
    /// Streams waiting in `pop` for work.
    idle: usize,
    closed: bool,
}

/// A bounded two-lane queue with completion tracking.
pub struct Queue<T> {
    lanes: Mutex<Lanes<T>>,
    ready: Condvar,
    data_cap: usize,
    dir_cap: usize,
}

impl<T> Queue<T> {
    /// A queue holding at most `data_cap` data tasks and `dir_cap` directories.
    pub fn new(data_cap: usize, dir_cap: usize) -> Self {
        Queue {
            lanes: Mutex::new(Lanes {
                data: VecDeque::with_capacity(data_cap),
                dirs: Vec::with_capacity(dir_cap),
                outstanding: 0,
                idle: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            data_cap,
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
        match lane {
            Lane::Data if l.data.len() < self.data_cap => l.data.push_back(task),
            Lane::Dir if l.dirs.len() < self.dir_cap => l.dirs.push(task),
            _ => return Err(task),
        }
        l.outstanding += 1;
        drop(l);
        self.ready.notify_one();
        Ok(())
    }

    /// Takes the next task, waiting while others are still running (they may
    /// queue more). Returns `None` once nothing is queued or running, or the
    /// queue was closed.
    pub fn pop(&self) -> Option<T> {
        let mut l = self.lanes.lock().expect("queue lock");
        loop {
            if l.closed {
                return None;
            }
            if let Some(t) = l.data.pop_front().or_else(|| l.dirs.pop()) {
                return Some(t);
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
        l.idle > 0 && l.data.is_empty() && l.dirs.is_empty()
    }

    /// Marks a popped task finished.
    pub fn done(&self) {
        let mut l = self.lanes.lock().expect("queue lock");
        l.outstanding -= 1;
        if l.outstanding == 0 {
            self.ready.notify_all();
        }
    }

    /// Stops the pool: queued tasks are dropped, `pop` returns `None`.
    pub fn close(&self) -> Vec<T> {
        let mut l = self.lanes.lock().expect("queue lock");
        l.closed = true;
        let mut dropped: Vec<T> = l.data.drain(..).collect();
        dropped.append(&mut l.dirs);
        drop(l);
        self.ready.notify_all();
        dropped
    }
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
        assert_eq!(q.pop(), Some(1));
        q.done();
        assert_eq!(q.pop(), Some(3));
        q.done();
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn pop_waits_for_running_tasks_that_may_push_more() {
        use std::sync::Arc;
        let q = Arc::new(Queue::new(4, 4));
        q.push(Lane::Dir, 0).unwrap();
        assert_eq!(q.pop(), Some(0));
        let q2 = q.clone();
        let waiter = std::thread::spawn(move || q2.pop());
        std::thread::sleep(std::time::Duration::from_millis(50));
        q.push(Lane::Data, 7).unwrap();
        q.done();
        assert_eq!(waiter.join().unwrap(), Some(7));
    }
}
