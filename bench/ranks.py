#!/usr/bin/env python3
"""MPI ranks and --shard against one process, on one machine (by hand, as root).

    cargo build --release --features mpi
    bench/ranks.py                         # overhead, then latency hiding
    bench/ranks.py --shapes dense --repeat 3

1. Overhead: the same total streams (8) as one process (-j 8), as two MPI
   ranks (mpirun -np 2, -j 4 each), and as two --shard parts started side
   by side (-j 4 each), each onto a fresh ext4 on a loop device with the
   page cache dropped, rounds interleaved. The target is under 10% over one
   process. One machine cannot show a speed-up from more machines; this
   only shows what splitting costs.
2. Latency hiding: the source on latencyfs (1 ms added to every request,
   a stand-in for a parallel file system's metadata latency), ranks 1, 2,
   4 and 8 with the same streams per rank (-j 2): where latency bounds the
   job, each rank adds requests in flight, as each node would.

Writes bench/results/ranks-<date>.md and .json.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

SLUICE = bench.SLUICE
MNT = bench.MNT
LATENCYFS = os.path.join(bench.ROOT, "target", "release", "latencyfs")
SHARE = "/mnt/sluice-bench-latency"
MPIRUN = "mpirun --allow-run-as-root --oversubscribe --bind-to none"


def variants(src, dst):
    one = f"{SLUICE} copy --no-progress -q"
    return [
        ("1 process -j 8", f"{one} -j 8 {src} {dst}"),
        # The launcher alone: mpirun starting one process, which is no MPI job.
        ("mpirun -np 1 -j 8", f"{MPIRUN} -np 1 {one} -j 8 {src} {dst}"),
        ("mpirun -np 2, -j 4 each", f"{MPIRUN} -np 2 {one} -j 4 {src} {dst}"),
        ("--shard 0/2 + 1/2, -j 4 each",
         f"{one} -j 4 --shard 0/2 {src} {dst} & {one} -j 4 --shard 1/2 {src} {dst}; wait"),
    ]


def overhead(scratch, data, shapes, repeat):
    rows = {}
    for shape, extra in shapes:
        tag = extra.split()[-1] if extra else "full"
        src = bench.dataset(os.path.join(data, f"ranks-{shape}-{tag}"), shape, extra)
        files, size = bench.tree_size(src)
        runs = {}
        for _ in range(repeat):
            for name, cmd in variants(src, f"{MNT}/dst"):
                scratch.fresh()
                rc, secs, rss = bench.timed(cmd)
                got = bench.tree_size(f"{MNT}/dst")
                ok = rc == 0 and got == (files, size)
                print(shape, name, secs, "ok" if ok else f"FAILED rc={rc} {got}", flush=True)
                runs.setdefault(name, []).append(secs if ok else None)
        rows[shape] = {"files": files, "bytes": size, "runs": runs}
    return rows


def latency(scratch, data, files, per_dir, ranks, repeat):
    if not os.path.exists(LATENCYFS):
        bench.sh("cargo build --release -p sluice-latencyfs")
    name = f"ranks-latency-{files}" + (f"-{per_dir}" if per_dir != 1000 else "")
    src = bench.dataset(os.path.join(data, name), "dense", f"--files {files} --per-dir {per_dir}")
    scratch.fresh()
    os.makedirs(SHARE, exist_ok=True)
    # The latency is on the source side: latencyfs over a copy of the set
    # on the fresh ext4, the copies going to the same ext4.
    back = f"{MNT}/back"
    bench.sh(f"cp -a {src} {back}")
    proc = subprocess.Popen([LATENCYFS, back, SHARE, "--latency-ms", "1", "--threads", "64"],
                            stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    runs = {}
    try:
        n = 0
        for _ in range(repeat):
            for r in ranks:
                n += 1
                dst = f"{MNT}/out{n}"
                cmd = f"{MPIRUN} -np {r} {SLUICE} copy --no-progress -q -j 2 {SHARE} {dst}"
                bench.drop_caches()
                rc, secs, _ = bench.timed(cmd)
                ok = rc == 0 and bench.tree_size(dst)[0] == files
                print("latency", r, "ranks", secs, "ok" if ok else "FAILED", flush=True)
                runs.setdefault(str(r), []).append(secs if ok else None)
    finally:
        bench.sh(f"umount {SHARE}", check=False)
        proc.wait(timeout=30)
    return {"files": files, "per_dir": per_dir, "runs": runs}


def skew(scratch, data, entries, size, ranks):
    """One directory of `entries` small files beside one file of `size`
    bytes: each rank's share of the files and of the big file's bytes."""
    src = os.path.join(data, f"ranks-skew-{entries}-{size}")
    if not os.path.exists(src):
        part = src + ".part"
        os.makedirs(os.path.join(part, "many"), exist_ok=True)
        for i in range(entries):
            with open(os.path.join(part, "many", f"e{i:07d}"), "wb") as f:
                f.write(b"y" * 512)
        bench.sh(f"head -c {size} /dev/urandom > {part}/huge.bin && mv {part} {src}")
    rows = {}
    for r in ranks:
        scratch.fresh()
        bench.drop_caches()
        cmd = f"{MPIRUN} -np {r} {SLUICE} copy --no-progress --json -j 2 {src} {MNT}/dst"
        start = time.monotonic()
        out = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        secs = round(time.monotonic() - start, 2)
        s = json.loads(out.stdout.strip().splitlines()[-1])
        per = s.get("ranks") or [{"rank": 0, "files_copied": s["files_copied"],
                                  "bytes_copied": s["bytes_copied"], "stream_seconds": None}]
        print("skew", r, "ranks", secs, out.returncode, flush=True)
        rows[str(r)] = {"seconds": secs, "exit": out.returncode, "ranks": per}
    return {"entries": entries, "bytes": size, "runs": rows}


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else round((xs[m - 1] + xs[m]) / 2, 2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="dense,mixed,huge")
    p.add_argument("--data", default="/work/bench-data")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--latency-files", type=int, default=4000)
    p.add_argument("--latency-per-dir", type=int, default=1000,
                   help="files per directory of the latency set (a directory is listed by one rank)")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skew", action="store_true",
                   help="also: one directory of 100k files beside a 2 GiB file, each rank's share")
    p.add_argument("--full", action="store_true", help="the full-size sets of bench.py (dense 200k, mixed 30k)")
    a = p.parse_args()
    bench.need_root("ranks.py")
    sizes = {"dense": "--files 50000", "mixed": "--files 8000", "huge": f"--size {2 << 30}"}
    if a.full:
        sizes = {"dense": "", "mixed": "", "huge": f"--size {8 << 30}"}
    shapes = [(s, sizes[s]) for s in a.shapes.split(",") if s]
    os.makedirs(a.data, exist_ok=True)
    scratch = bench.Scratch(os.path.join(a.data, "scratch-dst.img"), 40)
    try:
        res = {"overhead": overhead(scratch, a.data, shapes, a.repeat)}
        if a.skew:
            res["skew"] = skew(scratch, a.data, 100_000, 2 << 30, [1, 2, 4])
        if not a.skip_latency:
            res["latency"] = latency(scratch, a.data, a.latency_files, a.latency_per_dir,
                                     [1, 2, 4, 8], a.repeat)
    finally:
        scratch.close()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    L = [f"# MPI ranks and --shard against one process ({stamp})", "",
         f"Machine: {os.cpu_count()} cores, {platform_line()}. Each run onto a fresh ext4 on a loop",
         "device, page cache dropped, median of the interleaved rounds.", ""]
    for shape, row in res["overhead"].items():
        runs = {k: median(v) for k, v in row["runs"].items()}
        base = runs.get("1 process -j 8")
        L += [f"## {shape}: {row['files']} files, {row['bytes'] / 2**20:.0f} MiB", "",
              "| run | seconds | vs one process |", "|---|---:|---:|"]
        for k, v in runs.items():
            ratio = f"{v / base:.2f}" if v and base else "-"
            L.append(f"| {k} | {v if v is not None else 'failed'} | {ratio} |")
        L.append("")
    if "latency" in res:
        lt = res["latency"]
        runs = {k: median(v) for k, v in lt["runs"].items()}
        base = runs.get("1")
        L += [f"## source on latencyfs (1 ms per request): {lt['files']} files of 1 KiB, "
              f"{lt['per_dir']} a directory, -j 2 per rank", "",
              "| ranks | seconds | speed-up over 1 rank |", "|---:|---:|---:|"]
        for k, v in runs.items():
            L.append(f"| {k} | {v} | {base / v:.2f} |" if v and base else f"| {k} | failed | - |")
        L.append("")
    if "skew" in res:
        sk = res["skew"]
        L += [f"## skew: one directory of {sk['entries']} files of 512 B beside one file of "
              f"{sk['bytes'] >> 20} MiB, -j 2 per rank", "",
              "| ranks | seconds | per rank: files, MiB |", "|---:|---:|---|"]
        for k, row in sk["runs"].items():
            per = "; ".join(f"{r['files_copied']}, {r['bytes_copied'] >> 20}" for r in row["ranks"])
            L.append(f"| {k} | {row['seconds']} | {per} |")
        L.append("")
    bench.save(res, stamp, name="ranks-", render_fn=lambda _: "\n".join(L))
    print("\n".join(L))


def platform_line():
    import platform
    return f"kernel {platform.release()}"


if __name__ == "__main__":
    main()
