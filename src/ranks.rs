//! One job over several processes started by `mpirun` or `srun` (a build
//! with `--features mpi`): every rank runs the whole engine, with its own
//! streams, on its part of the job (the `--shard` split with part = rank:
//! files by path, hard-linked files by inode, big files by chunk). One
//! thread per rank does all the talking to the others (so the MPI library
//! needs no more than `MPI_THREAD_FUNNELED`): deletes wait until every
//! rank says its walk ended clean, and at the end the ranks share their
//! figures, so rank 0 prints one summary for the job (per-rank figures in
//! `--json`) and every rank exits with the worst code of any.

use sluice_engine::exchange::{Desk, Item};
use sluice_engine::options::{Group, Progress};
use sluice_engine::Stats;
use sluice_engine::Summary;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
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
    /// Share out a job as it goes, this rank's side of it being the desk.
    Open(Arc<dyn Desk>),
    /// Hand these items to that rank.
    Send(u32, Vec<Item>),
    /// This rank's counters, whose progress the others are told of.
    Watch(Arc<Stats>),
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
    /// What the talking thread heard from the other ranks.
    heard: Heard,
}

impl Ranks {
    /// Joins the MPI job this process was launched in. `Err` when MPI
    /// cannot be started.
    pub fn join() -> Result<Arc<Ranks>, String> {
        let (tx, rx) = channel::<Ask>();
        let (placed, place) = sync_channel(1);
        let heard = Heard {
            hungry: Arc::new(AtomicBool::new(false)),
            others: Arc::new(Mutex::new(Vec::new())),
        };
        let told = heard.clone();
        let thread = std::thread::Builder::new()
            .name("mpi".into())
            .spawn(move || talk(rx, placed, told))
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
            heard,
        }))
    }

    fn tell(&self, ask: Ask) {
        let asks = self.asks.lock().expect("asks lock");
        let asks = asks.as_ref().expect("asked after the ranks were left");
        asks.send(ask).expect("the MPI thread is gone");
    }

    fn ask<T>(&self, make: impl FnOnce(SyncSender<T>) -> Ask) -> T {
        let (tx, rx) = sync_channel(1);
        let asks = self.asks.lock().expect("asks lock");
        let asks = asks.as_ref().expect("asked after the ranks were left");
        asks.send(make(tx)).expect("the MPI thread is gone");
        rx.recv().expect("the MPI thread is gone")
    }

    /// Tells the other ranks, while a job is shared out, how this one's
    /// counters move (rank 0 shows the job's progress).
    pub fn watch(&self, stats: Arc<Stats>) {
        self.tell(Ask::Watch(stats));
    }

    /// The progress of the other ranks, as they last told it (rank 0).
    pub fn elsewhere(&self) -> Progress {
        let others = self.heard.others.lock().expect("others lock");
        others.iter().fold(Progress::default(), |sum, p| sum.add(p))
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

    fn delete_budget(&self, mine: u64, max: u64) -> u64 {
        let all = self.ask(|tx| Ask::Share(vec![mine as f64], tx));
        let before: u64 = all[..self.rank as usize].iter().map(|v| v[0] as u64).sum();
        budget(mine, max, before)
    }

    fn shares_work(&self) -> bool {
        true
    }

    fn open(&self, desk: Arc<dyn Desk>) {
        self.tell(Ask::Open(desk));
    }

    fn send(&self, to: u32, items: Vec<Item>) {
        self.tell(Ask::Send(to, items));
    }

    fn hungry(&self) -> bool {
        self.heard.hungry.load(Relaxed)
    }
}

/// What a rank that would delete `mine` may delete of the job's `max`,
/// the ranks before it needing `before`.
fn budget(mine: u64, max: u64, before: u64) -> u64 {
    mine.min(max.saturating_sub(before))
}

/// What the talking thread learns from the other ranks, for the rest of
/// this process.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
#[derive(Clone)]
struct Heard {
    /// Another rank asked this one for work and got none.
    hungry: Arc<AtomicBool>,
    /// Rank 0: each rank's last progress (this one's left empty).
    others: Arc<Mutex<Vec<Progress>>>,
}

/// Without MPI built in, there is no one to talk to.
#[cfg(not(feature = "mpi"))]
fn talk(_: std::sync::mpsc::Receiver<Ask>, _: SyncSender<(u32, u32)>, _: Heard) {}

/// A progress report as words, and back.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
fn progress_words(p: &Progress) -> [u64; 7] {
    [
        p.done,
        p.found,
        p.bytes,
        p.bytes_found,
        p.files,
        p.listings_pending,
        u64::from(p.walk_started),
    ]
}

