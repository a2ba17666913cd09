//! Helpers: building trees, running the binary, comparing trees.

#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The binary, with no saved probe to start from (a test that wants one
/// sets `XDG_STATE_HOME` again).
pub fn sluice() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sluice"));
    c.env(
        "XDG_STATE_HOME",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-saved-probes"),
    );
    c
}

/// Runs `sluice copy SRC DST ARGS` and returns its output.
pub fn copy(src: &Path, dst: &Path, args: &[&str]) -> Output {
    run_cmd("copy", src, dst, args)
}

/// Runs `sluice sync SRC DST ARGS` and returns its output.
pub fn sync(src: &Path, dst: &Path, args: &[&str]) -> Output {
    run_cmd("sync", src, dst, args)
}

/// Runs `sluice COMMAND SRC DST ARGS --no-progress`.
pub fn run_cmd(command: &str, src: &Path, dst: &Path, args: &[&str]) -> Output {
    sluice()
        .arg(command)
        .arg(src)
        .arg(dst)
        .args(args)
        .arg("--no-progress")
        .output()
        .expect("run sluice")
}

/// The summary object that ends a `--json` run's stdout.
pub fn summary(o: &Output) -> serde_json::Value {
    let out = stdout(o);
    let last = out
        .lines()
        .last()
        .unwrap_or_else(|| panic!("no output; stderr: {}", stderr(o)));
    let v: serde_json::Value = serde_json::from_str(last).expect("summary is JSON");
    assert_eq!(v["type"], "summary", "{out}");
    v
}

/// The `{"type": kind}` lines of a `--json` run's stdout.
pub fn json_lines(o: &Output, kind: &str) -> Vec<serde_json::Value> {
    stdout(o)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == kind)
        .collect()
}

/// (path, ctime) of every entry under `root`, and of the root itself: a
/// run that changes nothing leaves all of them alone.
pub fn ctimes(root: &Path) -> Vec<(PathBuf, (i64, i64))> {
    let mut v: Vec<_> = entries(root)
        .into_iter()
        .map(|rel| {
            let m = fs::symlink_metadata(root.join(&rel)).unwrap();
            (rel, (m.ctime(), m.ctime_nsec()))
        })
        .collect();
    let m = fs::metadata(root).unwrap();
    v.push((PathBuf::new(), (m.ctime(), m.ctime_nsec())));
    v
}

pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Asserts exit 0 and shows the output otherwise.
pub fn ok(o: &Output) {
    assert_eq!(
        code(o),
        0,
        "sluice failed:\nstdout: {}\nstderr: {}",
        stdout(o),
        stderr(o)
    );
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A scratch directory on the disk (under the cargo target dir, not /tmp,
/// which may be tmpfs).
pub fn disk_dir(name: &str) -> tempfile::TempDir {
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tempfile::Builder::new()
        .prefix(name)
        .tempdir_in(base)
        .expect("tempdir")
}

/// A scratch directory on tmpfs, if one is mounted at /dev/shm.
pub fn tmpfs_dir(name: &str) -> Option<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return None;
    }
    tempfile::Builder::new().prefix(name).tempdir_in(shm).ok()
}

pub fn write(path: &Path, data: &[u8]) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    fs::write(path, data).unwrap();
}

/// Deterministic pseudo-random bytes.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn set_mtime(path: &Path, sec: i64, nsec: i64) {
    let times = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: sec - 1000,
            tv_nsec: nsec,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: nsec,
        },
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
}

