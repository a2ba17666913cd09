//! One job over several processes started by `mpirun` or `srun` (a build
//! with `--features mpi`): every rank runs the whole engine, with its own
//! streams, on its part of the job (the `--shard` split with part = rank:
//! files by path, hard-linked files by inode, big files by chunk). One
//! thread per rank does all the talking to the others (so the MPI library
//! needs no more than `MPI_THREAD_FUNNELED`): deletes wait until every
//! rank says its walk ended clean, and at the end the ranks share their
//! figures, so rank 0 prints one summary for the job (per-rank figures in
//! `--json`) and every rank exits with the worst code of any.

use sluice_engine::options::Group;
use sluice_engine::Summary;
use std::sync::mpsc::{channel, sync_channel, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Whether a launcher started this process as one of an MPI job of more
/// than one process (`mpirun`, or `srun` with PMI).
pub fn launched() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .any(|n| n.trim().parse::<u32>().is_ok_and(|n| n > 1))
}

/// What the talking thread is asked to do.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
enum Ask {
    /// Whether every rank is clean (this one's answer given).
    AllClean(bool, SyncSender<bool>),
    /// Every rank's figures, in rank order (this one's given).
    Share(Vec<f64>, SyncSender<Vec<Vec<f64>>>),
    /// Ends every rank's process with this code (a rank that cannot go
    /// on would leave the others waiting for it).
    Abort(i32),
}

/// This process's place among the ranks of the job.
pub struct Ranks {
    pub rank: u32,
    pub size: u32,
    asks: Mutex<Option<Sender<Ask>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Ranks {
    /// Joins the MPI job this process was launched in. `Err` when MPI
    /// cannot be started.
    pub fn join() -> Result<Arc<Ranks>, String> {
        let (tx, rx) = channel::<Ask>();
        let (placed, place) = sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("mpi".into())
            .spawn(move || talk(rx, placed))
            .map_err(|e| format!("cannot start the MPI thread: {e}"))?;
        let (rank, size) = place.recv().map_err(|_| {
            if cfg!(feature = "mpi") {
                "MPI could not be started".to_string()
            } else {
                "started by an MPI launcher, but this sluice was built without MPI \
                 (cargo build --release --features mpi); or split the job with --shard"
                    .to_string()
            }
        })?;
        Ok(Arc::new(Ranks {
            rank,
            size,
            asks: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        }))
    }

    fn ask<T>(&self, make: impl FnOnce(SyncSender<T>) -> Ask) -> T {
        let (tx, rx) = sync_channel(1);
        let asks = self.asks.lock().expect("asks lock");
        let asks = asks.as_ref().expect("asked after the ranks were left");
        asks.send(make(tx)).expect("the MPI thread is gone");
        rx.recv().expect("the MPI thread is gone")
    }

    /// Every rank's summary, in rank order, for this one's.
    pub fn share(&self, s: &Summary, code: u8) -> Vec<(Summary, u8)> {
        let mine = encode(s, code);
        self.ask(|tx| Ask::Share(mine, tx))
            .iter()
            .map(|v| decode(v))
            .collect()
    }

    /// Ends the whole job, every rank's process, with `code`.
    pub fn abort(&self, code: u8) -> ! {
        if let Some(asks) = self.asks.lock().expect("asks lock").as_ref() {
            let _ = asks.send(Ask::Abort(i32::from(code)));
        }
        // The MPI thread ends this process; should it not, this does.
        std::thread::sleep(Duration::from_secs(5));
        std::process::exit(i32::from(code));
    }

    /// Leaves the MPI job (`MPI_Finalize`): the last thing a rank does.
    pub fn leave(&self) {
        drop(self.asks.lock().expect("asks lock").take());
        if let Some(t) = self.thread.lock().expect("thread lock").take() {
            let _ = t.join();
        }
    }
}

impl Group for Ranks {
    fn all_clean(&self, clean: bool) -> bool {
        self.ask(|tx| Ask::AllClean(clean, tx))
    }
}

/// Without MPI built in, there is no one to talk to.
#[cfg(not(feature = "mpi"))]
fn talk(_: std::sync::mpsc::Receiver<Ask>, _: SyncSender<(u32, u32)>) {}

/// The talking thread: starts MPI, says where this process is, answers
/// asks with collective operations, and finishes MPI when the asks end.
#[cfg(feature = "mpi")]
fn talk(asks: std::sync::mpsc::Receiver<Ask>, placed: SyncSender<(u32, u32)>) {
    use mpi::collective::SystemOperation;
    use mpi::traits::*;
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
        return;
    };
    let world = universe.world();
    let _ = placed.send((world.rank() as u32, world.size() as u32));
    let size = world.size() as usize;
    for ask in asks {
        match ask {
            Ask::AllClean(clean, tx) => {
                let mine = i32::from(clean);
                let mut all = 0i32;
                world.all_reduce_into(&mine, &mut all, SystemOperation::min());
                let _ = tx.send(all == 1);
            }
            Ask::Share(mine, tx) => {
                let mut all = vec![0f64; mine.len() * size];
                world.all_gather_into(&mine[..], &mut all[..]);
                let _ = tx.send(all.chunks(mine.len()).map(<[f64]>::to_vec).collect());
            }
            Ask::Abort(code) => world.abort(code),
        }
    }
}

