//! Data streams beside the control connection.
//!
//! One ssh channel carries a copy's control and, without these, its data:
//! OpenSSH's channel window and one TCP connection cap what it moves. So
//! the end started by ssh (`sluice serve`) listens on an ephemeral port
//! and tells the other, over the ssh channel, where, a fingerprint of a
//! certificate made for this job, and a one-time token; the other end
//! opens N direct TCP connections, each TLS 1.3 with the certificate
//! pinned to that fingerprint (no CA, no name check: the fingerprint came
//! over the authenticated ssh channel), and presents the token. The
//! listener takes exactly N connections that present it, refuses and logs
//! any other, and closes. `--no-encryption` leaves TLS out (the token is
//! still required) for links the user trusts.
//!
//! Each stream then carries one request at a time and its answer (reads
//! and hashes of file data: the bulk of a copy), so N streams are N
//! requests in flight on N connections.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConnection, ServerConnection, StreamOwned};

/// How long an accepted connection has for its handshake and token.
const SETUP: Duration = Duration::from_secs(20);

/// How long the listener waits for its N connections: long enough for
/// direct attempts to fail and N ssh connections to be made in their
/// place, one after another. It closes as soon as the N are in.
const LISTEN: Duration = Duration::from_secs(60);

/// How long a direct connection may take to answer its handshake: on a
/// path that lets the first packet through and no more (a stateful
/// firewall), the job waits this, once, before relaying over ssh.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// How long opening a data connection may take: a firewall that drops
/// the attempt (rather than refusing it) costs the job this, once, before
/// data goes over ssh instead.
const CONNECT: Duration = Duration::from_secs(3);

/// What the listening end tells the other over the control connection.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Offer {
    /// The address the ssh connection reached this host at, if known
    /// (`SSH_CONNECTION`); otherwise the other end resolves the host name
    /// it was given.
    pub ip: Option<String>,
    pub port: u16,
    /// SHA-256 of the certificate's DER (zeros without encryption).
    pub fingerprint: [u8; 32],
    pub token: [u8; 32],
    pub encrypt: bool,
}

/// One data connection: TLS (either side of it) or plain, over TCP or,
/// where TCP could not get through, over a relaying ssh process's pipes.
pub enum Stream {
    Plain(TcpStream),
    Server(Box<StreamOwned<ServerConnection, TcpStream>>),
    Client(Box<StreamOwned<ClientConnection, TcpStream>>),
    Pipe(Pipe),
    ClientPipe(Box<StreamOwned<ClientConnection, Pipe>>),
}

/// A relaying process (`ssh host sluice serve --relay PORT`): its stdout
/// to read, its stdin to write.
pub struct Pipe {
    pub child: Arc<Mutex<std::process::Child>>,
    pub out: std::process::ChildStdout,
    pub into: std::process::ChildStdin,
}

impl Read for Pipe {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.out.read(buf)
    }
}

impl Write for Pipe {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.into.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.into.flush()
    }
}

/// What ends a data stream from another thread.
pub enum Closer {
    Socket(TcpStream),
    Process(Arc<Mutex<std::process::Child>>),
}

