#!/usr/bin/env python3
"""Replication lag of `sluice watch` under a steady stream of changes.

    bench/watch.py                    # 100 changes/s for 30 s
    bench/watch.py --rate 500 --seconds 20

SRC is a tree on the disk (100 directories x 20 files of 4 KiB); DST a new
directory on the same disk. After the initial sync, a writer makes --rate
changes per second for --seconds: each change creates a new file, rewrites
an existing one, renames one or deletes one (40/40/10/10), spread over the
directories. A poller watches DST and records, for every change, when DST
first shows it (file present with the new content, name moved, or gone).
The lag of a change is that moment minus the moment the writer finished it.
Results go to bench/results/watch-STAMP.{md,json}.
"""
import argparse
import datetime
import json
import os
import random
import shutil
import subprocess
import threading
import time

from bench import ROOT, SLUICE, save, sh

BASE = "/work/bench-scratch/watch"


def quantile(v, q):
    v = sorted(v)
    return v[round((len(v) - 1) * q)] if v else float("nan")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rate", type=float, default=100)
    p.add_argument("--seconds", type=float, default=30)
    a = p.parse_args()
    sh(f"cd {ROOT} && cargo build --release -q")
    shutil.rmtree(BASE, ignore_errors=True)
    src, dst = f"{BASE}/src", f"{BASE}/dst"
    rng = random.Random(3)
    files = []
    for d in range(100):
        os.makedirs(f"{src}/d{d:03}")
        for f in range(20):
            path = f"d{d:03}/f{f:02}"
            with open(f"{src}/{path}", "wb") as fh:
                fh.write(rng.randbytes(4096))
            files.append(path)
    proc = subprocess.Popen([SLUICE, "watch", src, dst, "--json", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = []
    ready = threading.Event()

    def read_out():
        for line in proc.stdout:
            v = json.loads(line)
            lines.append(v)
            if v.get("type") == "pass" and v.get("full"):
                ready.set()

    threading.Thread(target=read_out, daemon=True).start()
    ready.wait(60)

    pending = {}  # change id -> (check function, time made)
    lags = []
    lock = threading.Lock()
    stop = threading.Event()

    def poll():
        while not stop.is_set() or pending:
            now = time.monotonic()
            with lock:
                items = list(pending.items())
            for cid, (check, made) in items:
                if check():
                    with lock:
                        del pending[cid]
                    lags.append(now - made)
            if stop.is_set() and time.monotonic() - stop_time[0] > 30:
                break
            time.sleep(0.005)

    stop_time = [0.0]
    poller = threading.Thread(target=poll)
    poller.start()

    def content_is(path, data):
        def check():
            try:
                with open(f"{dst}/{path}", "rb") as fh:
                    return fh.read() == data
            except OSError:
                return False
        return check

    def absent(path):
        return lambda: not os.path.lexists(f"{dst}/{path}")

    by_path = {}  # path -> change ids still pending that a later change supersedes
    superseded = [0]

    def touch(path):
        """A later change to `path` makes earlier pending checks moot."""
        with lock:
            for cid in by_path.pop(path, []):
                if pending.pop(cid, None) is not None:
                    superseded[0] += 1

    n = int(a.rate * a.seconds)
    t0 = time.monotonic()
    kinds = {"create": 0, "modify": 0, "rename": 0, "delete": 0}
    for i in range(n):
        # Paced: change i is made at t0 + i / rate.
        delay = t0 + i / a.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        r = rng.random()
        if r < 0.4 or len(files) < 100:
            path = f"d{rng.randrange(100):03}/new{i}"
            data = rng.randbytes(4096)
            with open(f"{src}/{path}", "wb") as fh:
                fh.write(data)
            files.append(path)
            check, kind = content_is(path, data), "create"
        elif r < 0.8:
            path = rng.choice(files)
            touch(path)
            data = rng.randbytes(4096)
            with open(f"{src}/{path}", "wb") as fh:
                fh.write(data)
            check, kind = content_is(path, data), "modify"
        elif r < 0.9:
            path = files.pop(rng.randrange(len(files)))
            touch(path)
            new = f"d{rng.randrange(100):03}/moved{i}"
            os.rename(f"{src}/{path}", f"{src}/{new}")
            files.append(new)
            with open(f"{src}/{new}", "rb") as fh:
                data = fh.read()
            old_gone, new_there = absent(path), content_is(new, data)
            check, kind = (lambda o=old_gone, t=new_there: o() and t()), "rename"
        else:
            path = files.pop(rng.randrange(len(files)))
            touch(path)
            os.unlink(f"{src}/{path}")
            check, kind = absent(path), "delete"
        kinds[kind] += 1
        with lock:
            pending[i] = (check, time.monotonic())
            by_path.setdefault(new if kind == "rename" else path, []).append(i)
    made_s = time.monotonic() - t0
    stop_time[0] = time.monotonic()
    stop.set()
    poller.join()
    missed = len(pending)
    proc.send_signal(2)
    proc.wait(30)
    summary = next((v for v in reversed(lines) if v.get("type") == "summary"), {})
    passes = [v for v in lines if v.get("type") == "pass"]
    res = {
        "machine": {"date": datetime.datetime.now().isoformat(timespec="minutes"),
                    "cpus": os.cpu_count()},
        "rate": a.rate, "seconds": a.seconds, "changes": n, "made_in_s": made_s, "kinds": kinds,
        "missed_after_30s": missed, "superseded": superseded[0],
        "lag_median_s": quantile(lags, 0.5), "lag_p90_s": quantile(lags, 0.9),
        "lag_max_s": max(lags) if lags else None,
        "passes": len(passes), "sluice_summary": summary,
    }
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    save(res, stamp, f"watch-{a.rate:.0f}ps-", render)
    print(render(res))
    shutil.rmtree(BASE, ignore_errors=True)


def render(r):
    s = r["sluice_summary"]
    return "\n".join([
        f"# sluice watch lag, {r['machine']['date']}", "",
        f"{r['machine']['cpus']} cores; SRC and DST on the same disk. {r['changes']} changes "
        f"({', '.join(f'{k} {v}' for k, v in r['kinds'].items())}) made at {r['rate']:.0f}/s "
        f"over {r['made_in_s']:.1f} s.", "",
        "| measured by | median lag s | 90th percentile s | max s |",
        "|---|---:|---:|---:|",
        f"| the bench (change made → visible in DST) | {r['lag_median_s']:.3f} | {r['lag_p90_s']:.3f} | "
        f"{r['lag_max_s']:.3f} |",
        f"| sluice's own report (event seen → pass done) | {s.get('lag_median_s', float('nan')):.3f} | "
        f"{s.get('lag_p90_s', float('nan')):.3f} | {s.get('lag_max_s', float('nan')):.3f} |",
        "",
        f"Changes not visible 30 s after the last one: {r['missed_after_30s']} "
        f"({r['superseded']} more were superseded by a later change to the same file before DST showed them, "
        f"and are not counted). "
        f"Passes: {r['passes']}, sluice counted {s.get('changes')} events.", ""])


if __name__ == "__main__":
    main()
