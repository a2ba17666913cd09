//! `sluice image`: block devices and image files copied chunk by chunk,
//! holes kept, incrementals that write only changed chunks, resume after
//! kill -9, refusal of mounted devices, and `verify` of an image pair.

use crate::common::*;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

const MIB: usize = 1 << 20;

fn image(src: &Path, dst: &Path, args: &[&str]) -> std::process::Output {
    run_cmd("image", src, dst, args)
}

/// Writes `data` at `off` of `path` without truncating it.
fn poke(path: &Path, off: u64, data: &[u8]) {
    let mut f = fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

/// A sparse image file of `size` with random data in `regions`
/// (offset, length) and holes elsewhere.
fn sparse_image(path: &Path, size: u64, regions: &[(u64, usize)]) {
    fs::File::create(path).unwrap().set_len(size).unwrap();
    for (i, &(off, len)) in regions.iter().enumerate() {
        poke(path, off, &bytes(len, 100 + i as u64));
    }
}

fn same_bytes(a: &Path, b: &Path, len: u64) {
    use std::io::Read;
    let (mut fa, mut fb) = (fs::File::open(a).unwrap(), fs::File::open(b).unwrap());
    let (mut ba, mut bb) = (vec![0u8; 4 * MIB], vec![0u8; 4 * MIB]);
    let mut off = 0u64;
    while off < len {
        let n = ((len - off) as usize).min(ba.len());
        fa.read_exact(&mut ba[..n]).unwrap();
        fb.read_exact(&mut bb[..n]).unwrap();
        assert!(
            ba[..n] == bb[..n],
            "bytes differ in [{off}, {})",
            off + n as u64
        );
        off += n as u64;
    }
}

#[test]
fn zero_chunks_stay_holes_and_a_rerun_writes_nothing() {
    let d = disk_dir("img");
    let (src, dst) = (d.path().join("src.img"), d.path().join("dst.img"));
    sparse_image(
        &src,
        256 << 20,
        &[
            (3 << 20, 5 * MIB),
            (100 << 20, MIB + 123),
            (250 << 20, 64 << 10),
        ],
    );
    // A zero-filled region that is allocated in SRC (not a hole there)
    // must still become a hole in DST.
    poke(&src, 180 << 20, &vec![0u8; 8 * MIB]);
    let o = image(&src, &dst, &["--json"]);
    ok(&o);
    let s = summary(&o);
    assert_eq!(s["mode"], "full");
    assert_eq!(s["chunks"], 64);
    same_bytes(&src, &dst, 256 << 20);
    let used = fs::metadata(&dst).unwrap().blocks() * 512;
    assert!(
        used < 10 * MIB as u64,
        "DST should hold ~7.1 MiB of data, not {used} bytes"
    );
    assert!(s["chunks_zero"].as_u64().unwrap() >= 58, "{s}");
    assert!(d.path().join("dst.img.sluice-map").exists());
    assert!(
        !fs::read_dir(d.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".tmp")),
        "temporary left behind"
    );

    let again = image(&src, &dst, &["--json"]);
    ok(&again);
    let s = summary(&again);
    assert_eq!(s["bytes_copied"], 0);
    assert_eq!(s["mode"], "unchanged");
}

#[test]
fn incremental_writes_only_the_changed_chunks() {
    let d = disk_dir("img");
    let (src, dst) = (d.path().join("src.img"), d.path().join("dst.img"));
    let size = 128 * MIB;
    fs::write(&src, bytes(size, 7)).unwrap();
    ok(&image(&src, &dst, &[]));
    // Three regions in three chunks (4 MiB each): one small change, one
    // spanning a whole chunk, one at the very end.
    poke(&src, (10 * MIB + 100) as u64, b"changed");
    poke(&src, (40 * MIB) as u64, &bytes(4 * MIB, 8));
    poke(&src, (size - 10) as u64, b"the end!!!");

    let mut cmd = sluice();
    cmd.args(["image", "--no-progress", "--json"])
        .arg(&src)
        .arg(&dst);
    let (o, io) = output_with_io(cmd);
    ok(&o);
    let s = summary(&o);
    assert_eq!(s["mode"], "incremental");
    assert_eq!(s["chunks_written"], 3, "{s}");
    assert_eq!(s["dst_bytes_read"], 0, "a trusted map spares reading DST");
    same_bytes(&src, &dst, size as u64);
    // The process itself wrote three chunks and its map, not 128 MiB.
    let wrote = io["wchar"];
    assert!(
        wrote <= (12 * MIB + 2 * MIB) as u64,
        "wrote {wrote} bytes for 3 changed chunks"
    );
    assert!(
        wrote >= (8 * MIB) as u64,
        "only {wrote} bytes written? (io counters: {io:?})"
    );
}

