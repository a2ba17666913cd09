//! Command-line arguments, parsed once into the engine's options.

use crate::size::{parse_rate, parse_size};
use clap::{Args, Parser, Subcommand, ValueEnum};
use sluice_engine::image::ImageOptions;
use sluice_engine::shard::Shard;
use sluice_engine::{Check, CopyOptions, Filter, HashKind, Reflink};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "Copy very large file trees and files as fast as the hardware allows"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Copy SRC to DST, replacing what differs (entries already up to date are left alone).
    ///
    /// Like `sync`, a copy compares with what DST already has and writes only
    /// what differs (size and mtime, or content with --checksum), so running it
    /// again finishes an interrupted job. It never removes anything from DST.
    Copy(CopyArgs),
    /// Copy only what changed; with --delete, remove what SRC no longer has.
    ///
    /// What `sync` adds over `copy`: --delete (remove DST entries SRC does not
    /// have, only after both trees were walked without a single error; never an
    /// empty SRC root's worth without --allow-empty-src, never inside another
    /// file system mounted in DST) and --max-delete N.
    Sync(SyncArgs),
    /// Compare SRC and DST content (and metadata); change nothing.
    #[command(
        mut_arg("src", |a| a.help("The tree (or file) to compare against: the original")),
        mut_arg("dst", |a| a.help("The tree (or file) compared with SRC: the copy")),
        mut_arg("more", |a| a.hide(true))
    )]
    Verify(VerifyArgs),
    /// Block-level copy of a block device or image file; run again, it
    /// writes only the chunks that changed.
    Image(ImageArgs),
    /// Sync, then keep DST current as SRC changes (inotify, with periodic
    /// full rescans); stop with Ctrl-C.
    #[command(mut_arg("more", |a| a.hide(true)))]
    ///
    /// A watch mirrors, so deletes propagate by default: a replica that kept
    /// every file SRC removed would drift from SRC without bound, and the one
    /// thing a mirror is for is to look like its source. --no-delete keeps
    /// them. The same guards as `sync --delete` hold: deletes only after a
    /// clean listing, never for an empty SRC root, and the watch pauses while
    /// SRC or DST is not the directory it started with (an unmounted share).
    Watch(WatchArgs),
    /// Measure throughput at 1, 2, 4, 8... streams and recommend a count.
    Probe(ProbeArgs),
    /// The far end of a network copy: started by sluice over ssh on the
    /// other host, it answers on stdin and stdout. Not for interactive use.
    Serve(ServeArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish,
    /// powershell) on stdout, e.g.
    /// `sluice completions bash > /etc/bash_completion.d/sluice`.
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff) on stdout, e.g.
    /// `sluice man > /usr/local/share/man/man1/sluice.1`.
    Man,
}

impl Command {
    /// The SRC and DST paths the command was given.
    pub fn paths(&self) -> Vec<&std::path::Path> {
        fn job(j: &JobArgs) -> Vec<&std::path::Path> {
            let mut v = vec![j.src.as_path(), j.dst.as_path()];
            v.extend(j.more.iter().map(|p| p.as_path()));
            v
        }
        match self {
            Command::Copy(c) => job(&c.job),
            Command::Sync(c) => job(&c.copy.job),
            Command::Verify(c) => job(&c.job),
            Command::Watch(c) => job(&c.job),
            Command::Image(c) => vec![&c.src, &c.dst],
            Command::Probe(c) => vec![&c.src, &c.dst],
            Command::Serve(_) | Command::Completions { .. } | Command::Man => Vec::new(),
        }
    }
}

#[derive(Args)]
pub struct ServeArgs {
    /// Speak the protocol on stdin and stdout (the only way so far).
    #[arg(long, required_unless_present = "relay")]
    pub stdio: bool,
    /// Carry one data stream between stdin/stdout and the local `sluice
    /// serve` listening on PORT: what a client runs over its own ssh
    /// connection when it cannot reach that port directly.
    #[arg(long, value_name = "PORT", conflicts_with = "stdio", hide = true)]
    pub relay: Option<u16>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ReflinkArg {
    Auto,
    Always,
    Never,
}

/// `-j N` or `-j auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Jobs {
    Fixed(usize),
    Auto,
}

fn parse_jobs(s: &str) -> Result<Jobs, String> {
    if s == "auto" {
        return Ok(Jobs::Auto);
    }
    s.parse()
        .map(Jobs::Fixed)
        .map_err(|_| format!("invalid stream count {s:?}: a number, or auto"))
}