/// A summary as numbers, for the ranks to share: its counters, stream
/// seconds, memory, CPU, times, and the rank's exit code.
fn encode(s: &Summary, code: u8) -> Vec<f64> {
    let b = &s.busy;
    vec![
        s.files_copied as f64,
        s.bytes_copied as f64,
        s.dirs_created as f64,
        s.symlinks as f64,
        s.hardlinks as f64,
        s.specials as f64,
        s.files_skipped as f64,
        s.unchanged as f64,
        s.deleted as f64,
        s.differences as f64,
        s.retries as f64,
        s.errors as f64,
        b.idle,
        b.walk,
        b.read,
        b.write,
        b.copy,
        b.journal,
        b.parked,
        s.peak_rss as f64,
        s.cpu.as_secs_f64(),
        s.streams as f64,
        s.throttle_wait.as_secs_f64(),
        s.elapsed.as_secs_f64(),
        f64::from(code),
    ]
}

fn decode(v: &[f64]) -> (Summary, u8) {
    let n = |i: usize| v[i] as u64;
    let secs = |i: usize| Duration::from_secs_f64(v[i].max(0.0));
    let s = Summary {
        files_copied: n(0),
        bytes_copied: n(1),
        dirs_created: n(2),
        symlinks: n(3),
        hardlinks: n(4),
        specials: n(5),
        files_skipped: n(6),
        unchanged: n(7),
        deleted: n(8),
        differences: n(9),
        retries: n(10),
        errors: n(11),
        busy: sluice_engine::gauge::Busy {
            idle: v[12],
            walk: v[13],
            read: v[14],
            write: v[15],
            copy: v[16],
            journal: v[17],
            parked: v[18],
        },
        peak_rss: n(19),
        cpu: secs(20),
        streams: n(21),
        throttle_wait: secs(22),
        elapsed: secs(23),
        ..Summary::default()
    };
    (s, v[24] as u8)
}

/// The job's summary from every rank's: counts, stream-seconds, CPU and
/// streams add up; memory is the largest rank's; the job took as long as
/// its slowest rank; its code is the worst.
pub fn reduce(all: &[(Summary, u8)]) -> (Summary, u8) {
    let mut t = Summary::default();
    let mut code = 0;
    for (s, c) in all {
        t.files_copied += s.files_copied;
        t.bytes_copied += s.bytes_copied;
        t.dirs_created += s.dirs_created;
        t.symlinks += s.symlinks;
        t.hardlinks += s.hardlinks;
        t.specials += s.specials;
        t.files_skipped += s.files_skipped;
        t.unchanged += s.unchanged;
        t.deleted += s.deleted;
        t.differences += s.differences;
        t.retries += s.retries;
        t.errors += s.errors;
        let (a, b) = (&mut t.busy, &s.busy);
        a.idle += b.idle;
        a.walk += b.walk;
        a.read += b.read;
        a.write += b.write;
        a.copy += b.copy;
        a.journal += b.journal;
        a.parked += b.parked;
        t.peak_rss = t.peak_rss.max(s.peak_rss);
        t.cpu += s.cpu;
        t.streams += s.streams;
        t.throttle_wait += s.throttle_wait;
        t.elapsed = t.elapsed.max(s.elapsed);
        code = code.max(*c);
    }
    (t, code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_survives_sharing_and_ranks_add_up() {
        let s = Summary {
            files_copied: 7,
            bytes_copied: 1 << 40,
            dirs_created: 3,
            errors: 1,
            peak_rss: 5 << 20,
            elapsed: Duration::from_millis(1500),
            ..Summary::default()
        };
        let (back, code) = decode(&encode(&s, 1));
        assert_eq!(
            (back.files_copied, back.bytes_copied, back.errors, code),
            (7, 1 << 40, 1, 1)
        );
        let other = Summary {
            files_copied: 5,
            elapsed: Duration::from_secs(2),
            dirs_created: 1,
            ..s.clone()
        };
        let (t, code) = reduce(&[(back, 1), (other, 0)]);
        assert_eq!(t.files_copied, 12);
        assert_eq!(t.bytes_copied, 2 << 40);
        assert_eq!(t.elapsed, Duration::from_secs(2));
        assert_eq!(t.peak_rss, 5 << 20);
        assert_eq!(code, 1);
    }
}
