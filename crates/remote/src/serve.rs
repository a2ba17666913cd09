//! `sluice serve --stdio`: the end ssh starts on the other host.
//!
//! For a copy from this host it answers the client's questions about the
//! tree here (see `peer`). For a copy to this host the client sends its
//! command line: the job runs here, where DST is, reading SRC back across
//! the same connection, and what it prints on stdout travels to the
//! client's stdout (its stderr goes through ssh's). Interrupting the
//! client, or losing it, stops the job here with its state saved.

use crate::client::RemoteSource;
use crate::peer::{handshake, Peer};
use crate::wire::Msg;
use sluice_engine::source::Source;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// Runs a client's job: its command line, the source its SRC is read
/// from, and the flag that stops it. Returns the exit code.
pub type RunJob = Arc<dyn Fn(Vec<Vec<u8>>, Arc<dyn Source>, Arc<AtomicBool>) -> u8 + Send + Sync>;

/// Serves one client on `input`/`output` until it hangs up (and its job,
/// if it sent one, has stopped).
pub fn serve<R, W>(input: R, mut output: W, run: RunJob) -> io::Result<()>
where
    R: Read + Send + 'static,
    W: Write + Send + 'static,
{
    let input = match handshake(input, &mut output) {
        Ok(Some(input)) => input,
        Ok(None) => return Ok(()), // hung up at once
        Err(e) => return Err(io::Error::other(e.to_string())),
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let job = Arc::new(Mutex::new(None));
    let handler = {
        let (cancel, job) = (cancel.clone(), job.clone());
        Box::new(move |peer: &Arc<Peer>, msg: Msg| match msg {
            Msg::Job(argv) => {
                let (peer, cancel, run) = (peer.clone(), cancel.clone(), run.clone());
                let source: Arc<dyn Source> = Arc::new(RemoteSource::new(peer.clone(), None));
                let thread = std::thread::spawn(move || {
                    let code = with_stdout_to(&peer, || run(argv, source, cancel));
                    peer.send(0, &Msg::Done(code));
                });
                *job.lock().expect("job") = Some(thread);
            }
            Msg::Cancel => cancel.store(true, Relaxed),
            _ => {} // not for a server
        })
    };
    let lost = cancel.clone();
    let peer = Peer::start(input, output, move || lost.store(true, Relaxed), handler)?;
    peer.wait();
    let thread = job.lock().expect("job").take();
    if let Some(t) = thread {
        let _ = t.join();
    }
    Ok(())
}

/// Runs `f` with descriptor 1 pointed at a pipe whose contents are sent to
/// the client as `Out` messages, all of them before this returns.
fn with_stdout_to(peer: &Arc<Peer>, f: impl FnOnce() -> u8) -> u8 {
    let Ok((mut from, to)) = io::pipe() else {
        return f();
    };
    if sluice_sys::redirect_stdout(to.as_fd()).is_err() {
        return f();
    }
    drop(to);
    let pump = {
        let peer = peer.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n @ 1..) = from.read(&mut buf) {
                peer.send(0, &Msg::Out(buf[..n].to_vec()));
            }
        })
    };
    let code = f();
    let _ = io::stdout().flush();
    // Closing the pipe's last write end ends the pump.
    if let Ok(null) = std::fs::File::options().write(true).open("/dev/null") {
        let _ = sluice_sys::redirect_stdout(null.as_fd());
    }
    let _ = pump.join();
    code
}