/// How a job reports.
#[derive(Args)]
pub struct Show {
    /// Print one JSON object per line on stdout; the last is the summary.
    #[arg(long)]
    pub json: bool,
    /// Show a progress bar even when stderr is not a terminal.
    #[arg(short = 'P', long, overrides_with = "no_progress")]
    pub progress: bool,
    /// Never show a progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// A line per entry created, updated, linked or deleted, with why
    /// (new, size, mtime, content, mode, owner, xattrs...); with --dry-run,
    /// what would be; with --json, `{"type":"entry",...}` objects.
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Append every per-entry event (created, updated, linked, deleted,
    /// failed, with why) to FILE as timestamped lines.
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Print only errors: no progress, no summary table.
    #[arg(short = 'q', long, conflicts_with = "progress")]
    pub quiet: bool,
}

impl Show {
    /// Whether to draw progress on stderr.
    pub fn bar(&self) -> bool {
        use std::io::IsTerminal;
        !self.no_progress && !self.quiet && (self.progress || std::io::stderr().is_terminal())
    }
}

/// How a remote side (`[user@]host:PATH`) is reached.
#[derive(Args, Clone)]
pub struct RemoteArgs {
    /// The command that reaches a remote host (`[user@]host:PATH`), run as
    /// `CMD [user@]host sluice serve --stdio`, as rsync's -e is.
    #[arg(
        short = 'e',
        long,
        value_name = "CMD",
        env = "SLUICE_RSH",
        default_value = "ssh"
    )]
    pub rsh: String,
    /// The sluice binary on the remote host.
    #[arg(long, value_name = "PATH", default_value = "sluice")]
    pub remote_path: String,
    /// Direct TCP connections file data crosses, beside the ssh
    /// connection (TLS 1.3, pinned to a certificate made for the job); 0
    /// sends everything over ssh. Where they cannot connect (only ssh's
    /// port open), each goes through an ssh connection of its own.
    /// [default: 4, then more while more carry more]
    #[arg(long, value_name = "N")]
    pub streams: Option<usize>,
    /// Data streams in plain TCP, not TLS, for links you trust (a
    /// one-time token still admits only this job's connections).
    #[arg(long)]
    pub no_encryption: bool,
}

