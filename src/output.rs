//! What the user sees: the progress bar, error lines, the summary table and
//! the `--json` stream.

use crate::args::JobArgs;
use crate::location::Location;
use crate::ranks::Ranks;
use crate::remote::Opened;
use crate::size::human_bytes;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use sluice_engine::gauge::Busy;
use sluice_engine::options::Progress;
use sluice_engine::source::Wire;

use sluice_engine::shard::Shard;
use sluice_engine::{
    escape, CopyOptions, EntryError, JobError, Outcome, Reporter, Side, Stats, Summary,
};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Prints entry failures as they happen: a line on stderr, and with
/// `--json` an object on stdout.
pub struct Printer {
    json: bool,
    /// `-v`: a line per entry created, updated, linked or deleted.
    verbose: bool,
    /// A dry run: those lines say "would".
    dry_run: bool,
    /// `--log-file`: every per-entry event as a timestamped line.
    log: Option<Mutex<std::io::LineWriter<std::fs::File>>>,
    bar: Mutex<Option<ProgressBar>>,
}

impl Reporter for Printer {
    fn entry_failed(&self, err: &EntryError) {
        if self.json {
            let line = json!({
                "type": "error",
                "path": escape(&err.path),
                "side": match err.side { Side::Src => "src", Side::Dst => "dst" },
                "op": err.op,
                "error": err.reason.to_string(),
            });
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
        }
        self.log(&format!("error {err}"));
        self.say(&format!("sluice: error: {err}"));
    }

    fn entry_skipped(&self, path: &[u8], why: &str) {
        if self.json {
            let line = json!({"type": "skipped", "path": escape(path), "reason": why});
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        }
        self.log(&format!("skipped {}: {why}", escape(path)));
        self.say(&format!("sluice: skipped {}: {why}", escape(path)));
    }

    fn entry_differs(&self, side: Side, src: &[u8], dst: &[u8], what: &str) {
        let path = if side == Side::Src { src } else { dst };
        if self.json {
            let line = json!({"type": "difference", "path": escape(path), "src": escape(src),
                              "dst": escape(dst), "what": what});
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        }
        let both = format!("{} vs {}", escape(src), escape(dst));
        self.log(&format!("differs {both}: {what}"));
        self.say(&format!("sluice: differs: {both}: {what}"));
    }

    fn entry_deleted(&self, path: &[u8]) {
        self.log(&entry_text(self.dry_run, "delete", path, &[]));
        if self.json {
            let line = json!({"type": "deleted", "path": escape(path)});
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        } else if self.verbose {
            self.entry_line("delete", path, &[]);
        }
    }

    fn entry_changed(&self, path: &[u8], action: &str, why: &[&'static str]) {
        self.log(&entry_text(self.dry_run, action, path, why));
        if !self.verbose {
            return; // gathered for --log-file only
        }
        if self.json {
            let line = json!({"type": "entry", "action": action, "path": escape(path),
                              "why": why, "dry_run": self.dry_run});
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        } else {
            self.entry_line(action, path, why);
        }
    }

    fn notice(&self, path: &[u8], what: &str) {
        if self.json {
            let line = json!({"type": "notice", "path": escape(path), "what": what});
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        }
        self.log(&format!("note {}: {what}", escape(path)));
        self.say(&format!("sluice: note: {}: {what}", escape(path)));
    }
}

/// `copy /dst/a/b (new)`, or `would copy ...` in a dry run.
fn entry_text(dry_run: bool, action: &str, path: &[u8], why: &[&'static str]) -> String {
    let would = if dry_run { "would " } else { "" };
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({})", why.join(", "))
    };
    format!("{would}{action} {}{why}", escape(path))
}

impl Printer {
    /// A printer of failures and notes only (`image`).
    pub fn new(json: bool) -> Arc<Printer> {
        Arc::new(Printer {
            json,
            verbose: false,
            dry_run: false,
            log: None,
            bar: Mutex::new(None),
        })
    }

    /// The printer `show` asks for: JSON or text, `-v`, and with
    /// `--log-file` every per-entry event appended to that file.
    pub fn for_show(show: &crate::args::Show, dry_run: bool) -> Result<Arc<Printer>, String> {
        let log = match &show.log_file {
            None => None,
            Some(path) => {
                let f = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| format!("cannot open the log file {}: {e}", path.display()))?;
                Some(Mutex::new(std::io::LineWriter::new(f)))
            }
        };
        Ok(Arc::new(Printer {
            json: show.json,
            verbose: show.verbose,
            dry_run,
            log,
            bar: Mutex::new(None),
        }))
    }