impl Closer {
    pub fn close(&self) {
        match self {
            Closer::Socket(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Closer::Process(c) => {
                let mut c = c.lock().expect("relay");
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

impl Stream {
    fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Plain(s) => Some(s),
            Stream::Server(s) => Some(&s.sock),
            Stream::Client(s) => Some(&s.sock),
            Stream::Pipe(_) | Stream::ClientPipe(_) => None,
        }
    }

    /// What ends this stream from elsewhere.
    pub fn closer(&self) -> io::Result<Closer> {
        match self {
            Stream::Pipe(p) => Ok(Closer::Process(p.child.clone())),
            Stream::ClientPipe(s) => Ok(Closer::Process(s.sock.child.clone())),
            s => Ok(Closer::Socket(s.tcp().expect("a socket").try_clone()?)),
        }
    }

    /// How long a read may wait for a byte before it fails (a relaying
    /// process's pipe has no such limit; its ssh has keepalives).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self.tcp() {
            Some(s) => s.set_read_timeout(t),
            None => Ok(()),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Server(s) => s.read(buf),
            Stream::Client(s) => s.read(buf),
            Stream::Pipe(s) => s.read(buf),
            Stream::ClientPipe(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Server(s) => s.write(buf),
            Stream::Client(s) => s.write(buf),
            Stream::Pipe(s) => s.write(buf),
            Stream::ClientPipe(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Server(s) => s.flush(),
            Stream::Client(s) => s.flush(),
            Stream::Pipe(s) => s.flush(),
            Stream::ClientPipe(s) => s.flush(),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn random<const N: usize>() -> io::Result<[u8; N]> {
    use ring::rand::SecureRandom;
    let mut out = [0u8; N];
    ring::rand::SystemRandom::new()
        .fill(&mut out)
        .map_err(|_| io::Error::other("no randomness for a token"))?;
    Ok(out)
}

fn fingerprint(der: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, der);
    d.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// Equal, in time that does not depend on where they differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The address `sluice serve` was reached at over ssh, from
/// `SSH_CONNECTION` ("client-ip client-port server-ip server-port").
pub fn ssh_server_ip() -> Option<String> {
    let v = std::env::var("SSH_CONNECTION").ok()?;
    let ip = v.split_whitespace().nth(2)?;
    ip.parse::<IpAddr>().ok().map(|ip| ip.to_string())
}

/// Listens for `n` data connections on an ephemeral port (or the first
/// free one of `ports`), on every address. Each that presents the token
/// (over TLS with this job's certificate, when `encrypt`) is handed to
/// `take`; any other is refused and logged through `log`. The listener
/// closes once `n` are taken, or after a while.
pub fn listen(
    n: usize,
    encrypt: bool,
    ports: Option<(u16, u16)>,
    take: impl Fn(Stream) + Send + Sync + 'static,
    log: impl Fn(String) + Send + Sync + 'static,
) -> io::Result<Offer> {
    let listener = match ports {
        None => TcpListener::bind(("::", 0)).or_else(|_| TcpListener::bind(("0.0.0.0", 0)))?,
        Some((lo, hi)) => (lo..=hi)
            .find_map(|p| {
                TcpListener::bind(("::", p))
                    .or_else(|_| TcpListener::bind(("0.0.0.0", p)))
                    .ok()
            })
            .ok_or_else(|| io::Error::other(format!("no free port in {lo}-{hi}")))?,
    };
    let port = listener.local_addr()?.port();
    let token = random::<32>()?;
    let (config, fingerprint) = if encrypt {
        let cert = rcgen::generate_simple_self_signed(vec!["sluice".to_string()])
            .map_err(io::Error::other)?;
        let der = cert.cert.der().to_vec();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.key_pair.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(io::Error::other)?
            .with_no_client_auth()
            .with_single_cert(vec![CertificateDer::from(der.clone())], key)
            .map_err(io::Error::other)?;
        (Some(Arc::new(config)), fingerprint(&der))
    } else {
        (None, [0; 32])
    };
    let offer = Offer {
        ip: None,
        port,
        fingerprint,
        token,
        encrypt,
    };
    listener.set_nonblocking(true)?;
    let taken = Arc::new(AtomicU64::new(0));
    let slots = Arc::new(Mutex::new(n));
    let (take, log) = (Arc::new(take), Arc::new(log));
    std::thread::Builder::new()
        .name("data-listener".into())
        .spawn(move || {
            let until = Instant::now() + LISTEN;
            while taken.load(Relaxed) < n as u64 && Instant::now() < until {
                let (sock, from) = match listener.accept() {
                    Ok(c) => c,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(_) => continue,
                };
                let (config, slots, taken) = (config.clone(), slots.clone(), taken.clone());
                let (take, log) = (take.clone(), log.clone());
                std::thread::spawn(move || match admit(sock, config, &token, &slots) {
                    Ok(stream) => {
                        taken.fetch_add(1, Relaxed);
                        take(stream);
                    }
                    Err(why) => log(format!("refused a data connection from {from}: {why}")),
                });
            }
            // Dropped here: a connection after the N is refused by the kernel.
        })?;
    Ok(offer)
}

/// The handshake and token of one accepted connection; a slot is taken
/// only by a correct token, so none is used twice.
fn admit(
    sock: TcpStream,
    config: Option<Arc<rustls::ServerConfig>>,
    token: &[u8; 32],
    slots: &Mutex<usize>,
) -> Result<Stream, String> {
    let setup = |s: &TcpStream| {
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(SETUP))
    };
    setup(&sock).map_err(|e| e.to_string())?;
    let mut stream = match config {
        Some(c) => {
            let conn = ServerConnection::new(c).map_err(|e| e.to_string())?;
            Stream::Server(Box::new(StreamOwned::new(conn, sock)))
        }
        None => Stream::Plain(sock),
    };
    let mut got = [0u8; 32];
    stream
        .read_exact(&mut got)
        .map_err(|e| format!("no token ({e})"))?;
    if !same(&got, token) {
        return Err("wrong token".into());
    }
    {
        let mut left = slots.lock().expect("slots");
        if *left == 0 {
            return Err("token already used by every stream it was for".into());
        }
        *left -= 1;
    }
    stream
        .write_all(b"\x01")
        .and_then(|()| stream.flush())
        .map_err(|e| e.to_string())?;
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    Ok(stream)
}

/// Checks the far end's certificate against the fingerprint the control
/// connection gave, and nothing else.
#[derive(Debug)]
struct Pinned {
    fingerprint: [u8; 32],
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        if same(&fingerprint(end_entity), &self.fingerprint) {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "the certificate is not the one the control connection named".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Err(rustls::Error::General("TLS 1.2 is not offered".into()))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Opens one data connection to what `offer` names (at `host` when it
/// names no address), presents the token and waits for it to be taken.
pub fn connect(offer: &Offer, host: &str) -> io::Result<Stream> {
    let addrs: Vec<SocketAddr> = match &offer.ip {
        Some(ip) => vec![SocketAddr::new(
            ip.parse().map_err(io::Error::other)?,
            offer.port,
        )],
        None => (host, offer.port).to_socket_addrs()?.collect(),
    };
    let mut last = io::Error::other(format!("{host} resolves to no address"));
    let sock = addrs
        .iter()
        .find_map(|a| match TcpStream::connect_timeout(a, CONNECT) {
            Ok(s) => Some(s),
            Err(e) => {
                last = e;
                None
            }
        })
        .ok_or(last)?;
    sock.set_nodelay(true)?;
    sock.set_read_timeout(Some(HANDSHAKE))?;
    let stream = match tls(offer)? {
        Some(conn) => Stream::Client(Box::new(StreamOwned::new(conn, sock))),
        None => Stream::Plain(sock),
    };
    present(stream, offer)
}

/// Opens one data stream through a relaying process (its ssh connection
/// carries it to the listener on the far host's loopback): TLS and the
/// token as over TCP.
pub fn connect_over(offer: &Offer, pipe: Pipe) -> io::Result<Stream> {
    let stream = match tls(offer)? {
        Some(conn) => Stream::ClientPipe(Box::new(StreamOwned::new(conn, pipe))),
        None => Stream::Pipe(pipe),
    };
    present(stream, offer)
}

/// The client side of TLS pinned to the offer's fingerprint, if it asks
/// for encryption.
fn tls(offer: &Offer) -> io::Result<Option<ClientConnection>> {
    if !offer.encrypt {
        return Ok(None);
    }
    let provider = provider();
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Pinned {
            fingerprint: offer.fingerprint,
            provider,
        }))
        .with_no_client_auth();
    let name = ServerName::try_from("sluice").expect("a valid name");
    ClientConnection::new(Arc::new(config), name)
        .map(Some)
        .map_err(io::Error::other)
}

/// Presents the token and waits for the listener to take the stream.
fn present(mut stream: Stream, offer: &Offer) -> io::Result<Stream> {
    // A read timeout shows as "temporarily unavailable": say what it is.
    let silent = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer to the handshake in {} s", HANDSHAKE.as_secs()),
        ),
        _ => e,
    };
    stream.write_all(&offer.token).map_err(silent)?;
    stream.flush().map_err(silent)?;
    let mut ack = [0u8; 1];
    stream.read_exact(&mut ack).map_err(|e| {
        let e = silent(e);
        io::Error::new(e.kind(), format!("the data stream was refused ({e})"))
    })?;
    stream.set_read_timeout(None)?;
    Ok(stream)
}

/// `sluice serve --relay PORT`: carries stdin to the local listener on
/// PORT and what it sends to stdout, until either side closes.
pub fn relay(port: u16) -> io::Result<()> {
    let sock =
        TcpStream::connect(("127.0.0.1", port)).or_else(|_| TcpStream::connect(("::1", port)))?;
    sock.set_nodelay(true)?;
    let mut back = sock.try_clone()?;
    // Stdout is line-buffered: each read is passed on and flushed as it
    // comes, or a reply short of a newline would wait for ever.
    let down = std::thread::spawn(move || -> io::Result<()> {
        let mut out = std::io::stdout().lock();
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = match back.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            out.write_all(&buf[..n])?;
            out.flush()?;
        }
    });
    let mut to = sock.try_clone()?;
    let up = io::copy(&mut std::io::stdin().lock(), &mut to);
    let _ = sock.shutdown(std::net::Shutdown::Write);
    let _ = down.join();
    up.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn listening(
        n: usize,
        encrypt: bool,
    ) -> (Offer, mpsc::Receiver<Stream>, mpsc::Receiver<String>) {
        let (tx, rx) = mpsc::channel();
        let (ltx, lrx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let ltx = Mutex::new(ltx);
        let offer = listen(
            n,
            encrypt,
            None,
            move |s| {
                let _ = tx.lock().unwrap().send(s);
            },
            move |m| {
                let _ = ltx.lock().unwrap().send(m);
            },
        )
        .unwrap();
        (offer, rx, lrx)
    }

    #[test]
    fn streams_carry_bytes_both_ways_with_and_without_tls() {
        for encrypt in [true, false] {
            let (offer, rx, _) = listening(2, encrypt);
            let mut a = connect(&offer, "localhost").unwrap();
            let mut b = rx.recv_timeout(SETUP).unwrap();
            a.write_all(b"ping").unwrap();
            a.flush().unwrap();
            let mut got = [0u8; 4];
            b.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"ping");
            b.write_all(b"pong").unwrap();
            b.flush().unwrap();
            a.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"pong");
        }
    }

    #[test]
    fn a_wrong_token_a_wrong_fingerprint_or_one_stream_too_many_is_refused() {
        let (offer, rx, log) = listening(1, true);
        // A wrong token: refused, logged, and no slot used.
        let mut wrong = offer.clone();
        wrong.token[0] ^= 1;
        let e = connect(&wrong, "localhost").err().expect("refused");
        assert!(e.to_string().contains("refused"), "{e}");
        let said = log.recv_timeout(SETUP).unwrap();
        assert!(said.contains("wrong token"), "{said}");
        // A certificate that is not the one named: the client refuses it.
        let mut other = offer.clone();
        other.fingerprint[0] ^= 1;
        assert!(connect(&other, "localhost").is_err());
        // The right one is taken...
        connect(&offer, "localhost").unwrap();
        rx.recv_timeout(SETUP).unwrap();
        // ...and then the listener is gone: one more cannot connect.
        std::thread::sleep(Duration::from_millis(100));
        assert!(connect(&offer, "localhost").is_err());
    }
}