/// What every job command takes: the two sides, the pool, the filters,
/// and how it reports.
#[derive(Args)]
pub struct JobArgs {
    /// Source directory or file.
    pub src: PathBuf,
    /// Destination: receives SRC's contents (created if missing).
    pub dst: PathBuf,
    /// More paths (copy and sync): `sluice copy A B DIR` copies each of the
    /// sources A and B into DIR/A and DIR/B, and the last path is DST.
    #[arg(value_name = "MORE")]
    pub more: Vec<PathBuf>,
    /// Parallel streams, or `auto`: tuned while the job runs, starting at 8
    /// or where `sluice probe --save` found best for this pair [default: auto].
    #[arg(short = 'j', long = "jobs", value_name = "N|auto", value_parser = parse_jobs)]
    pub jobs: Option<Jobs>,
    /// Files above twice this size are split into chunks handled in parallel
    /// [default: 64M, or what `sluice probe --save` found for this pair].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub chunk_size: Option<u64>,
    /// Skip entries matching GLOB (name, or path relative to SRC if it has a '/').
    #[arg(long, value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Never skip entries matching GLOB, even if an --exclude matches.
    #[arg(long, value_name = "GLOB")]
    pub include: Vec<String>,
    /// Read --exclude patterns from FILE, one per line (blank lines and
    /// lines starting with # or ; are skipped; `-` is stdin).
    #[arg(long, value_name = "FILE")]
    pub exclude_from: Vec<PathBuf>,
    /// Read --include patterns from FILE, as --exclude-from does.
    #[arg(long, value_name = "FILE")]
    pub include_from: Vec<PathBuf>,
    /// Copy only the paths FILE lists, one per line, relative to SRC (a
    /// listed directory with everything in it; `-` is stdin). Nothing else
    /// is touched, --delete included.
    #[arg(long, value_name = "FILE")]
    pub files_from: Option<PathBuf>,
    /// Do not descend into directories on other file systems.
    #[arg(short = 'x', long)]
    pub one_file_system: bool,
    /// Read and write files of 1 MiB and more with O_DIRECT, bypassing the
    /// page cache (the default; falls back to buffered I/O where unsupported).
    #[arg(long, overrides_with = "no_direct")]
    pub direct: bool,
    /// Move every file through the page cache.
    #[arg(long)]
    pub no_direct: bool,
    /// The most memory the job may use: streams and buffers are sized to
    /// fit [default: an eighth of RAM].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub mem_limit: Option<u64>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub show: Show,
    /// The saved probe for this pair, looked up once.
    #[arg(skip)]
    saved: std::cell::OnceCell<Option<crate::saved::Saved>>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum HashArg {
    /// XXH3-128: fast, non-cryptographic.
    Xxh3,
    /// BLAKE3-256: cryptographic.
    Blake3,
}

impl HashArg {
    fn kind(self) -> HashKind {
        match self {
            HashArg::Xxh3 => HashKind::Xxh3,
            HashArg::Blake3 => HashKind::Blake3,
        }
    }
}

#[derive(Args)]
pub struct CopyArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Compare files whose size and mtime match by content too (reads both sides).
    #[arg(short = 'c', long)]
    pub checksum: bool,
    /// Take files of the same size as up to date, whatever their mtimes.
    #[arg(long, conflicts_with = "checksum")]
    pub size_only: bool,
    /// Leave alone files that are newer in DST than in SRC.
    #[arg(short = 'u', long)]
    pub update: bool,
    /// Leave alone every entry DST already has; copy only what it lacks.
    #[arg(long)]
    pub ignore_existing: bool,
    /// Do not preserve owner and group (new entries belong to the user
    /// running sluice; the default when not root).
    #[arg(long)]
    pub no_owner: bool,
    /// Do not copy permission bits: new entries get SRC's less the umask,
    /// existing ones keep DST's, and modes are not compared.
    #[arg(long)]
    pub no_perms: bool,
    /// Do not copy extended attributes (nor POSIX ACLs, which are stored
    /// as extended attributes): for targets that cannot hold them.
    #[arg(long)]
    pub no_xattrs: bool,
    /// Do not copy POSIX ACLs; other extended attributes are copied.
    #[arg(long)]
    pub no_acls: bool,
    /// Read back every file written and compare it with its source before
    /// it gets its final name.
    #[arg(long)]
    pub verify: bool,
    /// Hash used by --verify.
    #[arg(long, value_enum, default_value = "xxh3")]
    pub hash: HashArg,
    /// Walk and count what would be copied; write nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Make every file and directory durable (fsync) before it counts as done.
    #[arg(long)]
    pub fsync: bool,
    /// Share data blocks with the source where the file system can (xfs, btrfs).
    #[arg(long, value_enum, default_value = "auto")]
    pub reflink: ReflinkArg,
    /// Move at most RATE of file data per second over all streams
    /// (100MB/s, 1G; a bare number is KiB/s, as in rsync).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bwlimit: Option<u64>,
    /// Update changed big files by patching DST's copy in place, writing
    /// only the blocks that differ, on any file system. Readers may see a
    /// half-updated file while it runs; an interrupted run is finished by
    /// the next one.
    #[arg(long)]
    pub inplace: bool,
    /// Copy a file again up to N times when its source changes while it is
    /// copied, then report it as failed.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub retries: u32,
    /// Do part I of N (counting from 0) of the job, so that N runs started
    /// anywhere (a Slurm array, an indexed job, ssh in a loop) share it
    /// without talking to each other: files by path, big files by chunk.
    /// A missing I or N (`/N`, `auto`) comes from SLURM_PROCID and
    /// SLURM_NTASKS, OMPI_COMM_WORLD_RANK and _SIZE, PMI_RANK and
    /// PMI_SIZE, or JOB_COMPLETION_INDEX.
    #[arg(long, value_name = "I/N", conflicts_with = "inplace")]
    pub shard: Option<String>,
}

#[derive(Args)]
pub struct SyncArgs {
    #[command(flatten)]
    pub copy: CopyArgs,
    /// Remove entries of DST that SRC does not have, only after both trees
    /// were walked without a single error. Excluded entries are kept.
    #[arg(long)]
    pub delete: bool,
    /// Stop before deleting more than N entries (and exit 1).
    #[arg(long, value_name = "N", requires = "delete")]
    pub max_delete: Option<u64>,
    /// Let --delete empty DST when SRC's root is empty. Without it, an empty
    /// SRC root (an unmounted share, an expired automount) deletes nothing
    /// and exits 1.
    #[arg(long, requires = "delete")]
    pub allow_empty_src: bool,
}

