//! The error policy of a job.
//!
//! * A failure that concerns one entry (unreadable file, a name the target
//!   refuses, a source that changed while it was copied) is an
//!   [`EntryError`]: it is reported with the path and the operation, its
//!   temporary is removed, and the job goes on. The job then ends with
//!   [`Outcome::Partial`](crate::Outcome) (exit 1).
//! * A failure that makes the rest of the job pointless — the target is full
//!   or read-only, the roots cannot be opened, the paths overlap — is a
//!   [`JobError`]: every stream stops at its next entry, removes its
//!   temporaries, and the job returns it (exit 2). Nothing half-written is
//!   ever left under a final name in either case.

use sluice_sys::Errno;
use std::fmt;
use std::path::PathBuf;

/// Which tree a failed operation touched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Src,
    Dst,
}

/// A failure on one entry; the job carries on without it.
#[derive(Debug, Clone)]
pub struct EntryError {
    /// Full path of the entry, as bytes (any name Linux allows).
    pub path: Vec<u8>,
    /// Which tree the path is in.
    pub side: Side,
    /// The operation that failed: `open`, `read`, `create`, `rename`...
    pub op: &'static str,
    /// What went wrong.
    pub reason: Reason,
}

/// Why an entry failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// The OS refused an operation.
    Os(Errno),
    /// The source changed while it was being copied.
    Changed(String),
    /// Anything else, said in words.
    Other(String),
}

impl EntryError {
    /// Whether this failure means the destination cannot take more data,
    /// so continuing would only fail every remaining entry the same way.
    pub fn is_fatal(&self) -> bool {
        self.side == Side::Dst
            && matches!(
                self.reason,
                Reason::Os(Errno::NOSPC) | Reason::Os(Errno::ROFS) | Reason::Os(Errno::DQUOT)
            )
    }
}

impl EntryError {
    /// Whether this is the destination running out of space (or quota).
    pub fn is_out_of_space(&self) -> bool {
        self.side == Side::Dst
            && matches!(
                self.reason,
                Reason::Os(Errno::NOSPC) | Reason::Os(Errno::DQUOT)
            )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Os(e) => {
                // The kernel's words; the number only where the words are
                // rare enough that someone will search for it.
                let io = std::io::Error::from_raw_os_error(e.raw_os_error()).to_string();
                let common = [
                    Errno::NOENT,
                    Errno::ACCESS,
                    Errno::PERM,
                    Errno::NOSPC,
                    Errno::DQUOT,
                    Errno::ROFS,
                    Errno::EXIST,
                    Errno::NOTDIR,
                    Errno::ISDIR,
                    Errno::NOTEMPTY,
                    Errno::BUSY,
                ];
                match io.rsplit_once(" (os error ") {
                    Some((words, _)) if common.contains(e) => f.write_str(words),
                    _ => f.write_str(&io),
                }
            }
            Reason::Changed(s) => write!(f, "source changed during copy ({s})"),
            Reason::Other(s) => f.write_str(s),
        }
    }
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.op, escape(&self.path), self.reason)
    }
}

impl std::error::Error for EntryError {}

/// A failure that stops the whole job (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("source {}: {}", .path.display(), io_words(.source))]
    Source {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("destination {}: {}", .path.display(), io_words(.source))]
    Destination {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Usage(String),
    #[error("stopped: {0}; {hint}", hint = hint(.0))]
    Fatal(EntryError),
}

impl JobError {
    /// SRC (at `path`) cannot be used.
    pub fn source(path: &std::path::Path, e: impl Into<std::io::Error>) -> JobError {
        JobError::Source {
            path: path.to_owned(),
            source: e.into(),
        }
    }

    /// DST (at `path`) cannot be used.
    pub fn destination(path: &std::path::Path, e: impl Into<std::io::Error>) -> JobError {
        JobError::Destination {
            path: path.to_owned(),
            source: e.into(),
        }
    }
}

/// An I/O error in the words `Reason::Os` uses (no number where the words
/// are common).
fn io_words(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(n) => Reason::Os(Errno::from_raw_os_error(n)).to_string(),
        None => e.to_string(),
    }
}

fn hint(e: &EntryError) -> &'static str {
    match e.reason {
        Reason::Os(Errno::NOSPC) | Reason::Os(Errno::DQUOT) => {
            "free space on the destination and run the same command again"
        }
        Reason::Os(Errno::ROFS) => "make the destination writable and run the same command again",
        _ => "fix the cause and run the same command again",
    }
}

/// Renders a file name for a log line: valid UTF-8 passes through, control
/// characters and invalid bytes are escaped (`\n`, `\x1b`, `\xff`), so a
/// name can never forge a line of output.
pub fn escape(name: &[u8]) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// A timestamp (seconds, nanoseconds since the epoch) as people read it:
/// `2026-11-23 14:03:27.123456789 UTC`.
pub fn date(t: (i64, u32)) -> String {
    let (secs, nanos) = t;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{nanos:09} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_errors_read_without_their_number() {
        assert_eq!(Reason::Os(Errno::ACCESS).to_string(), "Permission denied");
        assert!(Reason::Os(Errno::XDEV)
            .to_string()
            .ends_with("(os error 18)"));
    }

    #[test]
    fn dates_read_like_dates() {
        assert_eq!(date((0, 0)), "1970-01-01 00:00:00.000000000 UTC");
        assert_eq!(
            date((1_795_464_584, 5)),
            "2026-11-23 20:09:44.000000005 UTC"
        );
        assert_eq!(date((951_782_400, 0)), "2000-02-29 00:00:00.000000000 UTC");
        assert_eq!(date((-1, 0)), "1969-12-31 23:59:59.000000000 UTC");
    }

    #[test]
    fn escape_keeps_utf8_and_escapes_the_rest() {
        assert_eq!(escape("héllo".as_bytes()), "héllo");
        assert_eq!(escape(b"a\nb"), "a\\nb");
        assert_eq!(escape(b"\xff\x1b"), "\\xff\\u{1b}");
    }
}
