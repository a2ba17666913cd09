#!/usr/bin/env python3
"""Benchmarks of repeated and interrupted jobs (issue 4), same run, same data.

Run by hand as root, after bench.py has generated the datasets:

    bench/resync.py                         # every scenario
    bench/resync.py --scenarios unchanged   # some of them

Scenarios (each on a fresh ext4 destination on a loop device, as bench.py):

  unchanged  the dense set already copied; a second run of each tool, cold
             (page cache dropped) and warm (right after another run), next
             to two concurrent `du -s` of both trees (the cost of stat alone)
  mixed1pct  the mixed set copied, then 1% of the destination's files
             rewritten with a new mtime; each tool brings it back
  resume     the huge file: a full copy, then a copy killed (SIGKILL) at half
             the full copy's time and the same command run again
  verify     sluice verify of the huge file (against fio's sequential read)
             and of the dense set (against rsync -rcn, which also reads both)

Writes bench/results/resync-<stamp>.{md,json}.
"""
import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

SLUICE = bench.SLUICE
MNT = bench.MNT
DST = f"{MNT}/out"


def setup_copy(scratch, src):
    """A fresh destination holding a copy of src (untimed)."""
    scratch.fresh()
    bench.sh(f"{SLUICE} copy {src} {DST} --no-progress >/dev/null")
    bench.sh("sync")


def timed(cmd, cold):
    if cold:
        bench.drop_caches()
    rc, secs, rss = bench.timed(cmd)
    return {"seconds": secs, "rss_MiB": rss / 1024, "exit": rc}