#[test]
fn a_dst_changed_behind_the_maps_back_is_compared_and_fixed() {
    let d = disk_dir("img");
    let (src, dst) = (d.path().join("src.img"), d.path().join("dst.img"));
    fs::write(&src, bytes(32 * MIB, 9)).unwrap();
    ok(&image(&src, &dst, &[]));
    poke(&dst, 5 * MIB as u64, b"scribbled on DST");
    let o = image(&src, &dst, &["--json"]);
    ok(&o);
    let s = summary(&o);
    assert_eq!(s["mode"], "compare", "{s}");
    assert_eq!(s["chunks_written"], 1);
    same_bytes(&src, &dst, 32 * MIB as u64);
    // --rehash compares even with a trusted map.
    let o = image(&src, &dst, &["--json", "--rehash"]);
    ok(&o);
    assert_eq!(summary(&o)["mode"], "compare");
    assert_eq!(summary(&o)["chunks_written"], 0);
}

/// kill -9 in the middle of a run, first a full copy then an incremental:
/// the final name never holds a partial first copy, and running the same
/// command again finishes with identical bytes.
#[test]
fn kill_9_then_resume_gives_identical_bytes() {
    let d = disk_dir("img");
    let (src, dst) = (d.path().join("src.img"), d.path().join("dst.img"));
    let size = 64 * MIB;
    fs::write(&src, bytes(size, 11)).unwrap();
    // Kill at the 6th pwrite: chunks are 1 MiB, one pwrite each.
    let Some(mut cmd) = under_strace(
        "pwrite64",
        "signal=KILL:when=6",
        "image",
        &src,
        &dst,
        &["--chunk-size", "1M", "-j", "2"],
    ) else {
        return;
    };
    let o = cmd.output().unwrap();
    assert!(!o.status.success(), "the run was meant to be killed");
    assert!(
        !dst.exists(),
        "a partial first copy appeared under its final name"
    );
    let o = image(&src, &dst, &["--chunk-size", "1M", "--json"]);
    ok(&o);
    same_bytes(&src, &dst, size as u64);
    let tmp_left = fs::read_dir(d.path())
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".tmp"));
    assert!(
        !tmp_left,
        "the first copy's temporary is gone after resuming"
    );

    // Now an incremental of a bigger source where every chunk changed:
    // four units of work (64 MiB); kill once a stream made its 100th write
    // (strace counts per thread), when both have finished their first unit.
    let size = 256 * MIB;
    fs::write(&src, bytes(size, 12)).unwrap();
    ok(&image(&src, &dst, &["--chunk-size", "1M"]));
    fs::write(&src, bytes(size, 13)).unwrap();
    let mut cmd = under_strace(
        "pwrite64",
        "signal=KILL:when=100",
        "image",
        &src,
        &dst,
        &["--chunk-size", "1M", "-j", "2"],
    )
    .unwrap();
    assert!(!cmd.output().unwrap().status.success());
    let o = image(&src, &dst, &["--chunk-size", "1M", "--json"]);
    ok(&o);
    let s = summary(&o);
    assert_eq!(s["mode"], "incremental", "the map survives the kill: {s}");
    assert!(
        s["chunks_written"].as_u64().unwrap() <= 192,
        "units recorded before the kill are not written again: {s}"
    );
    same_bytes(&src, &dst, size as u64);
}