    /// A line of the `--log-file`: Unix time, pid, the event.
    fn log(&self, event: &str) {
        if let Some(log) = &self.log {
            let line = format!("{:.3} [{}] {event}", unix_time(), std::process::id());
            let _ = writeln!(log.lock().expect("log lock"), "{line}");
        }
    }

    /// Writes out what the log holds (at the end of a job).
    pub fn flush_log(&self) {
        if let Some(log) = &self.log {
            let _ = log.lock().expect("log lock").flush();
        }
    }

    /// `copy   /dst/a/b (new)`, or `would copy ...` in a dry run, on
    /// stdout, around the progress bar.
    fn entry_line(&self, action: &str, path: &[u8], why: &[&'static str]) {
        let line = entry_text(self.dry_run, action, path, why);
        let print = || {
            let _ = writeln!(std::io::stdout().lock(), "{line}");
        };
        match &*self.bar.lock().expect("bar lock") {
            Some(bar) => bar.suspend(print),
            None => print(),
        }
    }

    /// A line on stderr that does not tear the progress bar.
    fn say(&self, msg: &str) {
        match &*self.bar.lock().expect("bar lock") {
            Some(bar) => bar.suspend(|| eprintln!("{msg}")),
            None => eprintln!("{msg}"),
        }
    }
}

/// Which kind of job is reported.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `copy` or `sync`.
    Copy { dry_run: bool },
    /// `verify`: files and bytes counted are compared, not copied.
    Verify,
}

/// A job `sluice serve` runs for a client copying to this host: SRC is
/// the client's tree, read back across the connection, and the
/// connection's flag stops the job (the client was interrupted or lost).
pub struct Pushed {
    pub source: Arc<dyn sluice_engine::source::Source>,
    pub cancel: Arc<AtomicBool>,
}