def median(rs):
    rs = sorted(rs, key=lambda r: r["seconds"])
    m = dict(rs[len(rs) // 2])
    m["all_seconds"] = [r["seconds"] for r in rs]
    m["ok"] = all(r["exit"] == 0 for r in rs)
    return m


def unchanged(scratch, data, repeat):
    src = os.path.join(data, "dense")
    tools = [
        ("sluice sync", f"{SLUICE} sync {src} {DST} --no-progress >/dev/null"),
        ("rsync -a", f"rsync -a {src}/ {DST}/"),
        ("rclone sync --checkers 8", f"rclone sync --checkers 8 {src} {DST}"),
        ("2 x du -s, concurrent", f"du -s {src} >/dev/null & du -s {DST} >/dev/null & wait"),
    ]
    setup_copy(scratch, src)
    out = {}
    for mode in ("cold", "warm"):
        runs = {n: [] for n, _ in tools}
        for _ in range(repeat):
            for name, cmd in tools:
                if mode == "warm":
                    bench.timed(cmd)  # warms both trees' inodes and dentries
                runs[name].append(timed(cmd, mode == "cold"))
                print("unchanged", mode, name, runs[name][-1]["seconds"], flush=True)
        out[mode] = {n: median(r) for n, r in runs.items()}
    # Nothing may have been written: the tree is still identical.
    rc = subprocess.run(f"{SLUICE} verify {src} {DST} --no-progress >/dev/null", shell=True).returncode
    out["identical_after"] = rc == 0
    return out


def modify_one_percent(root):
    """Rewrites the first 4 KiB of every 100th regular file (sorted order)
    and gives it the current mtime. Returns (files, bytes of those files)."""
    files = []
    for d, dirs, names in os.walk(root):
        dirs.sort()
        for n in sorted(names):
            files.append(os.path.join(d, n))
    chosen = files[::100]
    total = 0
    for p in chosen:
        with open(p, "r+b") as f:
            f.write(os.urandom(min(4096, os.path.getsize(p))))
        total += os.path.getsize(p)
    return len(chosen), total


def mixed1pct(scratch, data, repeat):
    src = os.path.join(data, "mixed")
    tools = [
        ("sluice sync", f"{SLUICE} sync {src} {DST} --no-progress >/dev/null"),
        ("rsync -a", f"rsync -a {src}/ {DST}/"),
        ("rclone sync --transfers 8", f"rclone sync --transfers 8 --checkers 8 {src} {DST}"),
    ]
    runs = {n: [] for n, _ in tools}
    changed = None
    for _ in range(repeat):
        for name, cmd in tools:
            setup_copy(scratch, src)
            changed = modify_one_percent(DST)
            runs[name].append(timed(cmd, True))
            print("mixed1pct", name, runs[name][-1]["seconds"], flush=True)
    return {"changed_files": changed[0], "changed_bytes": changed[1],
            "tools": {n: median(r) for n, r in runs.items()}}


def resume(scratch, data, repeat):
    src = os.path.join(data, "huge")
    cmd = [SLUICE, "copy", src, DST, "--no-progress", "--json"]
    rows = []
    for _ in range(repeat):
        scratch.fresh()
        t0 = time.time()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        bench.sh("sync")
        full = time.time() - t0
        scratch.fresh()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        time.sleep(full / 2)
        p.send_signal(signal.SIGKILL)
        p.wait()
        bench.sh("sync")
        bench.drop_caches()
        t0 = time.time()
        r = subprocess.run(cmd, check=True, capture_output=True, text=True)
        bench.sh("sync")
        again = time.time() - t0
        recopied = json.loads(r.stdout.strip().splitlines()[-1])["bytes_copied"]
        rows.append({"full_s": full, "resumed_s": again, "ratio": again / full,
                     "bytes_recopied": recopied})
        print("resume", rows[-1], flush=True)
    rows.sort(key=lambda r: r["ratio"])
    return {"runs": rows, "median": rows[len(rows) // 2]}


def verify(scratch, data, repeat):
    out = {}
    huge = os.path.join(data, "huge")
    size = sum(os.path.getsize(os.path.join(huge, n)) for n in os.listdir(huge))
    setup_copy(scratch, huge)
    rs = [timed(f"{SLUICE} verify {huge} {DST} --no-progress >/dev/null", True) for _ in range(repeat)]
    m = median(rs)
    m["MB_per_s_per_side"] = size / 1e6 / m["seconds"]
    out["huge"] = m
    dense = os.path.join(data, "dense")
    files, _ = bench.tree_size(dense)
    setup_copy(scratch, dense)
    tools = [
        ("sluice verify", f"{SLUICE} verify {dense} {DST} --no-progress >/dev/null"),
        ("rsync -rcn", f"rsync -rcn {dense}/ {DST}/ >/dev/null"),
    ]
    runs = {n: [] for n, _ in tools}
    for _ in range(repeat):
        for name, cmd in tools:
            runs[name].append(timed(cmd, True))
            print("verify dense", name, runs[name][-1]["seconds"], flush=True)
    out["dense"] = {n: dict(median(r), files_per_s=files / median(r)["seconds"]) for n, r in runs.items()}
    return out


def render(res):
    m = res["machine"]
    L = [f"# sluice re-runs and resume, {m['date']}", "",
         f"Machine: {m['cpus']} cores ({m['cpu']}), {m['mem_gib']} GiB RAM, kernel {m['kernel']}. "
         "Destination: a fresh ext4 on a loop device per setup. Times include a final `sync`; "
         "medians of the runs listed.", ""]
    if "disk" in res:
        L += [f"Disk sequential read (fio, O_DIRECT, 1 MiB, iodepth 16): {res['disk']:.0f} MB/s.", ""]
    s = res.get("scenarios", {})
    if "unchanged" in s:
        u = s["unchanged"]
        L += ["## Unchanged re-sync of the dense set (200,000 files)", "",
              "| tool | cold s | cold runs | warm s | warm runs |", "|---|---:|---|---:|---|"]
        for name in u["cold"]:
            c, w = u["cold"][name], u["warm"][name]
            fl = "" if c["ok"] and w["ok"] else " (FAILED)"
            L.append(f"| {name}{fl} | {c['seconds']:.2f} | {', '.join(f'{x:.2f}' for x in c['all_seconds'])} | "
                     f"{w['seconds']:.2f} | {', '.join(f'{x:.2f}' for x in w['all_seconds'])} |")
        L += ["", f"Tree identical after all runs (sluice verify): {u['identical_after']}.", ""]
    if "mixed1pct" in s:
        x = s["mixed1pct"]
        L += [f"## Mixed set, {x['changed_files']} files ({x['changed_bytes'] / 2**20:.0f} MiB) rewritten in DST", "",
              "| tool | s | runs |", "|---|---:|---|"]
        for name, r in x["tools"].items():
            fl = "" if r["ok"] else " (FAILED)"
            L.append(f"| {name}{fl} | {r['seconds']:.2f} | {', '.join(f'{v:.2f}' for v in r['all_seconds'])} |")
        L.append("")
    if "resume" in s:
        L += ["## Huge file (8 GiB) killed at half the full copy's time, then resumed", "",
              "| full copy s | resumed run s | resumed / full | bytes re-copied |", "|---:|---:|---:|---:|"]
        for r in s["resume"]["runs"]:
            L.append(f"| {r['full_s']:.2f} | {r['resumed_s']:.2f} | {r['ratio']:.2f} | {r['bytes_recopied'] / 2**30:.2f} GiB |")
        L.append("")
    if "verify" in s:
        v = s["verify"]
        L += ["## Verify", "",
              f"Huge file: {v['huge']['seconds']:.2f} s ({', '.join(f'{x:.2f}' for x in v['huge']['all_seconds'])}), "
              f"{v['huge']['MB_per_s_per_side']:.0f} MB/s per side (both sides read from the same disk).", "",
              "| dense set | s | runs | files/s |", "|---|---:|---|---:|"]
        for name, r in v["dense"].items():
            L.append(f"| {name} | {r['seconds']:.2f} | {', '.join(f'{x:.2f}' for x in r['all_seconds'])} | {r['files_per_s']:.0f} |")
        L.append("")
    return "\n".join(L)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--scenarios", default="unchanged,mixed1pct,resume,verify")
    p.add_argument("--data", default="/work/bench-data")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    bench.need_root("resync.py")
    bench.install_peers()
    for shape in ("dense", "mixed", "huge"):
        bench.dataset(os.path.join(a.data, shape), shape)
    scratch = bench.Scratch(os.path.join(a.data, "scratch-dst.img"), 40)
    res = {"machine": {
        "date": datetime.date.today().isoformat(), "kernel": os.uname().release, "cpus": os.cpu_count(),
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)}, "scenarios": {}}
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    fns = {"unchanged": unchanged, "mixed1pct": mixed1pct, "resume": resume, "verify": verify}
    try:
        if "verify" in a.scenarios:
            rd = os.path.join(a.data, "fio-read.dat")
            j = json.loads(bench.sh(
                f"fio --output-format=json --name=r --filename={rd} --rw=read --bs=1M --direct=1 --iodepth=16 "
                f"--ioengine=libaio --runtime=10 --time_based", capture_output=True).stdout)
            res["disk"] = j["jobs"][0]["read"]["bw_bytes"] / 1e6
        for name in a.scenarios.split(","):
            res["scenarios"][name] = fns[name](scratch, a.data, a.repeat)
            bench.save(res, stamp, "resync-", render)
    finally:
        scratch.close()
    print(render(res))


if __name__ == "__main__":
    main()
