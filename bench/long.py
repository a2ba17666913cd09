#!/usr/bin/env python3
"""How `-j auto` behaves on a long job (issue 18): the mixed set, several
times over, in one job.

Run by hand as root, after bench.py has generated the mixed set:

    bench/long.py                  # 5 copies of the mixed set, 2 rounds
    bench/long.py --copies 3 --repeat 1

The source is one directory holding the mixed set bind-mounted N times
(N x 30,000 files, N x 3.4 GiB; every file has one link, so each copy is
copied in full). Each run copies it onto a fresh ext4 on a loop device
(as bench.py), page cache dropped, time including a final `sync`, with
`-j auto` and with fixed counts, taking turns round after round. For auto
it keeps every tuning window (`SLUICE_TUNE_LOG=1`): how many streams it
held, for how long, and what it tried.

Writes bench/results/long-<stamp>.{md,json}.
"""
import argparse
import datetime
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

SRC = "/mnt/sluice-bench-long"
WINDOW = re.compile(r"tune: ([\d.]+) s at (\d+) streams: (\d+) units/s, ([\d.]+) cores, (\d+)% idle -> (\d+)")


def mount_copies(data, n):
    os.makedirs(SRC, exist_ok=True)
    for i in range(n):
        d = os.path.join(SRC, f"copy{i}")
        os.makedirs(d, exist_ok=True)
        bench.sh(f"mountpoint -q {d} || mount --bind {data} {d}")


def unmount_copies():
    for d in sorted(os.listdir(SRC)) if os.path.isdir(SRC) else []:
        bench.sh(f"umount {os.path.join(SRC, d)}", check=False)


def run(setting, scratch):
    scratch.fresh()
    log = "/tmp/long-tune.log"
    env = "SLUICE_TUNE_LOG=1 " if setting == "auto" else ""
    rc, secs, rss = bench.timed(f"{env}{bench.SLUICE} copy {SRC} {bench.MNT}/out -j {setting} "
                                f"--no-progress -q 2>{log}")
    windows = [dict(zip(("secs", "streams", "rate", "cores", "idle", "next"), map(float, m.groups())))
               for m in WINDOW.finditer(open(log).read())]
    return {"seconds": secs, "rss_MiB": rss / 1024, "exit": rc, "windows": windows}


def held(windows):
    """'16 for 0.5 s, 64 for 24 s' from the tuning windows."""
    spans = []
    for w in windows:
        n = int(w["streams"])
        if spans and spans[-1][0] == n:
            spans[-1][1] += w["secs"]
        else:
            spans.append([n, w["secs"]])
    return ", ".join(f"{n} for {s:.1f} s" for n, s in spans)


def render(res):
    lines = [f"# -j auto on a long job, {res['date']}", "",
             f"Source: the mixed set bind-mounted {res['copies']} times ({res['files']} files, "
             f"{res['bytes'] / 2**30:.1f} GiB) on the VM's disk. Destination: a fresh ext4 on a loop device. "
             "Page cache dropped before every run; time includes a final `sync`; settings take turns, each round starting with the next.", "",
             "| -j | all runs s | median s | best fixed / this | max RSS MiB | auto's streams, by tuning window |",
             "|---|---|---:|---:|---:|---|"]
    def median(xs):
        xs = sorted(xs)
        return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2

    med = {k: median([r["seconds"] for r in v]) for k, v in res["runs"].items()}
    best = min(v for k, v in med.items() if k != "auto")
    for k, v in res["runs"].items():
        spans = "; ".join(held(r["windows"]) for r in v) if k == "auto" else ""
        runs = ", ".join("%.1f" % r["seconds"] for r in v)
        lines.append(f"| {k} | {runs} | {med[k]:.2f} | "
                     f"{best / med[k]:.2f} | {max(r['rss_MiB'] for r in v):.0f} | {spans} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--copies", type=int, default=5)
    p.add_argument("--jobs", default="16,32,64")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--data", default="/work/bench-data")
    a = p.parse_args()
    bench.need_root("long.py")
    data = os.path.realpath(bench.dataset(os.path.join(a.data, "mixed"), "mixed"))
    files, nbytes = bench.tree_size(data)
    mount_copies(data, a.copies)
    scratch = bench.Scratch(os.path.join(a.data, "scratch-long.img"), 8 + nbytes * a.copies * 2 // 2**30,
                            discard=True)
    settings = ["auto"] + a.jobs.split(",")
    res = {"date": datetime.date.today().isoformat(), "copies": a.copies, "files": files * a.copies,
           "bytes": nbytes * a.copies, "sluice": bench.sh(f"{bench.SLUICE} --version", capture_output=True).stdout.strip(),
           "runs": {s: [] for s in settings}}
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    try:
        for i in range(a.repeat):
            # Each round starts with another setting, so that none always
            # runs first (with auto first in every round, it beat every
            # fixed count, 1.06, which may have been its place).
            for s in settings[i % len(settings):] + settings[:i % len(settings)]:
                r = run(s, scratch)
                res["runs"][s].append(r)
                print(s, r["seconds"], held(r["windows"]) if s == "auto" else "", flush=True)
            bench.save(res, stamp, name="long-", render_fn=render)
    finally:
        scratch.close()
        unmount_copies()
    print(render(res))


if __name__ == "__main__":
    main()
