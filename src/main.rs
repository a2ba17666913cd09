//! The `sluice` command: parses arguments once into a job's options, runs
//! the engine, draws progress, prints the summary, and maps the outcome to
//! the documented exit codes:
//!
//! | code | meaning |
//! |------|---------|
//! | 0    | done (every entry copied) |
//! | 1    | finished, but some entries failed; each was listed with path and reason |
//! | 2    | fatal error or bad usage; nothing half-written was left under a final name |
//! | 130  | interrupted (SIGINT, SIGTERM, SIGHUP); state saved, run again to finish |

#![forbid(unsafe_code)]

mod args;
mod image;
mod location;
mod output;
mod probe;
mod ranks;
mod remote;
mod saved;
mod size;
mod watch;

use clap::Parser;
use output::Kind;
use std::process::ExitCode;

/// A word for flags people bring from rsync and cp that sluice does not
/// take, because what they ask for is what it always does, or lives in
/// another command.
fn habit_hint(e: &clap::Error) -> Option<&'static str> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let arg = arg.split('=').next().unwrap_or(arg);
    match arg {
        "--delete" | "--max-delete" | "--allow-empty-src" => Some(
            "--delete is a `sluice sync` option: `sluice sync SRC DST --delete` copies \
             what changed and removes what SRC no longer has",
        ),
        "--archive" | "--recursive" | "-r" | "-R" => Some(
            "sluice always copies recursively with all metadata (what rsync -a and cp -a \
             ask for); drop the flag",
        ),
        a if a.starts_with("-a") && !a.starts_with("--") => Some(
            "sluice always copies recursively with all metadata (what rsync -a and cp -a \
             ask for); drop the flag",
        ),
        _ => None,
    }
}

/// Writes generated text to stdout; a reader that stops early (`| head`)
/// is not an error.
fn print_out(text: &[u8]) -> ExitCode {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs `copy`, `sync`, `verify` of files, `image` or `probe` (`None` for any other
/// command); `pushed` when `sluice serve` runs a client's copy to here.
fn job_command(command: &args::Command, pushed: Option<output::Pushed>) -> Option<u8> {
    Some(match command {
        args::Command::Copy(c) => {
            let kind = Kind::Copy { dry_run: c.dry_run };
            output::run_job(&c.job, kind, c.options(), pushed)
        }
        args::Command::Sync(c) => {
            let kind = Kind::Copy {
                dry_run: c.copy.dry_run,
            };
            output::run_job(&c.copy.job, kind, c.options(), pushed)
        }
        args::Command::Verify(c) if !image::is_image_pair(&c.job.src, &c.job.dst) => {
            output::run_job(&c.job, Kind::Verify, c.options(), pushed)
        }
        args::Command::Image(c) => image::run(c, pushed),
        args::Command::Probe(c) => probe::run(c, pushed),
        _ => return None,
    })
}

/// `sluice serve --stdio`: frames go straight to descriptors 0 and 1
/// (std's stdout is line-buffered, which suits text, not frames). A job a
/// client sends is parsed as its command line was on the client.
fn serve_stdio() -> std::io::Result<()> {
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStringExt;
    let input = std::fs::File::from(std::io::stdin().as_fd().try_clone_to_owned()?);
    let output = std::fs::File::from(std::io::stdout().as_fd().try_clone_to_owned()?);
    let run: sluice_remote::RunJob = std::sync::Arc::new(|argv, source, cancel| {
        let argv = argv.into_iter().map(std::ffi::OsString::from_vec);
        let cli = match args::Cli::try_parse_from(argv) {
            Ok(cli) => cli,
            Err(e) => {
                eprintln!("sluice serve: the client's command: {e}");
                return 2;
            }
        };
        job_command(&cli.command, Some(output::Pushed { source, cancel })).unwrap_or_else(|| {
            eprintln!("sluice serve: the client sent a command that copies nothing");
            2
        })
    });
    sluice_remote::serve(input, output, run)
}

fn main() -> ExitCode {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            if let Some(hint) = habit_hint(&e) {
                eprintln!("\nnote: {hint}");
            }
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let pulls = matches!(
        cli.command,
        args::Command::Copy(_)
            | args::Command::Sync(_)
            | args::Command::Verify(_)
            | args::Command::Image(_)
            | args::Command::Probe(_)
    );
    if let Err(msg) = location::refuse_remote(&cli.command.paths(), pulls) {
        eprintln!("sluice: error: {msg}");
        return ExitCode::from(2);
    }
    if let Some(code) = job_command(&cli.command, None) {
        return ExitCode::from(code);
    }
    match cli.command {
        args::Command::Copy(_)
        | args::Command::Sync(_)
        | args::Command::Image(_)
        | args::Command::Probe(_) => unreachable!("run above"),
        args::Command::Watch(c) => watch::run(&c),
        args::Command::Verify(c) if image::is_image_pair(&c.job.src, &c.job.dst) => {
            ExitCode::from(image::run_with(
                &c.job.src,
                &c.job.dst,
                c.image_options(),
                &c.job.show,
                &c.job.remote,
                None,
            ))
        }
        args::Command::Verify(_) => unreachable!("run above"),
        args::Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut args::Cli::command(), "sluice", &mut out);
            print_out(&out)
        }
        args::Command::Serve(args::ServeArgs {
            relay: Some(port), ..
        }) => match sluice_remote::streams::relay(port) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluice serve: relaying to port {port}: {e}");
                ExitCode::from(2)
            }
        },
        args::Command::Serve(_) => match serve_stdio() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sluice serve: error: {e}");
                ExitCode::from(2)
            }
        },
        args::Command::Man => {
            use clap::CommandFactory;
            let mut out = Vec::new();
            match clap_mangen::Man::new(args::Cli::command()).render(&mut out) {
                Ok(()) => print_out(&out),
                Err(e) => {
                    eprintln!("sluice: error: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
