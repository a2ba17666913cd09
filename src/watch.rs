//! `sluice watch`: runs the engine's watch and reports its passes, the
//! replication lag, and DST's outages.

use crate::args::WatchArgs;
use crate::output::{cancel_on_signals, ms, Printer};
use crate::size::human_bytes;
use serde_json::json;
use sluice_engine::watch::{Pass, Totals, WatchOptions, WatchReporter};
use sluice_engine::{EntryError, Reporter, Side};
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct WatchPrinter {
    json: bool,
    quiet: bool,
    entries: Arc<Printer>,
    /// Said once, after the first sync: the watch is alive.
    told_alive: std::sync::atomic::AtomicBool,
}

impl Reporter for WatchPrinter {
    fn entry_failed(&self, err: &EntryError) {
        self.entries.entry_failed(err)
    }
    fn entry_skipped(&self, path: &[u8], why: &str) {
        self.entries.entry_skipped(path, why)
    }
    fn entry_deleted(&self, path: &[u8]) {
        self.entries.entry_deleted(path)
    }
    fn entry_differs(&self, side: Side, src: &[u8], dst: &[u8], what: &str) {
        self.entries.entry_differs(side, src, dst, what)
    }
    fn notice(&self, path: &[u8], what: &str) {
        self.entries.notice(path, what)
    }
    fn entry_changed(&self, path: &[u8], action: &str, why: &[&'static str]) {
        self.entries.entry_changed(path, action, why)
    }
}

/// The value at quantile `q` of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn line(v: serde_json::Value) {
    let _ = writeln!(std::io::stdout().lock(), "{v}");
}

impl WatchReporter for WatchPrinter {
    fn pass(&self, p: &Pass) {
        let s = &p.summary;
        if self.json {
            line(json!({
                "type": "pass",
                "full": p.full,
                "reason": p.reason,
                "dirs": p.dirs,
                "changes": p.changes,
                "files_copied": s.files_copied,
                "bytes_copied": s.bytes_copied,
                "deleted": s.deleted,
                "errors": s.errors,
                "elapsed_s": ms(s.elapsed.as_secs_f64()),
                "lag_median_s": ms(quantile(&p.lags, 0.5)),
                "lag_max_s": ms(quantile(&p.lags, 1.0)),
            }));
        }
        let first = !self
            .told_alive
            .swap(true, std::sync::atomic::Ordering::Relaxed);
        if first && self.json {
            line(json!({"type": "watching", "dirs": p.watching}));
        }
        if self.quiet {
            return;
        }
        let what = if p.full {
            format!("full sync ({})", p.reason)
        } else {
            format!(
                "{} in {}",
                count(p.changes as u64, "change"),
                count(p.dirs as u64, "directory")
            )
        };
        let lag = if p.lags.is_empty() {
            String::new()
        } else {
            format!(
                "; lag median {:.2} s, max {:.2} s",
                quantile(&p.lags, 0.5),
                quantile(&p.lags, 1.0)
            )
        };
        eprintln!(
            "sluice: watch: {} {what}: {} ({}) copied, {} deleted, {} in {:.2} s{lag}",
            clock(),
            count(s.files_copied, "file"),
            human_bytes(s.bytes_copied as f64),
            s.deleted,
            count(s.errors, "error"),
            s.elapsed.as_secs_f64()
        );
        if first {
            eprintln!(
                "sluice: watch: watching {}; Ctrl-C to stop",
                count(p.watching as u64, "directory")
            );
        }
    }

    fn unavailable(&self, side: Side, why: &str) {
        let (kind, name) = match side {
            Side::Src => ("src_unavailable", "SRC"),
            Side::Dst => ("dst_unavailable", "DST"),
        };
        if self.json {
            line(json!({"type": kind, "reason": why}));
        }
        eprintln!("sluice: watch: {name} unavailable: {why}");
    }

    fn available(&self) {
        if self.json {
            line(json!({"type": "dst_available"}));
        }
        eprintln!("sluice: watch: SRC and DST are back; catching up");
    }

