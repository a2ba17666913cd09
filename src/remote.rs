//! Starting the far end: runs the user's `ssh` (or `-e`/`SLUICE_RSH`) to
//! start `sluice serve --stdio` on the other host, so `~/.ssh/config`,
//! agents, ProxyJump and known_hosts work as they do for rsync.

use crate::args::{JobArgs, RemoteArgs};
use crate::location::Location;
use crate::output::Pushed;
use sluice_engine::source::LocalSource;
use sluice_engine::source::Source;
use sluice_remote::peer::{Relay, Route};
use sluice_remote::streams::Pipe;
use sluice_remote::wire::Msg;
use sluice_remote::{ConnectError, Handler, Peer, RemoteSource};
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// One data stream through its own ssh connection: `sluice serve --relay
/// PORT` over there carries it to the listener on that host's loopback.
fn relay(reach: &RemoteArgs, login: &str, port: u16) -> std::io::Result<Pipe> {
    let mut words = reach.rsh.split_whitespace();
    let program = words.next().unwrap_or("ssh");
    let mut child = Command::new(program)
        .args(words)
        .arg(login)
        .arg(&reach.remote_path)
        .args(["serve", "--relay", &port.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let (Some(out), Some(into)) = (child.stdout.take(), child.stdin.take()) else {
        let _ = child.kill();
        return Err(std::io::Error::other("no pipes to the relaying ssh"));
    };
    Ok(Pipe {
        child: Arc::new(std::sync::Mutex::new(child)),
        out,
        into,
    })
}

/// A running `sluice serve` on another host.
pub struct Session {
    child: Child,
    conn: Arc<Peer>,
    pub source: Arc<dyn Source>,
}

impl Session {
    /// Starts `sluice serve --stdio` as `login` (`[user@]host`) and trades
    /// handshakes. `on_lost` is called if the connection drops mid-job;
    /// `handler` gets what a job running over there sends (a push).
    pub fn start(
        login: &str,
        reach: &RemoteArgs,
        on_lost: impl Fn() + Send + Sync + 'static,
        handler: Handler,
    ) -> Result<Session, String> {
        let mut words = reach.rsh.split_whitespace();
        let program = words
            .next()
            .ok_or("the remote shell command (-e) is empty")?;
        let mut cmd = Command::new(program);
        cmd.args(words)
            .arg(login)
            .arg(&reach.remote_path)
            .args(["serve", "--stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("could not run {program:?} to reach {login}: {e}"))?;
        let (input, output) = (child.stdout.take(), child.stdin.take());
        let (Some(input), Some(output)) = (input, output) else {
            return Err("no pipes to the remote shell".into());
        };
        match sluice_remote::connect(input, output, on_lost, handler) {
            Ok(conn) => Ok(Session {
                child,
                source: Arc::new(RemoteSource::new(conn.clone(), Some(login.to_string()))),
                conn,
            }),
            Err(e) => {
                let status = match e {
                    // It may still be starting up or printing: ask it to go.
                    ConnectError::Version { .. } => {
                        let _ = child.kill();
                        child.wait().ok()
                    }
                    _ => child.wait().ok(),
                };
                let exit = status.and_then(|s| s.code());
                let hint = match exit {
                    Some(127) => format!(
                        " ({} was not found on {login}: install sluice there, or name it with \
                         --remote-path)",
                        reach.remote_path
                    ),
                    Some(255) if program.ends_with("ssh") => {
                        format!(" (ssh could not connect to {login}; its message is above)")
                    }
                    Some(n) if n != 0 => format!(" ({program} exited with status {n})"),
                    _ => String::new(),
                };
                Err(format!("could not start sluice on {login}: {e}{hint}"))
            }
        }
    }

    /// Opens the data streams `reach` asks for to `host`, this end asking
    /// on them (`ask`: it reads the far end's files) or answering. Where
    /// no direct connection gets through, each runs through its own ssh
    /// process; where neither works, says so, and data goes over ssh.
    pub fn open_streams(&self, reach: &RemoteArgs, login: &str, ask: bool) {
        // Not given: 4 to start, and the end that reads adds more while
        // more carry more.
        let (n, tune) = match reach.streams {
            Some(0) => return,
            Some(n) => (n, false),
            None => (4, true),
        };
        let host = login.rsplit('@').next().unwrap_or(login);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let (reach_, login_) = (reach.clone(), login.to_string());
        let relay: Relay = Arc::new(move |port: u16| relay(&reach_, &login_, port));
        match self
            .conn
            .open_streams(n, !reach.no_encryption, host, ask, tune, relay)
        {
            Ok((_, Route::Direct)) => {}
            Ok((n, Route::Relayed)) => eprintln!(
                "sluice: {host} takes no direct connections; {n} data streams go through \
                 their own ssh connections"
            ),
            Err(why) => {
                eprintln!("sluice: no data streams to {host} ({why}); data goes over ssh")
            }
        }
    }

    /// Why the connection dropped mid-job, if it did.
    pub fn lost(&self) -> Option<String> {
        self.conn.lost()
    }

    /// Hangs up: the far end sees its input end and exits.
    pub fn close(mut self) {
        self.conn.hang_up();
        let _ = self.child.wait();
    }
}

/// What a push's connection tells the command.
enum Heard {
    Done(u8),
    Lost,
}

/// `sluice copy|sync|verify SRC [user@]host:PATH`: the job runs on the
/// other host, where DST is, reading SRC from here across the connection;
/// what it prints comes back to this stdout (and its stderr through the
/// remote shell's). Returns the exit code.
pub fn push(args: &JobArgs, login: &str, path: &std::path::Path) -> u8 {
    let here_only = [
        (args.show.log_file.is_some(), "--log-file"),
        (!args.exclude_from.is_empty(), "--exclude-from"),
        (!args.include_from.is_empty(), "--include-from"),
        (args.files_from.is_some(), "--files-from"),
    ];
    if let Some((_, flag)) = here_only.iter().find(|(used, _)| *used) {
        eprintln!(
            "sluice: error: {flag} names a file on this host, which a copy to another host \
             does not read yet (give the patterns with --exclude/--include)"
        );
        return 2;
    }
    // Its stderr reaches this terminal through ssh but is no terminal
    // itself: where this side would draw a bar, it prints progress lines.
    let progress = args.show.bar() && !args.show.progress;
    push_command(&args.remote, progress, &args.dst, login, path)
}

/// Runs this command line on the other host, DST (`dst` here, `path`
/// there) being over there, with `--progress` added if `progress`; what it
/// prints comes back. Returns its exit code.
pub fn push_command(
    reach: &RemoteArgs,
    progress: bool,
    dst: &std::path::Path,
    login: &str,
    path: &std::path::Path,
) -> u8 {
    let cancel = crate::output::cancel_on_signals();
    let (tx, rx) = mpsc::channel();
    let lost = {
        let tx = tx.clone();
        move || {
            let _ = tx.send(Heard::Lost);
        }
    };
    let handler: Handler = Box::new(move |_peer: &Arc<Peer>, msg: Msg| match msg {
        Msg::Out(bytes) => {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(&bytes).and_then(|()| out.flush());
        }
        Msg::Done(code) => {
            let _ = tx.send(Heard::Done(code));
        }
        _ => {}
    });
    let session = match Session::start(login, reach, lost, handler) {
        Ok(s) => s,
        Err(msg) => {
            eprintln!("sluice: error: {msg}");
            return 2;
        }
    };
    // The far end reads this end's files: this end answers on the streams.
    session.open_streams(reach, login, false);
    // The same command line, with DST as the path over there: the far end
    // parses it as this one did.
    let mut argv: Vec<Vec<u8>> = std::env::args_os()
        .map(std::os::unix::ffi::OsStringExt::into_vec)
        .collect();
    let dst = dst.as_os_str().as_encoded_bytes();
    if let Some(last) = argv.iter_mut().rev().find(|a| a.as_slice() == dst) {
        *last = path.as_os_str().as_encoded_bytes().to_vec();
    }
    if progress {
        argv.push(b"--progress".to_vec());
    }
    session.conn.send(0, &Msg::Job(argv));
    let mut cancelled = false;
    let code = loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Heard::Done(code)) => break code,
            Ok(Heard::Lost) => {
                let why = session.lost().unwrap_or_else(|| "it closed".into());
                eprintln!(
                    "sluice: error: the connection to {login} was lost ({why}); run the same \
                     command again to finish"
                );
                break 2;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if cancel.load(Relaxed) && !cancelled {
                    session.conn.send(0, &Msg::Cancel);
                    cancelled = true;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break 2,
        }
    };
    session.close();
    code
}

/// SRC of a job run here, opened: on this host, the client's of a push,
/// or on the host `src` names, through a `sluice serve` started there
/// (which `close` ends once the job is done).
pub struct Opened {
    pub source: Arc<dyn Source>,
    /// SRC's path where `source` is.
    pub path: std::path::PathBuf,
    pub session: Option<Session>,
}

impl Opened {
    /// Where SRC is read from. A connection that drops sets `cancel`, so
    /// the job stops as for a signal, its state saved.
    pub fn open(
        src: &std::path::Path,
        pushed: Option<&Pushed>,
        reach: &RemoteArgs,
        cancel: &Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Opened, String> {
        let (source, path, session) = match (pushed, Location::parse(src.as_os_str())) {
            (Some(p), _) => (p.source.clone(), src.to_owned(), None),
            (None, Location::Local(_)) => {
                let local: Arc<dyn Source> = Arc::new(LocalSource);
                (local, src.to_owned(), None)
            }
            (None, Location::Remote { user, host, path }) => {
                let login = Location::login(&user, &host);
                let on_lost = {
                    let cancel = cancel.clone();
                    move || cancel.store(true, Relaxed)
                };
                let ignore: Handler = Box::new(|_, _| {});
                let s = Session::start(&login, reach, on_lost, ignore)?;
                s.open_streams(reach, &login, true);
                (s.source.clone(), path, Some(s))
            }
        };
        Ok(Opened {
            source,
            path,
            session,
        })
    }

    /// Ends the session, if any; returns why its connection dropped, if it
    /// did.
    pub fn close(self) -> Option<String> {
        let session = self.session?;
        let lost = session.lost();
        session.close();
        lost
    }
}