#[test]
fn verify_reports_differing_chunks_of_an_image_pair() {
    let d = disk_dir("img");
    let (src, dst) = (d.path().join("src.img"), d.path().join("dst.img"));
    fs::write(&src, bytes(16 * MIB, 13)).unwrap();
    ok(&image(&src, &dst, &[]));
    let Some(lo) = LoopDev::new(&dst) else { return };
    let o = run_cmd("verify", &src, lo.path(), &["--json"]);
    ok(&o);
    assert_eq!(summary(&o)["differences"], 0);
    poke(lo.path(), (9 * MIB) as u64, b"bit rot");
    let o = run_cmd("verify", &src, lo.path(), &["--json"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let diffs = json_lines(&o, "difference");
    assert_eq!(diffs.len(), 1, "{}", stdout(&o));
    assert!(
        diffs[0]["what"].as_str().unwrap().contains("chunk 2 "),
        "{:?}",
        diffs[0]
    );
}

#[test]
fn an_image_onto_a_block_device_and_an_incremental_there() {
    let d = disk_dir("img");
    let (src, disk) = (d.path().join("src.img"), d.path().join("disk"));
    sparse_image(&src, 24 << 20, &[(MIB as u64, 3 * MIB), (20 << 20, 4096)]);
    // A device with old data everywhere: the zeros of SRC must be written.
    fs::write(&disk, bytes(32 * MIB, 14)).unwrap();
    let Some(lo) = LoopDev::new(&disk) else {
        return;
    };
    let map = d.path().join("map");
    let map_arg = map.to_str().unwrap();
    let o = image(&src, lo.path(), &["--json", "--map", map_arg]);
    ok(&o);
    assert_eq!(summary(&o)["mode"], "compare", "no map yet: DST is read");
    same_bytes(&src, lo.path(), 24 << 20);
    poke(&src, (22 << 20) as u64, b"new");
    let o = image(&src, lo.path(), &["--json", "--map", map_arg]);
    ok(&o);
    let s = summary(&o);
    assert_eq!(s["mode"], "incremental", "{s}");
    assert_eq!(s["chunks_written"], 1);
    same_bytes(&src, lo.path(), 24 << 20);
    // Smaller than SRC: refused before anything is written.
    let small = d.path().join("small");
    fs::write(&small, vec![1u8; MIB]).unwrap();
    let Some(lo_small) = LoopDev::new(&small) else {
        return;
    };
    let o = image(&src, lo_small.path(), &[]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("less than"), "{}", stderr(&o));
}

/// The end-to-end case: an ext4 volume holding 100,000 files,
/// imaged from its loop device, mounted back from the copy and compared
/// file by file; imaging it while mounted read-write is refused.
#[test]
fn an_ext4_volume_of_100k_files_round_trips() {
    if !have("mkfs.ext4") {
        eprintln!("skipped: mkfs.ext4 not installed");
        return;
    }
    let d = disk_dir("img");
    let vol = d.path().join("vol.img");
    fs::File::create(&vol).unwrap().set_len(1 << 30).unwrap();
    let Some(lo) = LoopDev::new(&vol) else { return };
    assert!(run(
        "mkfs.ext4",
        &["-q", "-F", "-N", "110000", lo.path().to_str().unwrap()]
    ));
    let copy = d.path().join("copy.img");
    {
        let m = Mounted::new(lo.path(), "rw");
        for i in 0..100_000u64 {
            let dir = m.path().join(format!("d{:03}", i % 500));
            if i < 500 {
                fs::create_dir(&dir).unwrap();
            }
            fs::write(dir.join(format!("f{i}")), bytes((i % 3000) as usize, i)).unwrap();
        }
        let o = image(lo.path(), &copy, &[]);
        assert_eq!(code(&o), 2, "a read-write mounted SRC is refused");
        assert!(stderr(&o).contains("--allow-mounted"), "{}", stderr(&o));
        assert!(!copy.exists());
    }
    let o = image(lo.path(), &copy, &["--json"]);
    ok(&o);
    let s = summary(&o);
    assert!(
        s["chunks_zero"].as_u64().unwrap() > 50,
        "most of a fresh 1 GiB volume is zeros: {s}"
    );
    let used = fs::metadata(&copy).unwrap().blocks() * 512;
    assert!(used < 800 << 20, "the copy is sparse: {used} bytes used");
    let a = Mounted::new(lo.path(), "ro,noatime");
    let b = Mounted::new(&copy, "loop,ro,noatime");
    assert_same_tree(a.path(), b.path());
    let n = fs::read_dir(b.path().join("d007")).unwrap().count();
    assert_eq!(n, 200);
    drop(b);
    // Imaging a read-only mount is allowed.
    let o = image(lo.path(), &copy, &["--json"]);
    ok(&o);
    assert_eq!(summary(&o)["chunks_written"], 0);
    // A mounted DST is never written.
    let m = Mounted::new(&copy, "loop,rw");
    let lo2 = Command::new("findmnt")
        .args(["-n", "-o", "SOURCE"])
        .arg(m.path())
        .output()
        .unwrap();
    let dev = String::from_utf8_lossy(&lo2.stdout).trim().to_string();
    if dev.starts_with("/dev/loop") {
        let o = image(&vol, Path::new(&dev), &[]);
        assert_eq!(code(&o), 2, "{}", stderr(&o));
        assert!(stderr(&o).contains("mounted or in use"), "{}", stderr(&o));
    }
}

/// On btrfs every write goes to new extents, so an incremental reads only
/// the chunks whose extents changed since they were last read.
#[test]
fn on_btrfs_an_incremental_reads_only_changed_chunks() {
    let Some(fs) = LoopFs::new("btrfs", 512) else {
        return;
    };
    let d = disk_dir("img");
    let src = fs.path().join("src.img");
    let dst = d.path().join("dst.img");
    fs::write(&src, bytes(64 * MIB, 21)).unwrap();
    let o = image(&src, &dst, &["--json"]);
    ok(&o);
    poke(&src, (9 * MIB) as u64, b"changed in chunk 2");
    poke(&src, (60 * MIB) as u64, &bytes(8192, 22));
    let o = image(&src, &dst, &["--json"]);
    ok(&o);
    let s = summary(&o);
    assert_eq!(s["mode"], "incremental", "{s}");
    assert_eq!(s["chunks_written"], 2, "{s}");
    assert_eq!(s["chunks_unread"], 14, "{s}");
    assert_eq!(s["bytes_read"], 2 * 4 * MIB as u64, "{s}");
    same_bytes(&src, &dst, 64 * MIB as u64);
    // A snapshot shares every extent and changes no data: still unread.
    let snap = fs.path().join("snap");
    if run(
        "btrfs",
        &[
            "subvolume",
            "snapshot",
            fs.path().to_str().unwrap(),
            snap.to_str().unwrap(),
        ],
    ) {
        poke(&src, 0, b"first chunk");
        let o = image(&src, &dst, &["--json"]);
        ok(&o);
        let s = summary(&o);
        assert_eq!(s["chunks_written"], 1, "{s}");
        assert_eq!(s["chunks_unread"], 15, "{s}");
        same_bytes(&src, &dst, 64 * MIB as u64);
    }
}

/// Every chunk is counted once: written + zero + unchanged = chunks, on a
/// first copy and on an incremental; a dry run says "would write".
#[test]
fn image_chunk_counts_add_up() {
    let d = disk_dir("imgcount");
    let src = d.path().join("src.img");
    let mut data = vec![0u8; 16 << 20];
    data[..(5 << 20)].copy_from_slice(&bytes(5 << 20, 3));
    fs::write(&src, &data).unwrap();
    let dst = d.path().join("dst.img");
    let add_up = |s: &serde_json::Value| {
        let n = |k: &str| s[k].as_u64().unwrap();
        assert_eq!(
            n("chunks_written") + n("chunks_zero") + n("chunks_unchanged"),
            n("chunks"),
            "{s}"
        );
    };
    let o = image(&src, &dst, &["--json", "--chunk-size", "1M"]);
    ok(&o);
    add_up(&summary(&o));
    data[(2 << 20) + 5] ^= 1;
    fs::write(&src, &data).unwrap();
    let o = image(&src, &dst, &["--json", "--chunk-size", "1M", "--dry-run"]);
    ok(&o);
    add_up(&summary(&o));
    assert_eq!(summary(&o)["dry_run"], true);
    let o = image(&src, &dst, &["--chunk-size", "1M", "--dry-run"]);
    assert!(stdout(&o).contains("1 would write"), "{}", stdout(&o));
    let o = image(&src, &dst, &["--json", "--chunk-size", "1M"]);
    ok(&o);
    let s = summary(&o);
    add_up(&s);
    assert_eq!(s["chunks_written"], 1, "{s}");
}
