#!/usr/bin/env python3
"""`sluice image` against dd and file-level copies, in one run.

Run by hand as root (it attaches loop devices and drops the page cache):

    bench/image.py               # 8 GiB file, 1% incremental, dense volume
    bench/image.py --quick       # 1 GiB file, 20,000-file volume

Three measurements, each setting timed `--rounds` times taking turns, cold
cache, with a final `sync` in the time:

1. An 8 GiB image file (bench/gen.py huge) to a new file on the same disk:
   sluice image (O_DIRECT and --no-direct, -j 2/4/8), dd with O_DIRECT, and
   8 dd processes at offsets (the usual `xargs -P` trick). The disk's
   sequential limit for such a copy is measured with dd/fio alone first.
2. An incremental: after a full image, 1% of the 4 MiB chunks of SRC are
   overwritten at random places, and `sluice image` runs again.
   The same again with SRC copied into a btrfs (loop device on the same
   disk), where the extent map shows which chunks changed.
3. The dense set (200,000 files of 1 KiB) as an ext4 volume of 2 GiB:
   `sluice image` of its loop device, and dd of it, against file-level
   copies of the same files (sluice copy, cp -a, tar | tar, xcp) from the
   volume mounted read-only to a fresh ext4 on a loop device.
"""
import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys

from bench import (HERE, ROOT, SLUICE, XCP, MNT, Scratch, drop_caches, need_root, save, sh,
                   timed)

DATA = "/work/bench-data"
OUT = "/work/bench-scratch"
CHUNK = 4 << 20


def rm(*paths):
    for p in paths:
        if os.path.exists(p):
            os.unlink(p)


def run(cmd, before=None):
    """Times `cmd` from a cold cache; returns (seconds, max RSS KiB, exit)."""
    if before:
        sh(before)
    drop_caches()
    code, secs, rss = timed(cmd)
    return secs, rss, code


def huge_file(quick):
    path = os.path.join(DATA, "image-src.img")
    size = (1 << 30) if quick else (8 << 30)
    if not os.path.exists(path) or os.path.getsize(path) != size:
        # Distinct data in every 1 MiB so chunks differ from each other.
        sh(f"head -c {size} /dev/urandom > {path}.part && mv {path}.part {path}")
    return path, size


def dense_volume(quick):
    """An ext4 volume image holding the dense set, built once."""
    files = 20_000 if quick else 200_000
    path = os.path.join(DATA, f"dense-vol-{files}.img")
    if os.path.exists(path):
        return path, files
    sh(f"truncate -s 2G {path}.part")
    sh(f"mkfs.ext4 -q -F -N {files + 50_000} {path}.part")
    os.makedirs("/mnt/sluice-bench-vol", exist_ok=True)
    sh(f"mount -o loop {path}.part /mnt/sluice-bench-vol")
    try:
        sh(f"python3 {HERE}/gen.py dense /mnt/sluice-bench-vol/dense --files {files}")
    finally:
        sh("umount /mnt/sluice-bench-vol")
    os.rename(f"{path}.part", path)
    return path, files


def limits(src, size):
    """The disk's own sequential rates for this data, with dd and O_DIRECT."""
    dst = os.path.join(OUT, "limit.img")
    res = {}
    secs, _, _ = run(f"dd if={src} of=/dev/null bs=4M iflag=direct status=none")
    res["read_MBps"] = size / secs / 1e6
    secs, _, _ = run(f"dd if=/dev/zero of={dst} bs=4M count={size >> 22} oflag=direct status=none", f"rm -f {dst}")
    res["write_MBps"] = size / secs / 1e6
    # A copy on one disk reads and writes at once: 8 streams of dd at
    # offsets is the fastest copy the disk allows without any cleverness.
    secs, _, _ = run(dd_parallel(src, dst, size, 8), f"rm -f {dst}")
    res["copy_MBps"] = size / secs / 1e6
    rm(dst)
    return res