/// Runs a job (`copy`, `sync`, `verify`) and returns its exit code.
pub fn run_job(
    args: &JobArgs,
    kind: Kind,
    opts: Result<CopyOptions, String>,
    pushed: Option<Pushed>,
) -> u8 {
    let pairs = match kind {
        Kind::Verify => args
            .one_pair("verify")
            .map(|()| vec![(args.src.clone(), args.dst.clone())]),
        Kind::Copy { .. } => args.pairs(),
    };
    let (mut opts, pairs) = match (opts, pairs) {
        (Ok(o), Ok(p)) => (o, p),
        (Err(msg), _) | (_, Err(msg)) => {
            eprintln!("sluice: error: {msg}");
            return 2;
        }
    };
    // One of several MPI ranks: this process does its part of the job.
    let ranks = match join_ranks(&mut opts, pushed.is_some()) {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("sluice: error: {msg}");
            return 2;
        }
    };
    // Only rank 0 speaks for the job.
    let speaks = ranks.as_ref().is_none_or(|r| r.rank == 0);
    if let (Some(saved), false, true) = (args.saved_probe(), args.show.json, speaks) {
        eprintln!(
            "sluice: -j auto starts at {} streams, as `sluice probe --save` found for {} -> {}",
            opts.jobs,
            saved.src.display(),
            saved.dst.display()
        );
    }
    if pushed.is_none() {
        if let Location::Remote { user, host, path } = Location::parse(args.dst.as_os_str()) {
            let login = Location::login(&user, &host);
            return crate::remote::push(args, &login, &path);
        }
    }
    let cancel = match &pushed {
        Some(p) => p.cancel.clone(),
        None => cancel_on_signals(),
    };
    let stats = Arc::new(Stats::default());
    let dry_run = matches!(kind, Kind::Copy { dry_run: true });
    let printer = match Printer::for_show(&args.show, dry_run) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("sluice: error: {msg}");
            return 2;
        }
    };
    let start = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    if let Some(r) = &ranks {
        r.watch(stats.clone());
    }
    let ticker = ((args.show.bar() || args.show.json) && speaks).then(|| {
        let stats = stats.clone();
        let ranks = ranks.clone();
        let draw = Draw {
            bar: args.show.bar(),
            json: args.show.json,
        };
        progress(&printer, draw, done.clone(), cancel.clone(), move || {
            // Rank 0 shows the job's progress: every rank's counters.
            let mine = stats.progress();
            let job = ranks.as_ref().map_or(mine, |r| mine.add(&r.elsewhere()));
            copy_tick(job, start.elapsed())
        })
    });
    // Several sources run one after another into the same counters, so
    // one summary covers them all; a fatal error stops the rest.
    let mut result = Ok(Outcome::Complete);
    let mut lost = None;
    let mut wire = None;
    for (src, dst) in &pairs {
        // Where SRC is read from: this host, the client of a push, or a
        // `sluice serve` started on SRC's host (the engine runs here).
        let opened = match Opened::open(src, pushed.as_ref(), &args.remote, &cancel) {
            Ok(o) => o,
            Err(msg) => {
                done.store(true, Relaxed);
                eprintln!("sluice: error: {msg}");
                if let Some(r) = &ranks {
                    r.abort(2);
                }
                return 2;
            }
        };
        let one = sluice_engine::copy_from(
            &opened.source,
            &opened.path,
            dst,
            opts.clone(),
            stats.clone(),
            printer.clone(),
            cancel.clone(),
        );
        wire = opened.source.wire().or(wire);
        lost = opened.close();
        // (an earlier Err or Interrupted broke the loop already)
        result = match (result, one) {
            (Ok(Outcome::Partial), Ok(Outcome::Complete)) => Ok(Outcome::Partial),
            (_, one) => one,
        };
        if !matches!(result, Ok(Outcome::Complete | Outcome::Partial)) {
            break;
        }
    }
    let elapsed = start.elapsed();
    stop_ticker(&done, ticker);
    printer.flush_log();
    let summary = stats.summary(elapsed);
    if let (Some(r), Err(e)) = (&ranks, &result) {
        // The others would wait for this rank at the end.
        eprintln!("sluice: error: rank {}: {e}", r.rank);
        r.abort(2);
    }
    let verify = kind == Kind::Verify;
    let (code, outcome) = match &result {
        // The connection dropped: the job stopped as for a signal, with
        // its state saved; that is a failure, not an interruption.
        _ if lost.is_some() => (2, "failed"),
        Ok(Outcome::Complete) if verify => (0, "identical"),
        // Differences, or entries that could not be compared (also listed).
        Ok(Outcome::Partial) if verify && summary.errors == 0 => (1, "differs"),
        Ok(Outcome::Complete) => (0, "complete"),
        Ok(Outcome::Partial) => (1, "partial"),
        Ok(Outcome::Interrupted) => (130, "interrupted"),
        Err(_) => (2, "failed"),
    };
    if let Err(e) = &result {
        if args.show.json {
            println!("{}", json!({"type": "fatal", "error": e.to_string()}));
        }
        eprintln!("sluice: error: {e}");
        if let JobError::Fatal(_) = e {
            eprintln!("sluice: nothing partial was left under a final name");
        }
    }
    if let Some(why) = &lost {
        eprintln!(
            "sluice: error: the connection to the remote host was lost ({why}); run the same \
             command again to finish"
        );
    } else if result.as_ref().is_ok_and(|o| *o == Outcome::Interrupted) {
        eprintln!(
            "sluice: interrupted {}; run the same command again to finish",
            stopped_by()
        );
    }
    let Some((summary, code, outcome, per_rank)) = gather_ranks(ranks, summary, code, outcome)
    else {
        return code; // rank 0 speaks
    };
    if args.show.json {
        let mut v = summary_json(&summary, outcome, kind, wire.as_ref());
        if let Some(per_rank) = per_rank {
            v["ranks"] = per_rank;
        }
        println!("{v}");
    } else if !args.show.quiet
        && !matches!(
            result,
            Err(JobError::Usage(_) | JobError::Source { .. } | JobError::Destination { .. })
        )
    {
        print!("{}", summary_table(&summary, kind, wire.as_ref()));
    }
    code
}

