//! Where a path on the command line points: this machine, or another host
//! written `[user@]host:path`, with rsync's and scp's rule: a colon before
//! the first slash makes the path remote, so a local path holding a colon
//! is written `./a:b` (or given absolute).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One side of a job as given on the command line.
#[derive(Debug, PartialEq, Eq)]
pub enum Location {
    Local(PathBuf),
    Remote {
        user: Option<String>,
        host: String,
        path: PathBuf,
    },
}

impl Location {
    pub fn parse(arg: &OsStr) -> Location {
        let b = arg.as_bytes();
        let local = || Location::Local(PathBuf::from(arg));
        // `[v6::addr]:path`, after an optional `user@`: the host is what
        // the brackets hold.
        let first = b.iter().position(|&c| matches!(c, b':' | b'/' | b'['));
        let (host_end, colon) = match first.map(|i| (i, b[i])) {
            Some((open, b'[')) => match b[open..].iter().position(|&c| c == b']') {
                Some(close) if b.get(open + close + 1) == Some(&b':') => {
                    (open + close + 1, open + close + 1)
                }
                _ => return local(),
            },
            Some((i, b':')) => (i, i),
            _ => return local(),
        };
        let login = &b[..host_end];
        let (user, host) = match login.iter().rposition(|&c| c == b'@') {
            Some(at) => (Some(&login[..at]), &login[at + 1..]),
            None => (None, login),
        };
        let host = host.strip_prefix(b"[").unwrap_or(host);
        let host = host.strip_suffix(b"]").unwrap_or(host);
        let text = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
        Location::Remote {
            user: user.map(text),
            host: text(host),
            path: PathBuf::from(OsStr::from_bytes(&b[colon + 1..])),
        }
    }
}

impl Location {
    /// `[user@]host`, as ssh takes it.
    pub fn login(user: &Option<String>, host: &str) -> String {
        match user {
            Some(u) => format!("{u}@{host}"),
            None => host.to_string(),
        }
    }
}

/// The sides a command may not have on another host yet: both sides of
/// a copy, image or probe, a copy with several sources, and every side of
/// `watch`. A remote-looking path is never taken as a local
/// directory called `host:` (that would "succeed" and leave the data on
/// the wrong machine).
pub fn refuse_remote(paths: &[&Path], may_be_remote: bool) -> Result<(), String> {
    let remote = |p: &Path| matches!(Location::parse(p.as_os_str()), Location::Remote { .. });
    let one_side = paths.len() == 2 && !(remote(paths[0]) && remote(paths[1]));
    for p in paths {
        let Location::Remote { user, host, path } = Location::parse(p.as_os_str()) else {
            continue;
        };
        if may_be_remote && one_side {
            continue;
        }
        let login = Location::login(&user, &host);
        let what = if path.as_os_str().is_empty() {
            "the home directory".to_string()
        } else {
            path.display().to_string()
        };
        let why = if may_be_remote {
            "one side of a copy may be on another host, not both, and not with several sources"
        } else {
            "this command works on this host only"
        };
        return Err(format!(
            "{} names {what} on {login}: {why}. A local path with a colon is written ./{}",
            p.display(),
            p.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(user: Option<&str>, host: &str, path: &str) -> Location {
        Location::Remote {
            user: user.map(str::to_string),
            host: host.into(),
            path: path.into(),
        }
    }

    #[test]
    fn a_colon_before_any_slash_is_a_host() {
        let p = |s: &str| Location::parse(OsStr::new(s));
        assert_eq!(p("h:/x"), remote(None, "h", "/x"));
        assert_eq!(p("u@h:x/y"), remote(Some("u"), "h", "x/y"));
        assert_eq!(p("u@h:"), remote(Some("u"), "h", ""));
        assert_eq!(p("[::1]:/d"), remote(None, "::1", "/d"));
        assert_eq!(p("me@[fe80::1]:d"), remote(Some("me"), "fe80::1", "d"));
        for local in [
            "./a:b",
            "/abs/a:b",
            "dir/a:b",
            "plain",
            "[nobracket",
            "[x]y",
        ] {
            assert_eq!(p(local), Location::Local(local.into()), "{local}");
        }
    }
}
