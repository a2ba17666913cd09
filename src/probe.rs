//! `sluice probe SRC DST`: short trial copies from the real SRC into a
//! scratch directory inside DST, at 1, 2, 4, 8, ... streams, small files
//! and big files apart, until throughput stops rising. Prints what each
//! trial reached and where its streams' time went, recommends a stream
//! count for each kind of work, and removes everything it wrote.

use crate::args::ProbeArgs;
use crate::location::Location;
use crate::output::Pushed;
use crate::remote::Opened;
use serde_json::json;
use sluice_engine::source::Source;
use sluice_engine::{CopyOptions, EntryError, Reporter, Stats, DEFAULT_CHUNK};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Trial errors are counted, not printed: a probe is a measurement.
struct Quiet;

impl Reporter for Quiet {
    fn entry_failed(&self, _: &EntryError) {}
    fn entry_skipped(&self, _: &[u8], _: &str) {}
    fn entry_deleted(&self, _: &[u8]) {}
    fn entry_differs(&self, _: sluice_engine::Side, _: &[u8], _: &[u8], _: &str) {}
    fn notice(&self, _: &[u8], _: &str) {}
    fn entry_changed(&self, _: &[u8], _: &str, _: &[&'static str]) {}
}

const STREAMS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Chunk sizes tried for big files, at the best stream count (the default,
/// 64 MiB, is what the stream trials used).
const CHUNKS: [u64; 2] = [16 << 20, 256 << 20];

/// What one trial reached.
struct Trial {
    streams: usize,
    chunk_size: u64,
    files: u64,
    files_per_s: f64,
    bytes_per_s: f64,
    /// Shares of the working streams' time: walk, read, write, idle.
    shares: [f64; 4],
    /// The copy ran out of files before its time was up.
    finished: bool,
}

/// A kind of work, tried apart from the other.
struct Class {
    label: &'static str,
    window: (u64, u64),
    /// Judged by files/s (else by bytes/s).
    by_files: bool,
}

const CLASSES: [Class; 2] = [
    Class {
        label: "small files (< 1 MiB)",
        window: (0, 1 << 20),
        by_files: true,
    },
    Class {
        label: "big files (>= 1 MiB)",
        window: (1 << 20, u64::MAX),
        by_files: false,
    },
];

/// What the probe recommends for one kind of work.
struct Pick {
    streams: usize,
    chunk_size: u64,
}

/// `sluice probe`; `pushed` when `sluice serve` runs a client's probe to
/// here (its trials write here, reading SRC over there). Returns the exit
/// code.
pub fn run(args: &ProbeArgs, pushed: Option<Pushed>) -> u8 {
    if pushed.is_none() {
        if let Location::Remote { user, host, path } = Location::parse(args.dst.as_os_str()) {
            if args.save {
                eprintln!("sluice: error: {}", NO_SAVE);
                return 2;
            }
            let login = Location::login(&user, &host);
            return crate::remote::push_command(&args.remote, false, &args.dst, &login, &path);
        }
    }
    let far = pushed.is_some()
        || matches!(
            Location::parse(args.src.as_os_str()),
            Location::Remote { .. }
        );
    if far && args.save {
        eprintln!("sluice: error: {}", NO_SAVE);
        return 2;
    }
    // A connection lost mid-trial fails that trial (its reads fail), which
    // ends the probe with the error.
    let unused = Arc::new(AtomicBool::new(false));
    let opened = match Opened::open(&args.src, pushed.as_ref(), &args.remote, &unused) {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("sluice: error: {msg}");
            return 2;
        }
    };
    let code = probe(args, &opened.source, &opened.path);
    opened.close();
    code
}

/// Why `--save` is refused across hosts.
const NO_SAVE: &str = "--save keeps probes per pair of file systems on this host; a probe \
                       with a side on another host is reported, not saved";

/// Runs the trials, reading SRC (`src` there) through `source`.
fn probe(args: &ProbeArgs, source: &Arc<dyn Source>, src: &Path) -> u8 {
    let started = Instant::now();
    // A fresh directory (never one planted under its name), removed from
    // descriptors at the end: the probe writes nowhere else in DST.
    let name = format!(".sluice-probe-{}", std::process::id());
    let scratch = match sluice_engine::target::create_scratch(&args.dst, &name) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("sluice: error: cannot create the probe's scratch directory: {e}");
            return 2;
        }
    };
    let cold = args.cold && sluice_engine::can_drop_caches();
    if args.cold && !cold {
        eprintln!("sluice: --cold needs root to drop the page cache; trials read a warm one");
    }
    if cold && !source.is_local() {
        eprintln!("sluice: --cold drops this host's page cache, not SRC's host's");
    }
    let mut seq = 0;
    let mut picks = Vec::new();
    for class in &CLASSES {
        if !args.json {
            println!("{}", class.label);
            println!(
                "{:>8} {:>6} {:>10} {:>10} {:>6} {:>6} {:>6} {:>6}",
                "streams", "chunk", "files/s", "MB/s", "walk", "read", "write", "idle"
            );
        }
        let mut tried = |n: usize, chunk: u64| {
            seq += 1;
            let out = scratch.join(format!("trial-{seq}"));
            let t = trial(args, (source, src), &out, n, chunk, class, cold);
            // Removed at once, and in parallel: on a target with latency
            // per request, removing it one entry at a time took longer than
            // the trials; kept until the end, big files' trials filled the
            // disk (each holds its file's full size, allocated up front).
            remove_tree(&out, 32);
            let t = t?;
            if t.files > 0 || t.bytes_per_s > 0.0 {
                report(args.json, class.label, &t);
            }
            Some(t)
        };
        let rate = |t: &Trial| {
            if class.by_files {
                t.files_per_s
            } else {
                t.bytes_per_s
            }
        };
        // The last trial that gained 5% over the one before it: two more
        // without such a gain end the climb.
        let (mut mark, mut stalls) = (0.0, 0);
        let mut rates = Vec::new();
        for n in STREAMS {
            let Some(t) = tried(n, DEFAULT_CHUNK) else {
                break;
            };
            if t.files == 0 && t.finished {
                if !args.json {
                    println!("{:>8} none in SRC", "-");
                }
                break;
            }
            rates.push((n, rate(&t), t.shares[3]));
            if rate(&t) > mark * 1.05 {
                (mark, stalls) = (rate(&t), 0);
            } else {
                stalls += 1;
                if stalls == 2 {
                    break; // two steps without a gain: it has stopped rising
                }
            }
        }
        // The most streams within 5% of the best trial: trials differ by
        // that much on their own, and whole jobs ran as fast or faster with
        // more streams wherever the trials were level (the mixed set from
        // disk: trials level from 8 to 32, the job 13% faster at 32).
        // Unless those streams mostly waited for work: then they only
        // hold memory.
        let top = rates.iter().map(|r| r.1).fold(0.0, f64::max);
        let picked = rates
            .iter()
            .rfind(|&&(_, r, idle)| r > 0.0 && (r == top || r * 1.05 >= top && idle < 0.25))
            .copied();
        let mut best = picked.map_or(0.0, |(_, r, _)| r);
        let mut pick = picked.map(|(streams, _, _)| Pick {
            streams,
            chunk_size: DEFAULT_CHUNK,
        });
        if let (Some(p), false) = (&mut pick, class.by_files) {
            // Only a clear gain changes the chunk size: it matters for
            // files above twice its size, and a trial varies by 5-10%.
            let n = p.streams;
            for chunk in CHUNKS {
                match tried(n, chunk) {
                    Some(t) if rate(&t) > best * 1.10 => {
                        best = rate(&t);
                        p.chunk_size = chunk;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
        }
        picks.push((class, pick));
    }
    remove_tree(&scratch, 32);
    for (class, p) in &picks {
        let Some(p) = p else { continue };
        if args.json {
            println!(
                "{}",
                json!({"type": "recommendation", "class": class.label, "streams": p.streams,
                       "chunk_size": p.chunk_size})
            );
        } else if class.by_files {
            println!("recommendation for {}: -j {}", class.label, p.streams);
        } else {
            println!(
                "recommendation for {}: -j {} --chunk-size {}M",
                class.label,
                p.streams,
                p.chunk_size >> 20
            );
        }
    }
    if args.save {
        // CLASSES is small files, then big files.
        let (small, big) = (&picks[0].1, &picks[1].1);
        let rec = crate::saved::Saved::new(
            &args.src,
            &args.dst,
            small.as_ref().map(|p| p.streams),
            big.as_ref().map(|p| (p.streams, p.chunk_size)),
        );
        match rec.and_then(|r| crate::saved::save(&r)) {
            Ok(path) if args.json => println!("{}", json!({"type": "saved", "path": path})),
            Ok(path) => println!(
                "saved to {}: -j auto starts from it for this pair of file systems",
                path.display()
            ),
            Err(e) => {
                eprintln!("sluice: error: saving the probe: {e}");
                return 2;
            }
        }
    } else if !args.json {
        println!(
            "(-j auto, the default, tunes this while a job runs; --save keeps it for later runs)"
        );
    }
    // One job takes one -j: the most streams either kind of file paid
    // for (the chunk lane is tuned inside it), and the big files' chunk.
    let command = one_command(&args.src, &args.dst, &picks);
    if args.json {
        println!(
            "{}",
            json!({"type": "probe_done", "command": command,
                   "elapsed_s": crate::output::ms(started.elapsed().as_secs_f64())})
        );
    } else {
        println!("probe took {:.1} s", started.elapsed().as_secs_f64());
        if let Some(c) = &command {
            println!("use: {c}");
        }
    }
    0
}

/// The one command line the probe recommends, or `None` if no trial
/// copied anything.
fn one_command(src: &Path, dst: &Path, picks: &[(&Class, Option<Pick>)]) -> Option<String> {
    let streams = picks
        .iter()
        .filter_map(|(_, p)| p.as_ref().map(|p| p.streams))
        .max()?;
    let chunk = picks
        .iter()
        .filter(|(c, _)| !c.by_files)
        .find_map(|(_, p)| p.as_ref().map(|p| p.chunk_size))
        .filter(|&c| c != DEFAULT_CHUNK)
        .map_or(String::new(), |c| format!(" --chunk-size {}M", c >> 20));
    Some(format!(
        "sluice copy {} {} -j {streams}{chunk}",
        quote(src),
        quote(dst)
    ))
}

/// A path as a shell word (single-quoted when it needs to be).
fn quote(p: &Path) -> String {
    let s = p.to_string_lossy();
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-+:,@".contains(&b))
    {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// Copies SRC's files of `class` into `out` for `seconds` at `n` streams.
fn trial(
    args: &ProbeArgs,
    (source, src): (&Arc<dyn Source>, &Path),
    out: &Path,
    n: usize,
    chunk_size: u64,
    class: &Class,
    cold: bool,
) -> Option<Trial> {
    if cold {
        sluice_engine::drop_caches();
    }
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
        chunk_size,
        size_window: Some(class.window),
        ..CopyOptions::default()
    };
    let start = Instant::now();
    let quiet = Arc::new(Quiet);
    let res = sluice_engine::copy_from(source, src, out, opts, stats.clone(), quiet, cancel);
    // Until the data is on the disk: a page cache that absorbs two seconds
    // of writes would make every stream count look alike (into a fresh
    // ext4 from tmpfs, 2 streams looked best and were 15% slower in full).
    let _ = sluice_engine::sync_file_system(out.parent().unwrap_or(out));
    let secs = start.elapsed().as_secs_f64().max(1e-3);
    let outcome = match res {
        Ok(o) => o,
        Err(e) => {
            eprintln!("sluice: error: {e}");
            return None;
        }
    };
    let s = stats.summary(start.elapsed());
    let b = s.busy;
    let work = b.total().max(1e-9);
    Some(Trial {
        streams: n,
        chunk_size,
        files: s.files_copied,
        files_per_s: s.files_copied as f64 / secs,
        // Bytes written, not bytes of finished files: at the end of a
        // trial every stream holds a part-copied chunk, and counting only
        // finished ones left out up to streams x chunk size (2 GiB at 32
        // streams), which made more streams and bigger chunks look worse.
        bytes_per_s: stats.data_moved.load(Relaxed) as f64 / secs,
        shares: [
            b.walk / work,
            b.read / work,
            (b.write + b.journal + b.copy) / work,
            b.idle / work,
        ],
        finished: outcome != sluice_engine::Outcome::Interrupted,
    })
}

/// Removes `dir` and everything in it, `threads` subtrees at a time.
fn remove_tree(dir: &Path, threads: usize) {
    let _ = sluice_engine::target::remove_tree(dir, threads);
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
                "chunk_size": t.chunk_size,
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
            "{:>8} {:>5}M {:>10.0} {:>10.1} {:>5}% {:>5}% {:>5}% {:>5}%",
            t.streams,
            t.chunk_size >> 20,
            t.files_per_s,
            t.bytes_per_s / 1e6,
            pct(t.shares[0]),
            pct(t.shares[1]),
            pct(t.shares[2]),
            pct(t.shares[3])
        );
    }
}