/// Joins the MPI job this process was launched in, if it was (and is not
/// a `serve` answering a client), giving the job this rank's part of it.
fn join_ranks(opts: &mut CopyOptions, served: bool) -> Result<Option<Arc<Ranks>>, String> {
    if served || !crate::ranks::launched() {
        return Ok(None);
    }
    if opts.shard.is_some() {
        return Err(
            "--shard splits a job between processes that MPI already splits it \
                    between; give one or the other"
                .into(),
        );
    }
    let ranks = Ranks::join()?;
    opts.shard = Some(Shard {
        index: ranks.rank,
        count: ranks.size,
    });
    opts.group = Some(ranks.clone());
    Ok(Some(ranks))
}

/// Every rank's summary, shared at the end: rank 0 gets the job's (with
/// the worst code of any rank, and per-rank figures for `--json`); the
/// other ranks `None`, having nothing to print. Leaves the MPI job.
#[allow(clippy::type_complexity)]
fn gather_ranks(
    ranks: Option<Arc<Ranks>>,
    summary: Summary,
    code: u8,
    outcome: &'static str,
) -> Option<(Summary, u8, &'static str, Option<serde_json::Value>)> {
    let Some(ranks) = ranks else {
        return Some((summary, code, outcome, None));
    };
    let all = ranks.share(&summary, code);
    ranks.leave();
    if ranks.rank != 0 {
        return None;
    }
    let (job, worst) = crate::ranks::reduce(&all);
    let per_rank: Vec<_> = all
        .iter()
        .enumerate()
        .map(|(rank, (s, code))| {
            json!({
                "rank": rank,
                "files_copied": s.files_copied,
                "bytes_copied": s.bytes_copied,
                "entries": s.files_copied + s.dirs_created + s.symlinks + s.hardlinks + s.specials
                    + s.files_skipped + s.deleted,
                "stream_seconds": ms(s.busy.total()),
                "elapsed_s": ms(s.elapsed.as_secs_f64()),
                "errors": s.errors,
                "exit": code,
            })
        })
        .collect();
    let outcome = if worst == code {
        outcome
    } else {
        outcome_of(worst, outcome)
    };
    Some((job, worst, outcome, Some(json!(per_rank))))
}

/// The outcome word of an exit code another rank ended with (`mine`:
/// this rank's word, which says whether the job verifies).
fn outcome_of(code: u8, mine: &str) -> &'static str {
    let verify = matches!(mine, "identical" | "differs");
    match code {
        0 if verify => "identical",
        1 if verify => "differs",
        0 => "complete",
        1 => "partial",
        130 => "interrupted",
        _ => "failed",
    }
}

/// The last stop signal received (0: none), for the closing message.
static SIGNAL: std::sync::OnceLock<Arc<std::sync::atomic::AtomicUsize>> =
    std::sync::OnceLock::new();

/// A flag set by SIGINT, SIGTERM or SIGHUP (a closed terminal, which
/// must not end a job silently): the job stops at its next boundary, well
/// within a second, with its state saved.
pub fn cancel_on_signals() -> Arc<AtomicBool> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let cancel = Arc::new(AtomicBool::new(false));
    let which = SIGNAL.get_or_init(Arc::default);
    for sig in [SIGINT, SIGTERM, SIGHUP] {
        let _ = signal_hook::flag::register_usize(sig, which.clone(), sig as usize);
        let _ = signal_hook::flag::register(sig, cancel.clone());
    }
    cancel
}

/// What stopped the job, in words, for the "interrupted" line.
pub fn stopped_by() -> &'static str {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    match SIGNAL.get().map_or(0, |s| s.load(Relaxed)) as i32 {
        SIGHUP => "by SIGHUP (the terminal closed)",
        SIGTERM => "by SIGTERM",
        SIGINT => "by SIGINT",
        _ => "",
    }
}

/// Where progress goes.
#[derive(Clone, Copy)]
pub struct Draw {
    /// On stderr: a redrawn bar on a terminal, else a line a second.
    pub bar: bool,
    /// On stdout: a `{"type":"progress"}` object a second.
    pub json: bool,
}

/// What a job has done so far, for the bar and `--json`.
pub struct Tick {
    /// The text beside the bar (or the whole line without a terminal).
    pub line: String,
    /// How much of the job is done, once its total is known (the walk is
    /// over); before that no bar, no percentage, no ETA.
    pub fraction: Option<f64>,
    /// The `--json` progress object (a timestamp is added).
    pub json: serde_json::Value,
}

