//! `latencyfs BACKING MOUNTPOINT [--latency-ms MS] [--threads N]`: mounts
//! BACKING at MOUNTPOINT with MS milliseconds added to every request, and
//! serves it until MOUNTPOINT is unmounted (`umount MOUNTPOINT`).

use sluice_latencyfs::{config, LatencyFs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut paths, mut latency_ms, mut threads) = (Vec::new(), 1.0f64, 64usize);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--latency-ms" => latency_ms = args.next().and_then(|v| v.parse().ok()).unwrap_or(-1.0),
            "--threads" => threads = args.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            _ => paths.push(PathBuf::from(a)),
        }
    }
    if paths.len() != 2 || latency_ms < 0.0 || threads == 0 {
        eprintln!("usage: latencyfs BACKING MOUNTPOINT [--latency-ms MS] [--threads N]");
        return ExitCode::from(2);
    }
    let fs = match LatencyFs::new(&paths[0], Duration::from_secs_f64(latency_ms / 1000.0)) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("latencyfs: {}: {e}", paths[0].display());
            return ExitCode::FAILURE;
        }
    };
    let ops = fs.ops();
    if let Err(e) = fuser::mount(fs, &paths[1], &config(threads)) {
        eprintln!("latencyfs: mounting on {}: {e}", paths[1].display());
        return ExitCode::FAILURE;
    }
    eprintln!("latencyfs: unmounted after {} requests", ops.load(Relaxed));
    ExitCode::SUCCESS
}
