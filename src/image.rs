//! `sluice image` (and `sluice verify` of an image pair): runs the
//! engine's image job and reports it.

use crate::args::{ImageArgs, RemoteArgs, Show};
use crate::location::Location;
use crate::output::Pushed;
use crate::output::{
    busy_json, busy_line, cancel_on_signals, eta, ms, progress, rate, Draw, Printer, Tick,
};
use crate::remote::Opened;
use crate::size::human_bytes;
use serde_json::json;
use sluice_engine::gauge::Load;
use sluice_engine::image::{ImageMode, ImageOptions, ImageReport, ImageStats};
use sluice_engine::source::Wire;
use sluice_engine::{JobError, Outcome};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `sluice image`; `pushed` when `sluice serve` runs a client's image to
/// here. Returns the exit code.
pub fn run(args: &ImageArgs, pushed: Option<Pushed>) -> u8 {
    let opts = match args.options() {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("sluice: error: {msg}");
            return 2;
        }
    };
    if pushed.is_none() {
        if let Location::Remote { user, host, path } = Location::parse(args.dst.as_os_str()) {
            let login = Location::login(&user, &host);
            let progress = args.show.bar() && !args.show.progress;
            return crate::remote::push_command(&args.remote, progress, &args.dst, &login, &path);
        }
    }
    run_with(&args.src, &args.dst, opts, &args.show, &args.remote, pushed)
}

/// Whether `sluice verify SRC DST` compares an image pair: either side a
/// block device.
pub fn is_image_pair(src: &Path, dst: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let dev = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device());
    dev(src) || dev(dst)
}

pub fn run_with(
    src: &Path,
    dst: &Path,
    opts: ImageOptions,
    show: &Show,
    reach: &RemoteArgs,
    pushed: Option<Pushed>,
) -> u8 {
    let dry_run = opts.dry_run;
    let cancel = match &pushed {
        Some(p) => p.cancel.clone(),
        None => cancel_on_signals(),
    };
    let opened = match Opened::open(src, pushed.as_ref(), reach, &cancel) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("sluice: error: {msg}");
            return 2;
        }
    };
    let stats = Arc::new(ImageStats::default());
    let printer = Printer::new(show.json);
    let start = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let ticker = (show.bar() || show.json).then(|| {
        let stats = stats.clone();
        let draw = Draw {
            bar: show.bar(),
            json: show.json,
        };
        progress(&printer, draw, done.clone(), cancel.clone(), move || {
            image_tick(&stats, start.elapsed())
        })
    });
    let result = sluice_engine::image::image_from(
        &opened.source,
        &opened.path,
        dst,
        opts,
        stats.clone(),
        printer.clone(),
        cancel,
    );
    let wire = opened.source.wire();
    let lost = opened.close();
    let elapsed = start.elapsed();
    crate::output::stop_ticker(&done, ticker);
    let (code, outcome) = match &result {
        // The connection dropped: the job stopped as for a signal, the map
        // recording what landed; that is a failure, not an interruption.
        _ if lost.is_some() => (2, "failed"),
        Ok((Outcome::Complete, _)) => (0, "complete"),
        Ok((Outcome::Partial, _)) => (1, "partial"),
        Ok((Outcome::Interrupted, _)) => (130, "interrupted"),
        Err(_) => (2, "failed"),
    };
    match &result {
        Err(e) => {
            if show.json {
                println!("{}", json!({"type": "fatal", "error": e.to_string()}));
            }
            eprintln!("sluice: error: {e}");
            if let JobError::Fatal(_) = e {
                eprintln!("sluice: the chunk map records what landed; run the same command again to finish");
            }
        }
        Ok((Outcome::Interrupted, _)) if lost.is_some() => eprintln!(
            "sluice: error: the connection to SRC's host was lost ({}); run the same command \
             again to finish",
            lost.as_deref().unwrap_or_default()
        ),
        Ok((Outcome::Interrupted, _)) => {
            eprintln!(
                "sluice: interrupted {}; run the same command again to finish",
                crate::output::stopped_by()
            )
        }
        Ok(_) => {}
    }
    let report = result.as_ref().ok().map(|(_, r)| r);
    if show.json {
        let mut json = summary_json(&stats, report, outcome, elapsed, dry_run, wire.as_ref());
        if let (Some(w), serde_json::Value::Object(m)) = (wire, &mut json) {
            let mut w = crate::output::wire_json(&w);
            let cpu = Load::now().cpu;
            w["destination_host"] = json!({"cpu_s": crate::output::ms(cpu)});
            m.insert("wire".into(), w);
        }
        println!("{json}");
    } else if let Some(r) = report {
        print!(
            "{}",
            summary_table(&stats, r, elapsed, dry_run, wire.as_ref())
        );
        if let Some(w) = wire {
            println!("{}", crate::output::wire_line(&w));
        }
    }
    code
}