/// Reports `tick()` until `done`: on a terminal a bar (with a percentage
/// once the total is known) redrawn 5 times a second; without one, with
/// `--progress`, a line every second from the start; with `--json`, a
/// progress object every second. When `cancel` is set (a signal), it says
/// at once that the job is stopping; the bar is cleared at the end, never
/// left frozen.
pub fn progress(
    printer: &Printer,
    draw: Draw,
    done: Arc<AtomicBool>,
    cancel: Arc<AtomicBool>,
    mut tick: impl FnMut() -> Tick + Send + 'static,
) -> std::thread::JoinHandle<()> {
    let terminal = draw.bar && std::io::stderr().is_terminal();
    let walking =
        ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}").expect("valid template");
    let counting = ProgressStyle::with_template(
        "{spinner} {elapsed_precise} [{bar:24}] {percent:>3}% {wide_msg}",
    )
    .expect("valid template")
    .progress_chars("=> ");
    let bar = terminal.then(|| {
        let bar = ProgressBar::with_draw_target(Some(1000), ProgressDrawTarget::stderr_with_hz(5));
        bar.set_style(walking.clone());
        *printer.bar.lock().expect("bar lock") = Some(bar.clone());
        bar
    });
    std::thread::spawn(move || {
        let mut last_line = Instant::now();
        let (mut counted, mut told_stop) = (false, false);
        while !done.load(Relaxed) {
            if cancel.load(Relaxed) && !told_stop {
                told_stop = true;
                let msg = format!("sluice: stopping {}; state is kept", stopped_by());
                match &bar {
                    Some(bar) => bar.suspend(|| eprintln!("{msg}")),
                    None => eprintln!("{msg}"),
                }
            }
            let t = tick();
            let second = last_line.elapsed() >= Duration::from_secs(1);
            match &bar {
                Some(bar) => {
                    if let (Some(f), false) = (t.fraction, counted) {
                        bar.set_style(counting.clone());
                        counted = true;
                        bar.set_position((f * 1000.0) as u64);
                    } else if let Some(f) = t.fraction {
                        bar.set_position((f.clamp(0.0, 1.0) * 1000.0) as u64);
                    }
                    bar.set_message(t.line.clone());
                    bar.tick();
                }
                None if draw.bar && second => {
                    let pct = t
                        .fraction
                        .map_or(String::new(), |f| format!("{:.0}%  ", f * 100.0));
                    eprintln!("sluice: {pct}{}", t.line);
                }
                None => {}
            }
            if draw.json && second {
                let mut j = t.json;
                j["type"] = json!("progress");
                j["time"] = json!(unix_time());
                let _ = writeln!(std::io::stdout().lock(), "{j}");
            }
            if second {
                last_line = Instant::now();
            }
            // Woken at once when the job ends (see `stop_ticker`).
            std::thread::park_timeout(Duration::from_millis(200));
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
    })
}

/// Ends the progress thread without waiting out its nap (it used to add
/// up to 0.2 s to every run, and to the elapsed time it reported).
pub fn stop_ticker(done: &AtomicBool, ticker: Option<std::thread::JoinHandle<()>>) {
    done.store(true, Relaxed);
    if let Some(t) = ticker {
        t.thread().unpark();
        let _ = t.join();
    }
}

/// Seconds since the Unix epoch, to the millisecond.
fn unix_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| (d.as_millis() as f64) / 1000.0)
}