    fn warning(&self, msg: &str) {
        if self.json {
            line(json!({"type": "warning", "message": msg}));
        }
        eprintln!("sluice: watch: warning: {msg}");
    }
}

pub fn run(args: &WatchArgs) -> ExitCode {
    if let Err(msg) = args.options(true) {
        eprintln!("sluice: error: {msg}");
        return ExitCode::from(2);
    }
    if let Err(msg) = args.job.one_pair("watch") {
        eprintln!("sluice: error: {msg}");
        return ExitCode::from(2);
    }
    if args.rescan.is_nan() || args.rescan <= 0.0 {
        eprintln!("sluice: error: --rescan must be a positive number of seconds");
        return ExitCode::from(2);
    }
    let entries = match Printer::for_show(&args.job.show, false) {
        Ok(p) => p,
        Err(msg) => {
            eprintln!("sluice: error: {msg}");
            return ExitCode::from(2);
        }
    };
    let cancel = cancel_on_signals();
    let printer = Arc::new(WatchPrinter {
        json: args.job.show.json,
        quiet: args.job.show.no_progress && args.job.show.json,
        entries,
        told_alive: Default::default(),
    });
    let wopts = WatchOptions {
        rescan: Duration::from_secs_f64(args.rescan),
        ..WatchOptions::default()
    };
    let start = Instant::now();
    let options = |full: bool| args.options(full).expect("checked above");
    let result = sluice_engine::watch::watch(
        &args.job.src,
        &args.job.dst,
        &options,
        &wopts,
        printer,
        cancel,
    );
    match result {
        Err(e) => {
            if args.job.show.json {
                line(json!({"type": "fatal", "error": e.to_string()}));
            }
            eprintln!("sluice: error: {e}");
            ExitCode::from(2)
        }
        Ok(t) => {
            summary(&t, start.elapsed(), args.job.show.json);
            ExitCode::from(if t.errors > 0 { 1 } else { 0 })
        }
    }
}

fn summary(t: &Totals, elapsed: Duration, json_out: bool) {
    let mut lags = t.lags.clone();
    lags.sort_by(f64::total_cmp);
    if json_out {
        line(json!({
            "type": "summary",
            "outcome": if t.errors > 0 { "partial" } else { "complete" },
            "files_copied": t.files_copied,
            "bytes_copied": t.bytes_copied,
            "files_skipped": 0,
            "errors": t.errors,
            "elapsed_s": ms(elapsed.as_secs_f64()),
            "deleted": t.deleted,
            "passes": t.passes,
            "full_passes": t.full_passes,
            "changes": t.changes,
            "lag_median_s": ms(quantile(&lags, 0.5)),
            "lag_p90_s": ms(quantile(&lags, 0.9)),
            "lag_max_s": ms(quantile(&lags, 1.0)),
        }));
        return;
    }
    println!(
        "watched {:.0} s: {} passes ({} full), {} changes, {} files ({}) copied, {} deleted, {} errors",
        elapsed.as_secs_f64(),
        t.passes,
        t.full_passes,
        t.changes,
        t.files_copied,
        human_bytes(t.bytes_copied as f64),
        t.deleted,
        t.errors
    );
    if !lags.is_empty() {
        println!(
            "replication lag: median {:.2} s, 90th percentile {:.2} s, max {:.2} s",
            quantile(&lags, 0.5),
            quantile(&lags, 0.9),
            quantile(&lags, 1.0)
        );
    }
}

/// The time of day, UTC, for a pass line (`14:03:27Z`).
fn clock() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let day = secs % 86_400;
    format!("{:02}:{:02}:{:02}Z", day / 3600, day / 60 % 60, day % 60)
}

/// `1 file`, `2 files`, `1 directory`, `3 directories`.
fn count(n: u64, one: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else if let Some(stem) = one.strip_suffix('y') {
        format!("{n} {stem}ies")
    } else {
        format!("{n} {one}s")
    }
}
