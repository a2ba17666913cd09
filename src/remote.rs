//! Starting the far end: runs the user's `ssh` (or `-e`/`SLUICE_RSH`) to
//! start `sluice serve --stdio` on the other host, so `~/.ssh/config`,
//! agents, ProxyJump and known_hosts work as they do for rsync.

use sluice_engine::source::Source;
use sluice_remote::{Conn, ConnectError, RemoteSource};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// A running `sluice serve` on another host.
pub struct Session {
    child: Child,
    conn: Arc<Conn>,
    pub source: Arc<dyn Source>,
}

/// How the far end is reached: the remote shell command and the remote
/// binary.
pub struct Reach<'a> {
    pub rsh: &'a str,
    pub remote_path: &'a str,
}

impl Session {
    /// Starts `sluice serve --stdio` as `login` (`[user@]host`) and trades
    /// handshakes. `cancel` is set if the connection drops mid-job.
    pub fn start(login: &str, reach: &Reach, cancel: Arc<AtomicBool>) -> Result<Session, String> {
        let mut words = reach.rsh.split_whitespace();
        let program = words
            .next()
            .ok_or("the remote shell command (-e) is empty")?;
        let mut cmd = Command::new(program);
        cmd.args(words)
            .arg(login)
            .arg(reach.remote_path)
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
        let lost = move || cancel.store(true, Relaxed);
        match Conn::start(input, output, lost) {
            Ok(conn) => Ok(Session {
                child,
                source: Arc::new(RemoteSource::new(conn.clone(), login.to_string())),
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