#[derive(Args)]
pub struct ProbeArgs {
    /// Source directory (its files are read, never changed);
    /// [user@]host:PATH on another host.
    pub src: PathBuf,
    /// Destination directory: trials write into a scratch directory in it,
    /// removed at the end; [user@]host:PATH on another host.
    pub dst: PathBuf,
    /// Length of each trial.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    pub seconds: f64,
    /// One JSON object per trial and per recommendation on stdout.
    #[arg(long)]
    pub json: bool,
    /// Drop the page cache before every trial (as root), so each reads
    /// from the disk as a cold job would. It drops the whole machine's
    /// cache, which slows everything else running there, so it is asked
    /// for, never done by default.
    #[arg(long)]
    pub cold: bool,
    /// (The default now; kept so older scripts still run.)
    #[arg(long, hide = true, conflicts_with = "cold")]
    pub warm: bool,
    /// Keep the recommendation (in ~/.local/state/sluice/probes.json):
    /// later `-j auto` jobs between these file systems start from it.
    #[arg(long)]
    pub save: bool,
    #[command(flatten)]
    pub remote: RemoteArgs,
}

#[derive(Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Keep entries of DST that SRC removed (by default a watch mirrors:
    /// deletes propagate, each directory's only after both of its
    /// listings were read without error).
    #[arg(long)]
    pub no_delete: bool,
    /// Stop a pass before it deletes more than N entries (and report it).
    #[arg(long, value_name = "N")]
    pub max_delete: Option<u64>,
    /// Let a pass empty DST when SRC's root is empty. Without it, an empty
    /// SRC root deletes nothing (and a SRC that is no longer the directory
    /// the watch started with pauses the watch until it is back).
    #[arg(long)]
    pub allow_empty_src: bool,
    /// A full sync of the whole tree this often, as a safety net for
    /// events the kernel did not deliver.
    #[arg(long, value_name = "SECONDS", default_value_t = 600.0)]
    pub rescan: f64,
    /// Make every file and directory durable (fsync) before it counts as done.
    #[arg(long)]
    pub fsync: bool,
    /// Move at most RATE of file data per second over all streams
    /// (100MB/s, 1G; a bare number is KiB/s, as in rsync).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bwlimit: Option<u64>,
}

impl WatchArgs {
    /// A pass's options: a full pass tunes its streams like `sync`; a pass
    /// over a few changed directories runs a few streams.
    pub fn options(&self, full: bool) -> Result<CopyOptions, String> {
        let base = self.job.options()?;
        let small = !full && base.auto_jobs;
        Ok(CopyOptions {
            delete: !self.no_delete,
            max_delete: self.max_delete,
            allow_empty_src: self.allow_empty_src,
            fsync: self.fsync,
            bwlimit: self.bwlimit,
            auto_jobs: base.auto_jobs && !small,
            jobs: if small { 4 } else { base.jobs },
            ..base
        })
    }
}

#[derive(Args)]
pub struct ImageArgs {
    /// Block device or image file to read ([user@]host:PATH on another host).
    pub src: PathBuf,
    /// Image file or block device to write (DST/name if DST is a directory;
    /// [user@]host:PATH on another host).
    pub dst: PathBuf,
    /// Parallel streams [default: 4].
    #[arg(short = 'j', long = "jobs", value_name = "N")]
    pub jobs: Option<usize>,
    /// Unit of comparison and copy; the chunk map keeps one hash per chunk
    /// [default: 4M].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub chunk_size: Option<u64>,
    /// Move data through the page cache instead of O_DIRECT (the default
    /// where the file systems allow it).
    #[arg(long)]
    pub no_direct: bool,
    /// Do not trust the chunk map: compare with DST's data and rebuild the map.
    #[arg(long)]
    pub rehash: bool,
    /// Image a block device even while it is mounted read-write (the copy
    /// may be inconsistent; image a snapshot instead).
    #[arg(long)]
    pub allow_mounted: bool,
    /// Where to keep the chunk map [default: DST.sluice-map beside a file
    /// DST; for a block device, under ~/.local/state/sluice/maps].
    #[arg(long, value_name = "PATH")]
    pub map: Option<PathBuf>,
    /// Count the chunks that would be written; write nothing.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Move at most RATE per second (100MB/s; a bare number is KiB/s).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub bwlimit: Option<u64>,
    /// The most memory the job may use [default: an eighth of RAM].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub mem_limit: Option<u64>,
    #[command(flatten)]
    pub remote: RemoteArgs,
    #[command(flatten)]
    pub show: Show,
}