fn image_tick(s: &ImageStats, elapsed: Duration) -> Tick {
    let done = s.bytes_done.load(Relaxed);
    let size = s.size.load(Relaxed);
    let written = s.bytes_written.load(Relaxed);
    let speed = rate(done as f64, elapsed);
    let eta = eta(size.saturating_sub(done) as f64, speed);
    Tick {
        line: format!(
            "{}/{} scanned  {} written  {}/s{eta}",
            human_bytes(done as f64),
            human_bytes(size as f64),
            human_bytes(written as f64),
            human_bytes(speed),
        ),
        fraction: (size > 0).then(|| (done as f64 / size as f64).min(1.0)),
        json: json!({"elapsed_s": ms(elapsed.as_secs_f64()), "bytes_done": done, "bytes_found": size,
                     "bytes_written": written, "bytes_per_s": speed.round()}),
    }
}

fn summary_json(
    s: &ImageStats,
    r: Option<&ImageReport>,
    outcome: &str,
    elapsed: Duration,
    dry_run: bool,
    wire: Option<&Wire>,
) -> serde_json::Value {
    let written = s.bytes_written.load(Relaxed);
    let verify = r.is_some_and(|r| r.mode == ImageMode::Verify);
    let mut v = json!({
        "type": "summary",
        "schema": crate::output::SCHEMA,
        "dry_run": dry_run,
        "outcome": outcome,
        "files_copied": u64::from(outcome == "complete" && !verify && s.chunks_written.load(Relaxed) > 0),
        "bytes_copied": written,
        "files_skipped": 0,
        "errors": s.errors.load(Relaxed),
        "elapsed_s": ms(elapsed.as_secs_f64()),
        "size": s.size.load(Relaxed),
        "chunks": s.chunks.load(Relaxed),
        "chunks_written": s.chunks_written.load(Relaxed),
        "chunks_zero": s.chunks_zero.load(Relaxed),
        "chunks_unchanged": s.chunks_unchanged.load(Relaxed),
        "chunks_unread": s.chunks_unread.load(Relaxed),
        "differences": s.differences.load(Relaxed),
        "bytes_read": s.bytes_read.load(Relaxed),
        "dst_bytes_read": s.dst_bytes_read.load(Relaxed),
        "bytes_per_s": rate(s.bytes_done.load(Relaxed) as f64, elapsed).round(),
        "max_rss_bytes": sluice_engine::peak_rss(),
    });
    if let (Some(r), serde_json::Value::Object(m)) = (r, &mut v) {
        m.insert("mode".into(), json!(r.mode.name()));
        m.insert("generation".into(), json!(r.generation));
        m.insert("chunk_size".into(), json!(r.chunk_size));
        m.insert("dst".into(), json!(r.dst.to_string_lossy()));
        m.insert(
            "map".into(),
            json!(r.map.as_ref().map(|p| p.to_string_lossy())),
        );
        m.insert("streams".into(), json!(r.streams));
        m.insert("stream_seconds".into(), busy_json(&r.busy));
        m.insert("bottleneck".into(), json!(image_verdict(r, elapsed, wire)));
    }
    v
}

fn summary_table(
    s: &ImageStats,
    r: &ImageReport,
    elapsed: Duration,
    dry_run: bool,
    wire: Option<&Wire>,
) -> String {
    let size = s.size.load(Relaxed) as f64;
    let what = match r.mode {
        ImageMode::Full => "full copy",
        ImageMode::Incremental => "incremental (chunk map trusted: DST not read)",
        ImageMode::Compare => "compared with DST's data (no trusted chunk map)",
        ImageMode::Unchanged => "source file unchanged since the last run: nothing read",
        ImageMode::Verify => "verify",
    };
    let mut out = format!(
        "{}: {what}{}\n",
        r.dst.display(),
        if r.generation > 0 {
            format!(", generation {}", r.generation)
        } else {
            String::new()
        }
    );
    out += &format!(
        "chunks: {} of {}: {} {}, {} zero, {} unchanged\n",
        s.chunks.load(Relaxed),
        human_bytes(r.chunk_size as f64),
        s.chunks_written.load(Relaxed) + s.differences.load(Relaxed),
        if r.mode == ImageMode::Verify {
            "differ"
        } else if dry_run {
            "would write"
        } else {
            "written"
        },
        s.chunks_zero.load(Relaxed),
        s.chunks_unchanged.load(Relaxed),
    );
    out += &format!(
        "{} in {:.1} s ({}/s): read {}, wrote {}, errors {}\n",
        human_bytes(size),
        elapsed.as_secs_f64(),
        human_bytes(rate(size, elapsed)),
        human_bytes((s.bytes_read.load(Relaxed) + s.dst_bytes_read.load(Relaxed)) as f64),
        human_bytes(s.bytes_written.load(Relaxed) as f64),
        s.errors.load(Relaxed),
    );
    out += &busy_line(&r.busy, image_verdict(r, elapsed, wire));
    if let Some(map) = &r.map {
        out += &format!("chunk map: {}\n", map.display());
    }
    out
}

/// What bounded an image job; nothing for one too short to judge. Across
/// hosts, which side (see [`sluice_engine::gauge::across`]).
fn image_verdict(r: &ImageReport, elapsed: Duration, wire: Option<&Wire>) -> Option<&'static str> {
    if elapsed < sluice_engine::JUDGE_AFTER {
        return None;
    }
    Some(match wire.and_then(|w| w.far) {
        Some(far) => {
            let here = Load::now();
            sluice_engine::gauge::across(&r.busy, elapsed.as_secs_f64(), &here, &far)
        }
        None => r.busy.verdict(),
    })
}