pub fn run(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

pub fn have(cmd: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {cmd}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Every entry's relative path under `root`, sorted, root excluded.
pub fn entries(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().to_path_buf());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

fn xattrs(path: &Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut names = vec![0u8; 65536];
    let n = match rustix::fs::llistxattr(path, &mut names[..]) {
        Ok(n) => n,
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let mut val = vec![0u8; 65536];
        let name_os = OsStr::from_bytes(name);
        if let Ok(len) = rustix::fs::lgetxattr(path, name_os, &mut val[..]) {
            out.push((name.to_vec(), val[..len].to_vec()));
        }
    }
    out.sort();
    out
}

/// What must be identical between a source entry and its copy.
#[derive(Debug, PartialEq)]
struct Facts {
    kind: String,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    mtime: (i64, i64),
    rdev: u64,
    target: Option<PathBuf>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn facts(path: &Path, check_owner: bool) -> Facts {
    let m = fs::symlink_metadata(path).unwrap();
    let ft = m.file_type();
    let kind = if ft.is_dir() {
        "dir"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_file() {
        "file"
    } else if ft.is_fifo() {
        "fifo"
    } else if ft.is_char_device() {
        "chardev"
    } else if ft.is_block_device() {
        "blockdev"
    } else {
        "socket"
    };
    Facts {
        kind: kind.into(),
        mode: if ft.is_symlink() {
            0
        } else {
            m.permissions().mode() & 0o7777
        },
        uid: if check_owner { m.uid() } else { 0 },
        gid: if check_owner { m.gid() } else { 0 },
        size: if ft.is_dir() || ft.is_symlink() {
            0
        } else {
            m.size()
        },
        mtime: (m.mtime(), m.mtime_nsec()),
        rdev: m.rdev(),
        target: ft.is_symlink().then(|| fs::read_link(path).unwrap()),
        xattrs: if ft.is_symlink() {
            Vec::new()
        } else {
            xattrs(path)
        },
    }
}

/// Asserts that `dst` is an exact copy of `src`: same entries, kinds,
/// modes, owners (when root), nanosecond mtimes, xattrs, file bytes,
/// symlink targets, and the same hard-link grouping.
pub fn assert_same_tree(src: &Path, dst: &Path) {
    let a = entries(src);
    let b = entries(dst);
    assert_eq!(a, b, "entry lists differ");
    let root = is_root();
    let mut src_groups: HashMap<u64, Vec<PathBuf>> = HashMap::new();
    let mut dst_groups: HashMap<u64, Vec<PathBuf>> = HashMap::new();
    for rel in &a {
        let (s, d) = (src.join(rel), dst.join(rel));
        assert_eq!(
            facts(&s, root),
            facts(&d, root),
            "metadata differs for {}",
            rel.display()
        );
        let sm = fs::symlink_metadata(&s).unwrap();
        if sm.is_file() {
            assert!(
                fs::read(&s).unwrap() == fs::read(&d).unwrap(),
                "content differs for {}",
                rel.display()
            );
            if sm.nlink() > 1 {
                src_groups.entry(sm.ino()).or_default().push(rel.clone());
                dst_groups
                    .entry(fs::metadata(&d).unwrap().ino())
                    .or_default()
                    .push(rel.clone());
            }
        }
    }
    let mut sg: Vec<_> = src_groups.into_values().collect();
    let mut dg: Vec<_> = dst_groups.into_values().collect();
    sg.iter_mut().for_each(|g| g.sort());
    dg.iter_mut().for_each(|g| g.sort());
    sg.sort();
    dg.sort();
    assert_eq!(sg, dg, "hard-link groups differ");
    let (sm, dm) = (fs::metadata(src).unwrap(), fs::metadata(dst).unwrap());
    assert_eq!(
        (sm.mtime(), sm.mtime_nsec()),
        (dm.mtime(), dm.mtime_nsec()),
        "root mtime differs"
    );
}

/// No sluice temporaries anywhere under `root`.
pub fn assert_no_temporaries(root: &Path) {
    for rel in entries(root) {
        let name = rel.file_name().unwrap().as_bytes();
        assert!(
            !name.starts_with(b".sluice-"),
            "leftover temporary or state file {}",
            rel.display()
        );
    }
}

/// After a stop (SIGINT, full disk): temporaries may remain only as resume
/// state, that is with a journal in DST's root that records them.
pub fn assert_only_resume_state(root: &Path) {
    let journal = root.join(".sluice-journal.redb").exists();
    for rel in entries(root) {
        let name = rel.file_name().unwrap().as_bytes();
        // A new directory being filled (`.sluice-0-*`) is taken up again
        // by name; a file's temporary needs the journal to be.
        let in_new_dir = rel
            .components()
            .any(|c| c.as_os_str().as_bytes().starts_with(b".sluice-0-"));
        if name.starts_with(b".sluice-") && name.ends_with(b".tmp") && !in_new_dir {
            assert!(journal, "temporary {} without a journal", rel.display());
        }
    }
}

/// Every file under a final name directly in `dst` equals its source.
pub fn assert_no_partial_files(src: &Path, dst: &Path) {
    for e in fs::read_dir(dst).unwrap().flatten() {
        let name = e.file_name();
        if name.as_bytes().starts_with(b".sluice-") || !e.file_type().unwrap().is_file() {
            continue;
        }
        assert_eq!(
            fs::read(e.path()).unwrap(),
            fs::read(src.join(&name)).unwrap(),
            "{name:?} is partial"
        );
    }
}

/// A loop-mounted file system of `fstype`, unmounted and removed on drop.
pub struct LoopFs {
    pub mnt: tempfile::TempDir,
    _img: tempfile::TempDir,
}

impl LoopFs {
    /// Creates and mounts one; `None` (with the reason printed) when not
    /// root or the tools are missing.
    pub fn new(fstype: &str, size_mb: u64) -> Option<LoopFs> {
        if !is_root() {
            eprintln!("skipped: loop-mounting {fstype} needs root");
            return None;
        }
        let mkfs = format!("mkfs.{fstype}");
        if !have(&mkfs) {
            eprintln!("skipped: {mkfs} not installed");
            return None;
        }
        let img_dir = disk_dir("img");
        let img = img_dir.path().join("fs.img");
        let f = fs::File::create(&img).unwrap();
        f.set_len(size_mb << 20).unwrap();
        let img_s = img.to_str().unwrap();
        let made = match fstype {
            "ext4" => run(&mkfs, &["-q", "-F", img_s]),
            "xfs" => run(&mkfs, &["-q", "-f", img_s]),
            "btrfs" => run(&mkfs, &["-q", "-f", img_s]),
            _ => run(&mkfs, &[img_s]),
        };
        assert!(made, "{mkfs} failed");
        let mnt = disk_dir("mnt");
        if !run(
            "mount",
            &["-o", "loop", img_s, mnt.path().to_str().unwrap()],
        ) {
            eprintln!("skipped: cannot loop-mount {fstype} here");
            return None;
        }
        Some(LoopFs { mnt, _img: img_dir })
    }

    pub fn path(&self) -> &Path {
        self.mnt.path()
    }

    /// Unmounts and mounts the image again (what a reboot would find).
    pub fn remount(&self) {
        let mnt = self.mnt.path().to_str().unwrap();
        let img = self._img.path().join("fs.img");
        assert!(run("umount", &[mnt]), "umount {mnt}");
        assert!(
            run("mount", &["-o", "loop", img.to_str().unwrap(), mnt]),
            "mount {mnt}"
        );
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.mnt.path())
            .status();
    }
}

/// A scratch directory in /tmp with `mode`, for tests that run sluice as
/// `nobody`; `None` (with the reason printed) unless root with setpriv.
pub fn nobody_dir(name: &str, mode: u32) -> Option<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() || !have("setpriv") {
        eprintln!("skipped: needs root and setpriv to run sluice as nobody");
        return None;
    }
    let t = tempfile::Builder::new()
        .prefix(name)
        .tempdir_in("/tmp")
        .unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(mode)).unwrap();
    Some(t)
}

/// Runs `sluice copy --no-progress ARGS SRC DST` as user `nobody`.
pub fn copy_as_nobody(src: &Path, dst: &Path, args: &[&str]) -> Output {
    as_nobody("copy", src, dst, args)
}

/// Runs `sluice COMMAND --no-progress ARGS SRC DST` as user `nobody`.
pub fn as_nobody(command: &str, src: &Path, dst: &Path, args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args([command, "--no-progress"])
        .args(args)
        .arg(src)
        .arg(dst)
        .output()
        .expect("run sluice as nobody")
}

/// `sluice copy --no-progress ARGS SRC DST` run under strace with one
/// `inject` rule on `pwrite64` (e.g. `delay_exit=2000000:when=1` to hold the
/// first write, `signal=KILL:when=3` to kill at the third). Returns the
/// command for the caller to run; `None`, with the reason printed, when
/// strace is missing.
pub fn copy_under_strace(inject: &str, src: &Path, dst: &Path, args: &[&str]) -> Option<Command> {
    under_strace("pwrite64", inject, "copy", src, dst, args)
}

/// `sluice COMMAND --no-progress ARGS SRC DST` under strace, with `inject`
/// applied to `syscall` (see `copy_under_strace`).
pub fn under_strace(
    syscall: &str,
    inject: &str,
    command: &str,
    src: &Path,
    dst: &Path,
    args: &[&str],
) -> Option<Command> {
    if !have("strace") {
        eprintln!("skipped: strace is not installed");
        return None;
    }
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-o", "/dev/null", "-e"])
        .arg(format!("trace={syscall}"))
        .arg("-e")
        .arg(format!("inject={syscall}:{inject}"))
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args([command, "--no-progress"])
        .args(args)
        .arg(src)
        .arg(dst);
    Some(cmd)
}

/// A loop device over `file`, detached on drop.
pub struct LoopDev {
    pub dev: PathBuf,
}

impl LoopDev {
    /// Attaches one; `None` (with the reason printed) when not root or
    /// losetup is missing.
    pub fn new(file: &Path) -> Option<LoopDev> {
        if !is_root() || !have("losetup") {
            eprintln!("skipped: loop devices need root and losetup");
            return None;
        }
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "skipped: losetup failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Some(LoopDev { dev })
    }

    pub fn path(&self) -> &Path {
        &self.dev
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// `what` (a device or image file) mounted on a new directory with
/// `options`, unmounted on drop.
pub struct Mounted {
    pub dir: tempfile::TempDir,
}

impl Mounted {
    pub fn new(what: &Path, options: &str) -> Mounted {
        let dir = disk_dir("mnt");
        assert!(
            run(
                "mount",
                &[
                    "-o",
                    options,
                    what.to_str().unwrap(),
                    dir.path().to_str().unwrap()
                ]
            ),
            "mount {} failed",
            what.display()
        );
        Mounted { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Runs `cmd` to its exit and returns its output with the process's
/// `/proc/PID/io` counters, read while it is a zombie (after it exited,
/// before it is reaped), so they cover its whole life.
pub fn output_with_io(mut cmd: Command) -> (Output, HashMap<String, u64>) {
    use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
    use std::io::Read;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        stderr.read_to_end(&mut v).unwrap();
        v
    });
    let mut out = Vec::new();
    stdout.read_to_end(&mut out).unwrap();
    let pid = Pid::from_raw(child.id() as i32).unwrap();
    waitid(
        WaitId::Pid(pid),
        WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
    )
    .expect("waitid");
    let io = fs::read_to_string(format!("/proc/{}/io", child.id())).unwrap_or_default();
    let counters = io
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().parse().ok()?))
        })
        .collect();
    let status = child.wait().unwrap();
    let output = Output {
        status,
        stdout: out,
        stderr: err.join().unwrap(),
    };
    (output, counters)
}

/// `sluice copy --no-progress ARGS SRC DST` under strace, killed (SIGKILL)
/// at its `n`th `pwrite64` (the journal writes with pwrite64 too). Returns
/// its output and how many whole 1 MiB writes (one per chunk of a copy
/// with `--chunk-size 1M`) had landed, read from the strace log at `log`.
pub fn copy_killed_at_write(
    n: u32,
    log: &Path,
    src: &Path,
    dst: &Path,
    args: &[&str],
) -> (Output, u64) {
    let killed = Command::new("strace")
        .args(["-f", "-o"])
        .arg(log)
        .args(["-e", "trace=pwrite64", "-e"])
        .arg(format!("inject=pwrite64:signal=KILL:when={n}"))
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .args(["copy", "--no-progress"])
        .args(args)
        .arg(src)
        .arg(dst)
        .output()
        .expect("run strace");
    let landed = fs::read_to_string(log)
        .unwrap()
        .lines()
        // a call interrupted by another thread's line ends in a
        // "<... pwrite64 resumed>" line
        .filter(|l| l.ends_with("= 1048576"))
        .count() as u64;
    (killed, landed)
}