impl ImageArgs {
    pub fn options(&self) -> Result<ImageOptions, String> {
        let defaults = ImageOptions::default();
        if self.jobs == Some(0) {
            return Err("--jobs must be at least 1".into());
        }
        Ok(ImageOptions {
            jobs: self.jobs.unwrap_or(defaults.jobs),
            chunk_size: self.chunk_size.unwrap_or(defaults.chunk_size),
            direct: !self.no_direct,
            rehash: self.rehash,
            allow_mounted: self.allow_mounted,
            map: self.map.clone(),
            dry_run: self.dry_run,
            bwlimit: self.bwlimit,
            mem_limit: self.mem_limit.unwrap_or(defaults.mem_limit),
            ..defaults
        })
    }
}

#[derive(Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub job: JobArgs,
    /// Content hash.
    #[arg(long, value_enum, default_value = "xxh3")]
    pub hash: HashArg,
    /// Compare mode, owner (as root), mtime and extended attributes too.
    #[arg(long)]
    pub metadata: bool,
}

/// `given` followed by the patterns in each of `files` (one per line; blank
/// lines and `#` or `;` comments skipped, as rsync reads them).
fn with_patterns_from(given: &[String], files: &[PathBuf]) -> Result<Vec<String>, String> {
    let mut all = given.to_vec();
    for f in files {
        let text = if f.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin())
        } else {
            std::fs::read_to_string(f)
        }
        .map_err(|e| format!("cannot read patterns from {}: {e}", f.display()))?;
        all.extend(
            text.lines()
                .map(|l| l.trim_end_matches('\r'))
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#') && !l.starts_with(';'))
                .map(str::to_owned),
        );
    }
    Ok(all)
}

/// The paths `--files-from` lists: one per line, as bytes (any name Linux
/// allows but one with a newline); blank lines and `#`/`;` comments skipped.
fn paths_from(list: &std::path::Path) -> Result<Vec<Vec<u8>>, String> {
    use std::io::Read;
    let mut raw = Vec::new();
    let read = if list.as_os_str() == "-" {
        std::io::stdin().read_to_end(&mut raw)
    } else {
        std::fs::File::open(list).and_then(|mut f| f.read_to_end(&mut raw))
    };
    read.map_err(|e| format!("cannot read the list {}: {e}", list.display()))?;
    Ok(raw
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty() && l[0] != b'#' && l[0] != b';')
        .map(<[u8]>::to_vec)
        .collect())
}

impl JobArgs {
    /// The engine's options for these arguments.
    pub fn options(&self) -> Result<CopyOptions, String> {
        if let Some(c) = self.chunk_size.filter(|&c| c < 4096 || c % 4096 != 0) {
            return Err(format!(
                "--chunk-size must be a multiple of 4 KiB and at least 4 KiB, got {c}"
            ));
        }
        if self.jobs == Some(Jobs::Fixed(0)) {
            return Err("--jobs must be at least 1".into());
        }
        let exclude = with_patterns_from(&self.exclude, &self.exclude_from)?;
        let include = with_patterns_from(&self.include, &self.include_from)?;
        let mut filter = Filter::new(&exclude, &include).map_err(|e| e.to_string())?;
        if let Some(list) = &self.files_from {
            filter = filter.only(&paths_from(list)?);
        }
        let defaults = CopyOptions::default();
        let auto = matches!(self.jobs, None | Some(Jobs::Auto));
        let saved = self.saved_probe();
        Ok(CopyOptions {
            jobs: match self.jobs {
                Some(Jobs::Fixed(n)) => n,
                _ => saved
                    .as_ref()
                    .and_then(|s| s.start_streams())
                    .unwrap_or(defaults.jobs),
            },
            auto_jobs: auto,
            chunk_size: self
                .chunk_size
                .or(saved.and_then(|s| s.big.map(|b| b.1)))
                .unwrap_or(defaults.chunk_size),
            filter,
            one_file_system: self.one_file_system,
            direct: !self.no_direct,
            verbose: self.show.verbose || self.show.log_file.is_some(),
            mem_limit: self.mem_limit.unwrap_or(defaults.mem_limit),
            ..defaults
        })
    }
}

