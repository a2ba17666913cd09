//! `sluice probe SRC DST`: short trial copies from the real SRC into a
//! scratch directory inside DST, at 1, 2, 4, 8, ... streams, small files
//! and big files apart, until throughput stops rising. Prints what each
//! trial reached and where its streams' time went, recommends a stream
//! count for each kind of work, and removes everything it wrote.

use crate::args::ProbeArgs;
use serde_json::json;
use sluice_engine::{CopyOptions, EntryError, Reporter, Stats};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Trial errors are counted, not printed: a probe is a measurement.
struct Quiet;

impl Reporter for Quiet {
    fn entry_failed(&self, _: &EntryError) {}
    fn entry_skipped(&self, _: &[u8], _: &str) {}
    fn entry_deleted(&self, _: &[u8]) {}
    fn entry_differs(&self, _: &[u8], _: &str) {}
}

const STREAMS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// What one trial reached.
struct Trial {
    streams: usize,
    files_per_s: f64,
    bytes_per_s: f64,
    /// Shares of the working streams' time: walk, read, write, idle.
    shares: [f64; 4],
    found: u64,
}

pub fn run(args: &ProbeArgs) -> ExitCode {
    let scratch = args
        .dst
        .join(format!(".sluice-probe-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&scratch) {
        eprintln!("sluice: error: cannot create {}: {e}", scratch.display());
        return ExitCode::from(2);
    }
    let cold = !args.warm && sluice_engine::can_drop_caches();
    if !cold && !args.warm && !args.json {
        eprintln!("sluice: not root: trials after the first read a warm page cache");
    }
    let classes = [
        ("small files (< 1 MiB)", (0, 1 << 20), true),
        ("big files (>= 1 MiB)", (1 << 20, u64::MAX), false),
    ];
    let mut picks = Vec::new();
    for (label, window, by_files) in classes {
        if !args.json {
            println!("{label}");
            println!(
                "{:>8} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6}",
                "streams", "files/s", "MB/s", "walk", "read", "write", "idle"
            );
        }
        let (mut best, mut best_n, mut stalls) = (0.0, None, 0);
        for n in STREAMS {
            let Some(t) = trial(args, &scratch, n, window, cold) else {
                break;
            };
            if t.found == 0 {
                if !args.json {
                    println!("{:>8} none in SRC", "-");
                }
                break;
            }
            report(args.json, label, &t);
            let rate = if by_files {
                t.files_per_s
            } else {
                t.bytes_per_s
            };
            if rate > best * 1.05 {
                (best, best_n, stalls) = (rate, Some(n), 0);
            } else {
                stalls += 1;
                if stalls == 2 {
                    break; // two steps without a gain: it has stopped rising
                }
            }
        }
        picks.push((label, best_n));
    }
    let _ = std::fs::remove_dir_all(&scratch);
    for (label, n) in &picks {
        match (n, args.json) {
            (Some(n), false) => println!("recommendation for {label}: -j {n}"),
            (Some(n), true) => println!(
                "{}",
                json!({"type": "recommendation", "class": label, "streams": n})
            ),
            (None, _) => {}
        }
    }
    if !args.json {
        println!("(-j auto, the default, tunes this while a job runs)");
    }
    ExitCode::SUCCESS
}

/// Copies SRC's files in `window` into a fresh directory for `seconds`
/// at `n` streams, then removes it.
fn trial(
    args: &ProbeArgs,
    scratch: &Path,
    n: usize,
    window: (u64, u64),
    cold: bool,
) -> Option<Trial> {
    if cold {
        sluice_engine::drop_caches();
    }
    let out = scratch.join(format!("trial-{n}"));
    let stats = Arc::new(Stats::default());
    let cancel = Arc::new(AtomicBool::new(false));
    let timer = {
        let cancel = cancel.clone();
        let secs = args.seconds;
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs_f64(secs));
            cancel.store(true, Relaxed);
        })
    };
    drop(timer); // it only sets a flag; a finished trial ignores it
    let opts = CopyOptions {
        jobs: n,
        auto_jobs: false,
        size_window: Some(window),
        ..CopyOptions::default()
    };
    let start = Instant::now();
    let res = sluice_engine::copy(
        &args.src,
        &out,
        opts,
        stats.clone(),
        Arc::new(Quiet),
        cancel,
    );
    let secs = start.elapsed().as_secs_f64().max(1e-3);
    let _ = std::fs::remove_dir_all(&out);
    if let Err(e) = res {
        eprintln!("sluice: error: {e}");
        return None;
    }
    let s = stats.summary(start.elapsed());
    let b = s.busy;
    let work = b.total().max(1e-9);
    Some(Trial {
        streams: n,
        files_per_s: s.files_copied as f64 / secs,
        bytes_per_s: s.bytes_copied as f64 / secs,
        shares: [
            b.walk / work,
            b.read / work,
            (b.write + b.journal + b.copy) / work,
            b.idle / work,
        ],
        found: stats.entries_found.load(Relaxed),
    })
}

fn report(as_json: bool, label: &str, t: &Trial) {
    let pct = |x: f64| (x * 100.0).round();
    if as_json {
        println!(
            "{}",
            json!({
                "type": "probe",
                "class": label,
                "streams": t.streams,
                "files_per_s": t.files_per_s.round(),
                "bytes_per_s": t.bytes_per_s.round(),
                "walk_pct": pct(t.shares[0]),
                "read_pct": pct(t.shares[1]),
                "write_pct": pct(t.shares[2]),
                "idle_pct": pct(t.shares[3]),
            })
        );
    } else {
        println!(
            "{:>8} {:>10.0} {:>10.1} {:>5}% {:>5}% {:>5}% {:>5}%",
            t.streams,
            t.files_per_s,
            t.bytes_per_s / 1e6,
            pct(t.shares[0]),
            pct(t.shares[1]),
            pct(t.shares[2]),
            pct(t.shares[3])
        );
    }
}