def dd_parallel(src, dst, size, n):
    mib = size >> 20
    piece = (mib + n - 1) // n
    return (f"truncate -s {size} {dst} && seq 0 {n - 1} | xargs -P {n} -I{{}} sh -c "
            f"'dd if={src} of={dst} bs=1M skip=$(({{}}*{piece})) seek=$(({{}}*{piece})) count={piece} "
            f"iflag=direct oflag=direct conv=notrunc status=none'")


def full_copies(src, size, rounds):
    dst = os.path.join(OUT, "dst.img")
    settings = [
        ("sluice image (-j 4)", f"{SLUICE} image {src} {dst} --no-progress >/dev/null"),
        ("sluice image -j 8", f"{SLUICE} image {src} {dst} --no-progress -j 8 >/dev/null"),
        ("sluice image -j 2", f"{SLUICE} image {src} {dst} --no-progress -j 2 >/dev/null"),
        ("sluice image --no-direct", f"{SLUICE} image {src} {dst} --no-progress --no-direct >/dev/null"),
        ("dd bs=4M O_DIRECT", f"dd if={src} of={dst} bs=4M iflag=direct oflag=direct status=none"),
        ("dd at offsets -P 8 O_DIRECT", dd_parallel(src, dst, size, 8)),
        ("cp --sparse=always", f"cp --sparse=always {src} {dst}"),
    ]
    runs = {name: [] for name, _ in settings}
    for _ in range(rounds):
        for name, cmd in settings:
            secs, rss, code = run(cmd, f"rm -f {dst} {dst}.sluice-map")
            # Byte-compared for sluice; the peers are trusted on exit 0.
            ok = code == 0 and (not name.startswith("sluice")
                                or sh(f"cmp -s {src} {dst}", check=False).returncode == 0)
            runs[name].append({"seconds": secs, "rss_kib": rss, "ok": ok})
    rm(dst, dst + ".sluice-map")
    return runs