#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
fn progress_from(w: [u64; 7]) -> Progress {
    Progress {
        done: w[0],
        found: w[1],
        bytes: w[2],
        bytes_found: w[3],
        files: w[4],
        listings_pending: w[5],
        walk_started: w[6] != 0,
    }
}

/// The talking thread: starts MPI, says where this process is, answers
/// asks with collective operations, shares out a job's work while it
/// runs (see [`Market`]), and finishes MPI when the asks end.
#[cfg(feature = "mpi")]
fn talk(asks: std::sync::mpsc::Receiver<Ask>, placed: SyncSender<(u32, u32)>, heard: Heard) {
    use mpi::traits::*;
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
        return;
    };
    let world = universe.world();
    let _ = placed.send((world.rank() as u32, world.size() as u32));
    // A rank whose talking thread failed would leave every rank waiting.
    let talked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve_asks(&world, &asks, &heard)
    }));
    if talked.is_err() {
        world.abort(2);
    }
}

/// Answers the asks until they end (see [`talk`]).
#[cfg(feature = "mpi")]
fn serve_asks(
    world: &mpi::topology::SimpleCommunicator,
    asks: &std::sync::mpsc::Receiver<Ask>,
    heard: &Heard,
) {
    use mpi::collective::SystemOperation;
    use mpi::traits::*;
    use std::sync::mpsc::RecvTimeoutError;
    let size = world.size() as usize;
    let mut market: Option<Market> = None;
    let mut session = 0u8;
    let mut stats = None;
    *heard.others.lock().expect("others lock") = vec![Progress::default(); size];
    loop {
        // While a job is shared out, the thread also polls the other ranks.
        let (idle, ask) = match &market {
            Some(m) => {
                // Idle is read before the asks are: whatever a stream handed
                // over before its task ended is in the channel by then.
                let idle = m.desk.idle();
                // A busy rank answers requests for work within a
                // millisecond; an idle one looks at once for what it asked.
                let wait = Duration::from_micros(if idle { 200 } else { 1000 });
                match asks.recv_timeout(wait) {
                    Ok(a) => (false, Some(a)),
                    Err(RecvTimeoutError::Timeout) => (idle, None),
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            None => match asks.recv() {
                Ok(a) => (false, Some(a)),
                Err(_) => break,
            },
        };
        match ask {
            None => {}
            Some(Ask::Open(desk)) => {
                session = session.wrapping_add(1);
                market = Some(Market::new(world, desk, session, heard.clone()));
            }
            Some(Ask::Send(to, items)) => match &mut market {
                Some(m) => m.hand_over(world, to, items),
                None => unreachable!("items handed over while no job is shared out"),
            },
            Some(Ask::Watch(s)) => stats = Some(s),
            Some(Ask::AllClean(clean, tx)) => {
                let mine = i32::from(clean);
                let mut all = 0i32;
                world.all_reduce_into(&mine, &mut all, SystemOperation::min());
                let _ = tx.send(all == 1);
            }
            Some(Ask::Share(mine, tx)) => {
                let mut all = vec![0f64; mine.len() * size];
                world.all_gather_into(&mine[..], &mut all[..]);
                let _ = tx.send(all.chunks(mine.len()).map(<[f64]>::to_vec).collect());
            }
            Some(Ask::Abort(code)) => world.abort(code),
        }
        if let Some(m) = &mut market {
            if let Some(s) = &stats {
                m.tell_progress(world, s);
            }
            if m.pump(world, idle) {
                m.desk.close();
                market = None;
            }
        }
    }
}

/// Message tags between ranks sharing a job.
#[cfg(feature = "mpi")]
mod tag {
    /// "Lend me work" (empty).
    pub const ASK: i32 = 1;
    /// What a rank asked for: items, or none to spare.
    pub const LOAN: i32 = 2;
    /// Items that are the receiver's (see `exchange::Item::Owned`).
    pub const HANDED: i32 = 3;
    /// The termination token: (sum of counts, black).
    pub const TOKEN: i32 = 4;
    /// Every rank is idle and nothing is in flight: the job's streams end.
    pub const DONE: i32 = 5;
    /// A rank's progress, for rank 0's progress line.
    pub const PROGRESS: i32 = 6;
}

/// One job shared out between the ranks as it goes: idle ranks ask a
/// random other rank for work and are lent some (libcircle's work
/// stealing, as mpifileutils uses), and Safra's token ring (EWD 998)
/// finds when every rank is idle with no work in flight. Each rank counts
/// the messages that carry work it sent less those it received; a rank
/// that received one since the token last passed it is black. Rank 0
/// sends a white token round the ring whenever it is idle; each idle rank
/// adds its count, blackens it if it is black itself, turns white and
/// passes it on; when it returns white to a white rank 0 and the counts
/// add up to zero, no work is anywhere, and rank 0 tells every rank.
///
/// Every message starts with the job's session number, so a request left
/// over from an earlier job of the same run is known and dropped.
#[cfg(feature = "mpi")]
struct Market {
    desk: Arc<dyn Desk>,
    session: u8,
    rank: i32,
    size: i32,
    /// Messages carrying work sent, less those received.
    count: i64,
    black: bool,
    /// The token, while this rank holds it.
    token: Option<(i64, bool)>,
    /// Rank 0: a token is on its way round.
    token_out: bool,
    /// A request for work is waiting for its answer.
    asking: bool,
    /// When to ask again after a rank had nothing to lend.
    next_ask: std::time::Instant,
    /// Messages received while a send of this rank's was completing.
    inbox: std::collections::VecDeque<(i32, i32, Vec<u8>)>,
    /// Items to hand over, per rank, sent when the asks are drained.
    outbox: Vec<Vec<Item>>,
    rng: u64,
    heard: Heard,
    /// When this rank last told rank 0 its progress.
    told: std::time::Instant,
}

#[cfg(feature = "mpi")]
impl Market {
    fn new(
        world: &mpi::topology::SimpleCommunicator,
        desk: Arc<dyn Desk>,
        session: u8,
        heard: Heard,
    ) -> Market {
        use mpi::traits::*;
        let (rank, size) = (world.rank(), world.size());
        Market {
            desk,
            session,
            rank,
            size,
            count: 0,
            black: false,
            token: None,
            token_out: false,
            asking: false,
            next_ask: std::time::Instant::now(),
            inbox: Default::default(),
            outbox: vec![Vec::new(); size as usize],
            rng: 0x9e37_79b9_7f4a_7c15 ^ (rank as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9),
            heard,
            told: std::time::Instant::now(),
        }
    }

    fn hand_over(&mut self, world: &mpi::topology::SimpleCommunicator, to: u32, items: Vec<Item>) {
        let out = &mut self.outbox[to as usize];
        out.extend(items);
        if out.len() >= 256 {
            self.flush(world, to as usize);
        }
    }

    fn flush(&mut self, world: &mpi::topology::SimpleCommunicator, to: usize) {
        let items = std::mem::take(&mut self.outbox[to]);
        if !items.is_empty() {
            self.count += 1;
            self.post(world, to as i32, tag::HANDED, &items);
        }
    }

    /// Sends one message, taking in what arrives meanwhile: two ranks
    /// sending each other a large message at once would otherwise each
    /// wait for the other to receive.
    fn post(
        &mut self,
        world: &mpi::topology::SimpleCommunicator,
        to: i32,
        tag: i32,
        items: &[Item],
    ) {
        let mut buf = vec![self.session];
        if !items.is_empty() {
            buf.extend(postcard::to_stdvec(items).expect("items encode"));
        }
        self.post_raw(world, to, tag, &buf);
    }

    fn post_raw(
        &mut self,
        world: &mpi::topology::SimpleCommunicator,
        to: i32,
        tag: i32,
        buf: &[u8],
    ) {
        use mpi::traits::*;
        let inbox = &mut self.inbox;
        mpi::request::scope(|scope| {
            let mut req = world
                .process_at_rank(to)
                .immediate_send_with_tag(scope, buf, tag);
            loop {
                match req.test() {
                    Ok(_) => break,
                    Err(r) => req = r,
                }
                if let Some(m) = receive(world) {
                    inbox.push_back(m);
                }
            }
        });
    }

    /// One round: takes in what arrived, answers it, hands over what the
    /// streams gave, asks for work when idle, and moves the token. True
    /// once every rank is done.
    fn pump(&mut self, world: &mpi::topology::SimpleCommunicator, idle: bool) -> bool {
        while let Some(m) = receive(world) {
            self.inbox.push_back(m);
        }
        let mut done = false;
        let mut busy = !idle;
        while let Some((from, tag, data)) = self.inbox.pop_front() {
            if data.first() != Some(&self.session) {
                continue; // an earlier job's
            }
            let items = || -> Vec<Item> {
                if data.len() <= 1 {
                    Vec::new()
                } else {
                    postcard::from_bytes(&data[1..]).expect("items decode")
                }
            };
            match tag {
                tag::ASK => {
                    let lent = self.desk.lend();
                    self.heard.hungry.store(lent.is_empty(), Relaxed);
                    if !lent.is_empty() {
                        self.count += 1;
                    }
                    self.post(world, from, tag::LOAN, &lent);
                }
                tag::LOAN => {
                    self.asking = false;
                    let lent = items();
                    if lent.is_empty() {
                        self.next_ask = std::time::Instant::now() + Duration::from_micros(500);
                    } else {
                        self.count -= 1;
                        self.black = true;
                        busy = true;
                        self.desk.take(lent);
                    }
                }
                tag::HANDED => {
                    self.count -= 1;
                    self.black = true;
                    busy = true;
                    self.desk.take(items());
                }
                tag::TOKEN => {
                    let q = i64::from_le_bytes(data[1..9].try_into().expect("a token"));
                    self.token = Some((q, data[9] != 0));
                }
                tag::DONE => done = true,
                tag::PROGRESS if data.len() == 1 + 7 * 8 => {
                    let mut w = [0u64; 7];
                    for (i, word) in data[1..].chunks(8).enumerate() {
                        w[i] = u64::from_le_bytes(word.try_into().expect("8 bytes"));
                    }
                    let mut others = self.heard.others.lock().expect("others lock");
                    if let Some(p) = others.get_mut(from as usize) {
                        *p = progress_from(w);
                    }
                }
                _ => {}
            }
        }
        if done {
            return true;
        }
        for to in 0..self.size as usize {
            self.flush(world, to);
        }
        if busy {
            return false;
        }
        // Idle: ask for work, and move the token on.
        if !self.asking && std::time::Instant::now() >= self.next_ask {
            self.asking = true;
            let victim = self.victim();
            self.post(world, victim, tag::ASK, &[]);
        }
        let next = (self.rank + 1) % self.size;
        if self.rank == 0 {
            match self.token.take() {
                None if self.token_out => {}
                Some((q, black)) if !black && !self.black && q + self.count == 0 => {
                    for r in 1..self.size {
                        self.post(world, r, tag::DONE, &[]);
                    }
                    return true;
                }
                _ => {
                    self.token_out = true;
                    self.black = false;
                    self.pass_token(world, next, 0, false);
                }
            }
        } else if let Some((q, black)) = self.token.take() {
            let black = black || self.black;
            self.black = false;
            self.pass_token(world, next, q + self.count, black);
        }
        false
    }

    /// A rank other than 0 tells rank 0 its progress, four times a second.
    fn tell_progress(&mut self, world: &mpi::topology::SimpleCommunicator, stats: &Stats) {
        if self.rank == 0 || self.told.elapsed() < Duration::from_millis(250) {
            return;
        }
        self.told = std::time::Instant::now();
        let mut buf = vec![self.session];
        for w in progress_words(&stats.progress()) {
            buf.extend(w.to_le_bytes());
        }
        self.post_raw(world, 0, tag::PROGRESS, &buf);
    }

    fn pass_token(
        &mut self,
        world: &mpi::topology::SimpleCommunicator,
        to: i32,
        q: i64,
        black: bool,
    ) {
        let mut buf = vec![self.session];
        buf.extend(q.to_le_bytes());
        buf.push(u8::from(black));
        self.post_raw(world, to, tag::TOKEN, &buf);
    }

    /// A random rank other than this one (xorshift).
    fn victim(&mut self) -> i32 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let other = (self.rng % (self.size as u64 - 1)) as i32;
        if other >= self.rank {
            other + 1
        } else {
            other
        }
    }
}

/// A message from any rank, if one has arrived: (from, tag, bytes).
#[cfg(feature = "mpi")]
fn receive(world: &mpi::topology::SimpleCommunicator) -> Option<(i32, i32, Vec<u8>)> {
    use mpi::point_to_point::MatchedReceiveVec;
    use mpi::traits::*;
    let (msg, status) = world.any_process().immediate_matched_probe()?;
    let (data, _) = (msg, status).matched_receive_vec::<u8>();
    Some((status.source_rank(), status.tag(), data))
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
    fn the_delete_budget_goes_to_the_ranks_in_turn() {
        // max 10; ranks would delete 4, 5, 3: they may delete 4, 5, 1.
        assert_eq!(budget(4, 10, 0), 4);
        assert_eq!(budget(5, 10, 4), 5);
        assert_eq!(budget(3, 10, 9), 1);
        assert_eq!(budget(3, 10, 12), 0);
    }

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