impl JobArgs {
    /// Each source with the destination it is copied to: SRC and DST, or
    /// with more paths, every path but the last into the last, each under
    /// its own name (as `cp A B DIR` does).
    pub fn pairs(&self) -> Result<Vec<(PathBuf, PathBuf)>, String> {
        if self.more.is_empty() {
            return Ok(vec![(self.src.clone(), self.dst.clone())]);
        }
        let mut all: Vec<&PathBuf> = vec![&self.src, &self.dst];
        all.extend(&self.more);
        let (dst, sources) = all.split_last().expect("at least three paths");
        sources
            .iter()
            .map(|src| {
                let name = std::fs::canonicalize(src)
                    .ok()
                    .and_then(|p| p.file_name().map(|n| n.to_owned()))
                    .ok_or_else(|| format!("{} names no file or directory", src.display()))?;
                Ok(((*src).clone(), dst.join(name)))
            })
            .collect()
    }

    /// Refuses more than one source, for commands that take exactly one.
    pub fn one_pair(&self, command: &str) -> Result<(), String> {
        match self.more.first() {
            None => Ok(()),
            Some(p) => Err(format!(
                "`sluice {command}` takes one SRC and one DST (unexpected {})",
                p.display()
            )),
        }
    }

    /// A probe saved for this pair, which `-j auto` starts from.
    pub fn saved_probe(&self) -> Option<&crate::saved::Saved> {
        self.saved
            .get_or_init(|| match self.jobs {
                None | Some(Jobs::Auto) => crate::saved::find(&self.src, &self.dst),
                Some(Jobs::Fixed(_)) => None,
            })
            .as_ref()
    }
}

impl CopyArgs {
    pub fn options(&self) -> Result<CopyOptions, String> {
        Ok(CopyOptions {
            dry_run: self.dry_run,
            reflink: match self.reflink {
                ReflinkArg::Auto => Reflink::Auto,
                ReflinkArg::Always => Reflink::Always,
                ReflinkArg::Never => Reflink::Never,
            },
            fsync: self.fsync,
            checksum: self.checksum,
            size_only: self.size_only,
            perms: !self.no_perms,
            update: self.update,
            ignore_existing: self.ignore_existing,
            preserve_owner: !self.no_owner && sluice_engine::CopyOptions::default().preserve_owner,
            xattrs: match (self.no_xattrs, self.no_acls) {
                (true, _) => None,
                (false, true) => Some(sluice_engine::XattrSet::NoAcls),
                (false, false) => Some(sluice_engine::XattrSet::All),
            },
            verify: self.verify,
            hash: self.hash.kind(),
            inplace: self.inplace,
            retries: self.retries,
            bwlimit: self.bwlimit,
            shard: match &self.shard {
                Some(spec) => Some(Shard::parse(spec, |var| std::env::var(var).ok())?),
                None => None,
            },
            ..self.job.options()?
        })
    }
}

impl SyncArgs {
    pub fn options(&self) -> Result<CopyOptions, String> {
        if self.delete && self.copy.shard.is_some() {
            return Err(
                "--delete cannot be used with --shard: no part sees the whole tree, \
                        so none can tell what DST has too many (run one `sluice sync \
                        --delete` after the parts)"
                    .into(),
            );
        }
        Ok(CopyOptions {
            delete: self.delete,
            max_delete: self.max_delete,
            allow_empty_src: self.allow_empty_src,
            ..self.copy.options()?
        })
    }
}

impl VerifyArgs {
    /// Options for verifying an image pair (a block device on a side).
    pub fn image_options(&self) -> ImageOptions {
        ImageOptions {
            check: true,
            jobs: match self.job.jobs {
                Some(Jobs::Fixed(n)) => n.max(1),
                _ => sluice_engine::image::IMAGE_JOBS,
            },
            ..ImageOptions::default()
        }
    }

    pub fn options(&self) -> Result<CopyOptions, String> {
        Ok(CopyOptions {
            check: Some(Check {
                metadata: self.metadata,
            }),
            hash: self.hash.kind(),
            ..self.job.options()?
        })
    }
}