def incrementals(src, size, rounds, modes=("", " --no-direct")):
    """Full image, then 1% of chunks changed, then the incremental."""
    dst = os.path.join(OUT, "dst.img")
    chunks = size // CHUNK
    changed = max(1, chunks // 100)
    rng = random.Random(5)
    res = {"chunks": chunks, "changed": changed, "runs": []}
    for r in range(rounds):
        for direct in modes:
            full, _, code = run(f"{SLUICE} image {src} {dst} --no-progress -j 4{direct} >/dev/null",
                                f"rm -f {dst} {dst}.sluice-map")
            assert code == 0
            with open(src, "r+b") as f:
                for i in rng.sample(range(chunks), changed):
                    f.seek(i * CHUNK + rng.randrange(CHUNK - 4096))
                    f.write(os.urandom(4096))
            cmd = f"{SLUICE} image {src} {dst} --no-progress --json -j 4{direct} > /tmp/bench-image.json"
            secs, rss, code = run(cmd)
            s = json.loads(open("/tmp/bench-image.json").read().strip().splitlines()[-1])
            ok = code == 0 and sh(f"cmp -s {src} {dst}", check=False).returncode == 0
            res["runs"].append({"no_direct": bool(direct), "full_s": full, "incremental_s": secs,
                                "chunks_written": s["chunks_written"], "bytes_written": s["bytes_copied"],
                                "bytes_read": s["bytes_read"],
                                "ok": ok, "rss_kib": rss})
    rm(dst, dst + ".sluice-map")
    return res


def btrfs_incrementals(src, size, rounds):
    """The same on a SRC file in btrfs: extents show what changed."""
    img = os.path.join(OUT, "btrfs.img")
    mnt = "/mnt/sluice-bench-btrfs"
    sh(f"truncate -s {size * 2 // 2**30 + 2}G {img} && mkfs.btrfs -q -f {img}")
    os.makedirs(mnt, exist_ok=True)
    sh(f"mount -o loop {img} {mnt}")
    try:
        bsrc = f"{mnt}/src.img"
        sh(f"cp --reflink=never {src} {bsrc} && sync")
        return incrementals(bsrc, size, rounds, modes=("",))
    finally:
        sh(f"umount {mnt}", check=False)
        rm(img)


def dense(vol, files, rounds):
    size = os.path.getsize(vol)
    dev = sh(f"losetup -r -f --show {vol}", capture_output=True).stdout.strip()
    scratch = Scratch(os.path.join(OUT, "scratch.img"), 8)
    srcdir = "/mnt/sluice-bench-vol"
    os.makedirs(srcdir, exist_ok=True)
    sh(f"mount -o ro,noatime {dev} {srcdir}")
    dst = os.path.join(OUT, "vol-copy.img")
    image_settings = [
        ("sluice image (volume)", f"{SLUICE} image {dev} {dst} --no-progress >/dev/null"),
        ("sluice image --no-direct (volume)", f"{SLUICE} image {dev} {dst} --no-progress --no-direct >/dev/null"),
        ("dd bs=4M O_DIRECT (volume)", f"dd if={dev} of={dst} bs=4M iflag=direct oflag=direct status=none"),
        # The volume's own image file as SRC: its holes are found with
        # SEEK_DATA, and reads skip the loop driver, whose timing varies
        # 2x from run to run here (dd through it: 2.2-4.0 s).
        ("sluice image (volume's image file)", f"{SLUICE} image {vol} {dst} --no-progress >/dev/null"),
        ("dd bs=4M O_DIRECT (volume's image file)",
         f"dd if={vol} of={dst} bs=4M iflag=direct oflag=direct status=none"),
    ]
    file_settings = [
        ("sluice copy (files)", f"{SLUICE} copy {srcdir}/dense {MNT}/dense --no-progress >/dev/null"),
        ("cp -a (files)", f"cp -a {srcdir}/dense {MNT}/dense"),
        ("tar to tar (files)", f"mkdir -p {MNT}/dense && tar -C {srcdir}/dense -cf - . | tar -C {MNT}/dense -xf -"),
    ]
    if os.path.exists(XCP):
        file_settings.append(("xcp -w 8 (files)", f"{XCP} -r -w 8 {srcdir}/dense {MNT}/dense"))
    runs = {name: [] for name, _ in image_settings + file_settings}
    try:
        for _ in range(rounds):
            for name, cmd in image_settings:
                # The volume is mounted read-only: allowed without --allow-mounted.
                secs, rss, code = run(cmd, f"rm -f {dst} {dst}.sluice-map")
                ok = code == 0 and sh(f"cmp -s {vol} {dst}", check=False).returncode == 0
                runs[name].append({"seconds": secs, "rss_kib": rss, "ok": ok})
            for name, cmd in file_settings:
                scratch.fresh()
                secs, rss, code = run(cmd)
                n = int(sh(f"find {MNT}/dense -type f | wc -l", capture_output=True).stdout)
                runs[name].append({"seconds": secs, "rss_kib": rss, "ok": code == 0 and n == files})
    finally:
        sh(f"umount {srcdir}", check=False)
        sh(f"losetup -d {dev}", check=False)
        scratch.close()
        rm(dst, dst + ".sluice-map")
    return {"files": files, "volume_bytes": size, "runs": runs}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--skip", default="", help="comma list of: full,incremental,btrfs,dense")
    a = p.parse_args()
    need_root("image.py")
    os.makedirs(DATA, exist_ok=True)
    os.makedirs(OUT, exist_ok=True)
    sh(f"cd {ROOT} && cargo build --release -q")
    skip = set(a.skip.split(","))
    src, size = huge_file(a.quick)
    results = {"machine": {
        "date": datetime.datetime.now().isoformat(timespec="minutes"),
        "cpus": os.cpu_count(), "kernel": platform.release(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
        "disk": sh("lsblk -dno NAME,SIZE,ROTA,MODEL | grep -v zram | head -1", capture_output=True).stdout.strip(),
    }, "size": size, "rounds": a.rounds}
    results["limits"] = limits(src, size)
    if "full" not in skip:
        results["full"] = full_copies(src, size, a.rounds)
    if "incremental" not in skip:
        results["incremental"] = incrementals(src, size, a.rounds)
    if "btrfs" not in skip:
        results["btrfs_incremental"] = btrfs_incrementals(src, size, a.rounds)
    if "dense" not in skip:
        vol, files = dense_volume(a.quick)
        results["dense"] = dense(vol, files, a.rounds)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    save(results, stamp, "image-", render)
    print(render(results))


def best(rs):
    return min(r["seconds"] for r in rs)


def all_runs(rs):
    return ", ".join(f"{r['seconds']:.1f}" for r in rs)


def timed_rows(runs, middle):
    """Table rows, fastest first: name, best, all runs, middle(best), max RSS."""
    rows = []
    for name, rs in sorted(runs.items(), key=lambda kv: best(kv[1])):
        b = best(rs)
        flag = "" if all(r["ok"] for r in rs) else " (FAILED)"
        rows.append(f"| {name}{flag} | {b:.2f} | {all_runs(rs)} | {middle(b)} | "
                    f"{max(r['rss_kib'] for r in rs) / 1024:.0f} |")
    return rows


def render(res):
    m = res["machine"]
    size = res["size"]
    L = [f"# sluice image benchmark, {m['date']}", "",
         f"Machine: {m['cpus']} cores, {m['mem_gib']} GiB RAM, kernel {m['kernel']}, disk `{m['disk']}`. "
         f"Source and destination on the same disk. Every run: page cache dropped first, time includes a "
         f"final `sync`; {res['rounds']} rounds taking turns; the table shows the faster run and all runs.", ""]
    lim = res["limits"]
    L += [f"Disk limits for {size / 2**30:.0f} GiB (dd, O_DIRECT, 4 MiB): read {lim['read_MBps']:.0f} MB/s, "
          f"write {lim['write_MBps']:.0f} MB/s, copy (8 dd at offsets) {lim['copy_MBps']:.0f} MB/s.", ""]
    if "full" in res:
        runs = res["full"]
        L += [f"## Full image of a {size / 2**30:.0f} GiB file", "",
              "| tool | best s | all runs s | MB/s | share of the copy limit | max RSS MiB |",
              "|---|---:|---|---:|---:|---:|"]
        L += timed_rows(runs, lambda b: f"{size / b / 1e6:.0f} | {size / b / 1e6 / lim['copy_MBps']:.2f}")
        L.append("")
    for key, where in (("incremental", "SRC on the root ext4"), ("btrfs_incremental", "SRC on btrfs")):
        if key not in res:
            continue
        inc = res[key]
        L += [f"## Incremental, {where}: {inc['changed']} of {inc['chunks']} chunks (1%) changed", "",
              "| mode | full s | incremental s | incremental / full | chunks written | MiB written | MiB read |",
              "|---|---:|---:|---:|---:|---:|---:|"]
        for r in inc["runs"]:
            flag = "" if r["ok"] else " (FAILED)"
            no_direct = r.get("no_direct", r.get("direct"))
            L.append(f"| {'--no-direct' if no_direct else 'O_DIRECT (default)'}{flag} | {r['full_s']:.2f} | "
                     f"{r['incremental_s']:.2f} | {r['incremental_s'] / r['full_s']:.3f} | "
                     f"{r['chunks_written']} | {r['bytes_written'] / 2**20:.1f} | "
                     f"{r.get('bytes_read', 0) / 2**20:.0f} |")
        L.append("")
    if "dense" in res:
        d = res["dense"]
        runs = d["runs"]
        files_best = min(best(rs) for n, rs in runs.items() if "(files)" in n)
        L += [f"## The dense set as an ext4 volume: {d['files']} files in {d['volume_bytes'] / 2**30:.0f} GiB", "",
              "| tool | best s | all runs s | speed vs best file-level copy | max RSS MiB |",
              "|---|---:|---|---:|---:|"]
        L += timed_rows(runs, lambda b: f"{files_best / b:.1f}x")
        L.append("")
    return "\n".join(L)


if __name__ == "__main__":
    sys.path.insert(0, HERE)
    main()