/// "  ETA h:mm:ss" for `left` bytes at `speed` bytes/s; empty when unknown.
pub fn eta(left: f64, speed: f64) -> String {
    if speed <= 0.0 || left <= 0.0 {
        return String::new();
    }
    let secs = (left / speed) as u64;
    format!(
        "  ETA {}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A per-second rate with sensible precision (`0.3`, `12`, `9285`).
fn per_s(n: f64, elapsed: Duration) -> String {
    let r = rate(n, elapsed);
    if r < 10.0 {
        format!("{r:.1}")
    } else {
        format!("{r:.0}")
    }
}

pub fn rate(n: f64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 {
        n / s
    } else {
        0.0
    }
}

/// Progress of a copy, sync or verify. Bytes count as they are written
/// (a big file's count as copied only once committed), or as compared.
fn copy_tick(p: Progress, elapsed: Duration) -> Tick {
    let Progress {
        done,
        found,
        bytes,
        bytes_found,
        ..
    } = p;
    let speed = rate(bytes as f64, elapsed);
    let walked = p.walk_done();
    let line = if walked {
        format!(
            "{done}/{found} entries  {}/{}  {}/s  {} files/s{}",
            human_bytes(bytes as f64),
            human_bytes(bytes_found as f64),
            human_bytes(speed),
            per_s(p.files as f64, elapsed),
            eta(bytes_found.saturating_sub(bytes) as f64, speed)
        )
    } else {
        format!(
            "still listing: {found} entries, {} found  ·  {done} done, {}  {}/s",
            human_bytes(bytes_found as f64),
            human_bytes(bytes as f64),
            human_bytes(speed),
        )
    };
    let fraction = walked.then(|| {
        if bytes_found > 0 {
            (bytes as f64 / bytes_found as f64).min(1.0)
        } else if found > 0 {
            (done as f64 / found as f64).min(1.0)
        } else {
            1.0
        }
    });
    let json = json!({
        "elapsed_s": ms(elapsed.as_secs_f64()),
        "walk_done": walked,
        "entries_done": done,
        "entries_found": found,
        "bytes_done": bytes,
        "bytes_found": bytes_found,
        "bytes_per_s": speed.round(),
    });
    Tick {
        line,
        fraction,
        json,
    }
}

/// The version of the `--json` objects' fields: raised when a field changes
/// meaning or goes away (new fields do not raise it).
pub const SCHEMA: u32 = 1;

/// The `{"type":"summary", ...}` object closing a `--json` stream.
pub fn summary_json(
    s: &Summary,
    outcome: &str,
    kind: Kind,
    wire: Option<&Wire>,
) -> serde_json::Value {
    let secs = s.elapsed.as_secs_f64();
    let (copied, bytes) = match kind {
        Kind::Copy { .. } => (s.files_copied, s.bytes_copied),
        Kind::Verify => (0, 0),
    };
    let mut v = json!({
        "type": "summary",
        "schema": SCHEMA,
        "dry_run": kind == (Kind::Copy { dry_run: true }),
        "outcome": outcome,
        "files_copied": copied,
        "bytes_copied": bytes,
        "files_skipped": s.files_skipped,
        "errors": s.errors,
        "elapsed_s": ms(secs),
    });
    let rest = match kind {
        Kind::Copy { .. } => json!({
            "dirs_created": s.dirs_created,
            "symlinks": s.symlinks,
            "hardlinks": s.hardlinks,
            "specials": s.specials,
            "files_unchanged": s.unchanged,
            "files_excluded": s.files_skipped - s.unchanged,
            "deleted": s.deleted,
            "retries": s.retries,
            "files_per_s": rate(s.files_copied as f64, s.elapsed).round(),
            "bytes_per_s": rate(s.bytes_copied as f64, s.elapsed).round(),
        }),
        Kind::Verify => json!({
            "files_verified": s.files_copied,
            "bytes_verified": s.bytes_copied,
            "differences": s.differences,
            "files_per_s": rate(s.files_copied as f64, s.elapsed).round(),
            "bytes_per_s": rate(s.bytes_copied as f64, s.elapsed).round(),
        }),
    };
    let (serde_json::Value::Object(m), serde_json::Value::Object(r)) = (&mut v, rest) else {
        unreachable!("both are objects")
    };
    m.extend(r);
    m.insert("stream_seconds".into(), busy_json(&s.busy));
    m.insert("streams".into(), json!(s.streams));
    if !s.streams_trace.is_empty() {
        m.insert("streams_trace".into(), json!(s.streams_trace));
        m.insert("chunk_streams_trace".into(), json!(s.chunk_streams_trace));
    }
    m.insert("bottleneck".into(), json!(s.bottleneck(wire)));
    m.insert("max_rss_bytes".into(), json!(s.peak_rss));
    if let Some(w) = wire {
        let mut w = wire_json(w);
        w["destination_host"] = json!({"cpu_s": ms(s.cpu.as_secs_f64())});
        m.insert("wire".into(), w);
    }
    v
}

/// Seconds rounded to the millisecond, for `--json`.
pub fn ms(secs: f64) -> f64 {
    (secs * 1000.0).round() / 1000.0
}

/// Stream-seconds per activity, for `--json`.
pub fn busy_json(b: &Busy) -> serde_json::Value {
    json!({
        "walk": ms(b.walk),
        "read": ms(b.read),
        "write": ms(b.write),
        "kernel_copy": ms(b.copy),
        "journal_wait": ms(b.journal),
        "idle": ms(b.idle),
        "parked": ms(b.parked),
    })
}

/// Where the streams' time went, as shares, and the verdict.
pub fn busy_line(b: &Busy, verdict: Option<&str>) -> String {
    let total = b.total();
    let Some(verdict) = verdict.filter(|_| total > 0.0) else {
        return String::new(); // too short to say anything true
    };
    let pct = |x: f64| (100.0 * x / total).round();
    format!(
        "streams: {}% walk, {}% read, {}% write, {}% kernel copy, {}% journal, {}% idle: {}\n",
        pct(b.walk),
        pct(b.read),
        pct(b.write),
        pct(b.copy),
        pct(b.journal),
        pct(b.idle),
        verdict
    )
}

/// The human summary printed at the end of a run.
/// What crossed the connections to another host, for `--json`.
pub fn wire_json(w: &Wire) -> serde_json::Value {
    let mut v = json!({"data_streams": w.streams, "streams_dropped": w.streams_dropped,
                       "bytes_received": w.bytes_received, "bytes_sent": w.bytes_sent});
    if let Some(far) = &w.far {
        v["source_host"] =
            json!({"cpu_s": ms(far.cpu), "disk_s": ms(far.disk), "cores": far.cores});
    }
    v
}

/// What crossed the connections to another host, for the summary table.
pub fn wire_line(w: &Wire) -> String {
    let over = match w.streams {
        0 => "over ssh".to_string(),
        1 => "1 data stream beside ssh".to_string(),
        n => format!("{n} data streams beside ssh"),
    };
    let over = match w.streams_dropped {
        0 => over,
        k => format!("{over}; {k} broke mid-job"),
    };
    format!(
        "wire: {} received, {} sent ({over})",
        human_bytes(w.bytes_received as f64),
        human_bytes(w.bytes_sent as f64)
    )
}

pub fn summary_table(s: &Summary, kind: Kind, wire: Option<&Wire>) -> String {
    let secs = s.elapsed.as_secs_f64();
    let verb = match kind {
        Kind::Copy { dry_run: true } => "would copy",
        Kind::Copy { dry_run: false } => "files copied",
        Kind::Verify => "files verified",
    };
    let mut t = String::new();
    t += &format!("{:<14}{:>14}{:>14}\n", "", "entries", "bytes");
    t += &format!(
        "{:<14}{:>14}{:>14}\n",
        verb,
        s.files_copied,
        human_bytes(s.bytes_copied as f64)
    );
    let rows: &[(&str, u64)] = match kind {
        Kind::Copy { .. } => &[
            ("directories", s.dirs_created),
            ("symlinks", s.symlinks),
            ("hard links", s.hardlinks),
            ("special files", s.specials),
            // The same words as the JSON: skipped = unchanged + excluded.
            ("skipped", s.files_skipped),
            ("  unchanged", s.unchanged),
            ("  excluded", s.files_skipped - s.unchanged),
            ("deleted", s.deleted),
            ("failed", s.errors),
        ],
        Kind::Verify => &[
            ("directories", s.dirs_created),
            ("symlinks", s.symlinks),
            ("special files", s.specials),
            ("differences", s.differences),
            ("skipped", s.files_skipped),
            ("failed", s.errors),
        ],
    };
    for (label, n) in rows {
        t += &format!("{label:<14}{n:>14}\n");
    }
    if kind == (Kind::Copy { dry_run: true }) {
        // Nothing moved: rates and where the streams' time went would only
        // describe the walk, and read like a copy's.
        t += &format!("dry run: nothing written; walked in {secs:.2} s\n");
        return t;
    }
    t += &format!(
        "time {:.2} s, {}/s, {} files/s\n",
        secs,
        human_bytes(rate(s.bytes_copied as f64, s.elapsed)),
        per_s(s.files_copied as f64, s.elapsed)
    );
    t += &busy_line(&s.busy, s.bottleneck(wire));
    if s.peak_rss > 0 {
        t += &format!("peak memory {}\n", human_bytes(s.peak_rss as f64));
    }
    if let Some(w) = wire {
        t += &wire_line(w);
        t += "\n";
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Summary {
        Summary {
            files_copied: 200_000,
            bytes_copied: 204_800_000,
            dirs_created: 421,
            symlinks: 3,
            hardlinks: 2,
            specials: 1,
            files_skipped: 10,
            unchanged: 6,
            deleted: 7,
            differences: 0,
            retries: 0,
            busy: Busy {
                idle: 1.0,
                walk: 10.0,
                read: 20.0,
                write: 60.0,
                copy: 5.0,
                journal: 4.0,
                parked: 0.0,
            },
            peak_rss: 0,
            cpu: Duration::from_secs(30),
            streams: 8,
            streams_trace: Vec::new(),
            chunk_streams_trace: Vec::new(),
            errors: 5,
            throttle_wait: Duration::ZERO,
            elapsed: Duration::from_millis(21_540),
        }
    }

    #[test]
    fn summary_table_snapshot() {
        let want = concat!(
            "                     entries         bytes\n",
            "files copied          200000     195.3 MiB\n",
            "directories              421\n",
            "symlinks                   3\n",
            "hard links                 2\n",
            "special files              1\n",
            "skipped                   10\n",
            "  unchanged                6\n",
            "  excluded                 4\n",
            "deleted                    7\n",
            "failed                     5\n",
            "time 21.54 s, 9.1 MiB/s, 9285 files/s\n",
            "streams: 10% walk, 20% read, 60% write, 5% kernel copy, 4% journal, 1% idle: ",
            "bound by target writes: more streams help only while the target has latency to hide\n",
        );
        assert_eq!(
            summary_table(&sample(), Kind::Copy { dry_run: false }, None),
            want
        );
    }

    #[test]
    fn summary_json_snapshot() {
        let got =
            summary_json(&sample(), "partial", Kind::Copy { dry_run: false }, None).to_string();
        let want = r#"{"type":"summary","schema":1,"dry_run":false,"outcome":"partial","files_copied":200000,"bytes_copied":204800000,"files_skipped":10,"errors":5,"elapsed_s":21.54,"dirs_created":421,"symlinks":3,"hardlinks":2,"specials":1,"files_unchanged":6,"files_excluded":4,"deleted":7,"retries":0,"files_per_s":9285.0,"bytes_per_s":9507892.0,"stream_seconds":{"walk":10.0,"read":20.0,"write":60.0,"kernel_copy":5.0,"journal_wait":4.0,"idle":1.0,"parked":0.0},"streams":8,"bottleneck":"bound by target writes: more streams help only while the target has latency to hide","max_rss_bytes":0}"#;
        assert_eq!(got, want);
    }

    #[test]
    fn across_a_wire_the_verdict_names_the_side_and_the_loads_are_in_the_json() {
        let mut s = sample();
        s.busy.read = 200.0; // the streams waited on the source's host
        s.cpu = Duration::from_secs(4);
        let wire = Wire {
            streams: 4,
            bytes_received: 1 << 30,
            far: Some(sluice_engine::gauge::Load {
                disk: 3.0,
                cpu: 5.0,
                cores: 2,
            }),
            ..Wire::default()
        };
        let table = summary_table(&s, Kind::Copy { dry_run: false }, Some(&wire));
        assert!(
            table.contains(": bound by the link between the hosts"),
            "{table}"
        );
        assert!(
            table.ends_with("wire: 1.0 GiB received, 0 B sent (4 data streams beside ssh)\n"),
            "{table}"
        );
        let v = summary_json(&s, "complete", Kind::Copy { dry_run: false }, Some(&wire));
        assert_eq!(
            v["wire"]["source_host"],
            json!({"cpu_s": 5.0, "disk_s": 3.0, "cores": 2})
        );
        assert_eq!(v["wire"]["destination_host"], json!({"cpu_s": 4.0}));
        let mut busy_disk = wire;
        busy_disk.far = Some(sluice_engine::gauge::Load {
            disk: 150.0,
            ..wire.far.unwrap()
        });
        let v = summary_json(
            &s,
            "complete",
            Kind::Copy { dry_run: false },
            Some(&busy_disk),
        );
        assert!(
            v["bottleneck"]
                .as_str()
                .unwrap()
                .starts_with("bound by the source host's disk"),
            "{v}"
        );
    }

    #[test]
    fn small_rates_keep_a_decimal() {
        assert_eq!(per_s(1.0, Duration::from_secs(8)), "0.1");
        assert_eq!(per_s(100.0, Duration::from_secs(8)), "12");
    }
}
