#!/usr/bin/env python3
"""Does sluice pick its own parallelism well? (issue 5), same run, same data.

Run by hand as root, after bench.py has generated the datasets:

    bench/tune.py                          # everything
    bench/tune.py --shapes dense --sources tmpfs --skip-latency

1. For each shape (dense, mixed, huge) and each source (the disk, and a
   tmpfs copy of the set), copies onto a fresh ext4 on a loop device (as
   bench.py) with `-j auto` and with each fixed `-j`, interleaved round after
   round, page cache dropped before every run. Reports auto against the best
   fixed setting, and the streams auto went through.
2. `sluice probe SRC DST` on the same pair: how long it takes, what it
   recommends, how that stream count does against the best fixed one, and
   `-j auto` started from the saved probe (`probe --save`).
3. The latency target: crates/latencyfs adds 1 ms to every request on top
   of a fresh ext4; a 20,000-file slice of the dense set (same generator) is
   copied with -j 1 (once: ~3 minutes), fixed counts, -j auto, and -j auto
   after `probe --save`.

Writes bench/results/tune-<stamp>.{md,json}.
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
LATENCYFS = os.path.join(bench.ROOT, "target", "release", "latencyfs")
MNT = bench.MNT
TMPFS = "/mnt/sluice-bench-tmpfs"
SHARE = "/mnt/sluice-bench-share"
STATE = "/tmp/sluice-bench-state"


def run_copy(src, dst, jobs, state=None, cold=True):
    """One timed copy; returns seconds, RSS and what the summary said."""
    if cold:
        bench.drop_caches()
    env = f"XDG_STATE_HOME={state or '/nonexistent'} "
    rc, secs, rss = bench.timed(f"{env}{SLUICE} copy {src} {dst} -j {jobs} --json --no-progress >/tmp/tune-out.json")
    try:
        summary = json.loads(open("/tmp/tune-out.json").read().strip().splitlines()[-1])
    except (ValueError, IndexError):
        summary = {}
    return {"seconds": secs, "rss_MiB": rss / 1024, "exit": rc,
            "files": summary.get("files_copied"), "bytes": summary.get("bytes_copied"),
            "trace": summary.get("streams_trace"), "streams": summary.get("streams")}


def run_probe(src, dst, save_to=None):
    bench.drop_caches()
    env = dict(os.environ, XDG_STATE_HOME=save_to or "/nonexistent")
    t0 = time.time()
    out = subprocess.run([SLUICE, "probe", src, dst, "--json", "--cold"] + (["--save"] if save_to else []),
                         capture_output=True, text=True, env=env)
    secs = time.time() - t0
    recs = [json.loads(l) for l in out.stdout.splitlines() if '"recommendation"' in l]
    return {"seconds": secs, "exit": out.returncode,
            "recommendations": {r["class"]: r["streams"] for r in recs},
            # What -j auto starts from after --save (saved.rs: the larger).
            "start": max((r["streams"] for r in recs), default=None)}


def median(rs):
    rs = sorted(rs, key=lambda r: r["seconds"])
    m = dict(rs[len(rs) // 2])
    m["all_seconds"] = [r["seconds"] for r in rs]
    m["ok"] = all(r["exit"] == 0 for r in rs)
    m["traces"] = [r.get("trace") for r in rs]
    return m


def pair(scratch, shape, source, src, settings, repeat, files, nbytes, do_probe):
    """Fixed -j and auto on one (shape, source) pair, then the probe."""
    runs = {s: [] for s in settings}
    state = os.path.join(STATE, f"{shape}-{source}")
    for _ in range(repeat):
        for s in settings:
            scratch.fresh()
            r = run_copy(src, f"{MNT}/out", s)
            r["exit"] = r["exit"] or (0 if (r["files"], r["bytes"]) == (files, nbytes) else 99)
            runs[s].append(r)
            print(shape, source, f"-j {s}", r["seconds"], r.get("trace"), flush=True)
    res = {"runs": {str(s): median(rs) for s, rs in runs.items()}}
    if do_probe:
        scratch.fresh()
        bench.sh(f"rm -rf {state}")
        p = run_probe(src, MNT, save_to=state)
        print(shape, source, "probe", p, flush=True)
        res["probe"] = p
        extra = []
        if p["start"] and p["start"] not in settings:
            extra.append(p["start"])
        saved = []
        for _ in range(repeat):
            for s in extra:
                scratch.fresh()
                runs.setdefault(s, []).append(run_copy(src, f"{MNT}/out", s))
            scratch.fresh()
            saved.append(run_copy(src, f"{MNT}/out", "auto", state=state))
            print(shape, source, "auto after probe --save", saved[-1]["seconds"], saved[-1]["trace"], flush=True)
        res["runs"] = {str(s): median(rs) for s, rs in runs.items()}
        res["auto_saved"] = median(saved)
    return res


def latency(scratch, src, repeat, fixed):
    """Copies onto latencyfs (1 ms per request) over a fresh ext4."""
    scratch.fresh()
    back = f"{MNT}/back"
    os.makedirs(back)
    os.makedirs(SHARE, exist_ok=True)
    proc = subprocess.Popen([LATENCYFS, back, SHARE, "--latency-ms", "1", "--threads", "64"],
                            stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    out = {"runs": {}}
    n = [0]

    def one(jobs, state=None):
        n[0] += 1
        r = run_copy(src, f"{SHARE}/out{n[0]}", jobs, state=state)
        print("latency", f"-j {jobs}", r["seconds"], r.get("trace"), flush=True)
        return r

    try:
        out["runs"]["1"] = median([one(1)])
        runs = {s: [] for s in fixed + ["auto"]}
        for _ in range(repeat):
            for s in runs:
                runs[s].append(one(s))
        state = os.path.join(STATE, "latency")
        bench.sh(f"rm -rf {state}")
        out["probe"] = run_probe(src, SHARE, save_to=state)
        print("latency probe", out["probe"], flush=True)
        runs["auto after probe --save"] = [one("auto", state=state) for _ in range(repeat)]
        for s, rs in runs.items():
            out["runs"][str(s)] = median(rs)
    finally:
        bench.sh(f"umount {SHARE}", check=False)
        proc.wait(timeout=30)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="dense,mixed,huge")
    p.add_argument("--sources", default="disk,tmpfs")
    p.add_argument("--jobs", default="1,4,8,16,32", help="fixed -j values to compare auto with")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--data", default="/work/bench-data")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-probe", action="store_true")
    p.add_argument("--latency-files", type=int, default=20000)
    a = p.parse_args()
    bench.need_root("tune.py")
    bench.sh(f"cd {bench.ROOT} && cargo build --release --workspace -q")
    fixed = [int(x) for x in a.jobs.split(",")]
    settings = ["auto"] + fixed
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    results = {"machine": {
        "date": datetime.date.today().isoformat(),
        "cpus": os.cpu_count(),
        "kernel": os.uname().release,
        "dst": "fresh ext4 on a loop device (direct I/O) backed by the VM's disk, made before every run",
        "sources": "disk: ext4 (no journal) on the VM's virtio disk; tmpfs: a copy of the set in RAM",
        "sluice": bench.sh(f"{SLUICE} --version", capture_output=True).stdout.strip()},
        "pairs": {}}
    scratch = bench.Scratch(os.path.join(a.data, "scratch-dst.img"), 40)
    try:
        for shape in filter(None, a.shapes.split(",")):
            data = os.path.realpath(bench.dataset(os.path.join(a.data, shape), shape))
            files, nbytes = bench.tree_size(data)
            for source in a.sources.split(","):
                src = data
                if source == "tmpfs":
                    bench.sh(f"umount {TMPFS} 2>/dev/null; mkdir -p {TMPFS} && "
                             f"mount -t tmpfs -o size={nbytes * 2 // 2**20 + 2048}M tmpfs {TMPFS} && "
                             f"cp -a {data} {TMPFS}/{shape}")
                    src = f"{TMPFS}/{shape}"
                try:
                    results["pairs"][f"{shape} from {source}"] = dict(
                        pair(scratch, shape, source, src, settings, a.repeat, files, nbytes, not a.skip_probe),
                        files=files, bytes=nbytes)
                finally:
                    if source == "tmpfs":
                        bench.sh(f"umount {TMPFS}", check=False)
                bench.save(results, stamp, "tune-", render)
        if not a.skip_latency:
            src = bench.dataset(os.path.join(a.data, f"dense{a.latency_files}"), "dense",
                                f"--files {a.latency_files}")
            files, nbytes = bench.tree_size(src)
            results["latency"] = dict(latency(scratch, src, a.repeat, [8, 16, 32, 64]), files=files, bytes=nbytes)
            bench.save(results, stamp, "tune-", render)
    finally:
        scratch.close()
    print(render(results))


def trace_text(traces):
    """The streams auto went through, one run per entry, compressed."""
    out = []
    for t in traces:
        if not t:
            continue
        runs = []
        for v in t:
            if runs and runs[-1][0] == v:
                runs[-1][1] += 1
            else:
                runs.append([v, 1])
        out.append(" ".join(f"{v}" if c == 1 else f"{v}x{c}" for v, c in runs))
    return "; ".join(out)


def table(runs, files, nbytes, L):
    fixed = {k: v for k, v in runs.items() if k.isdigit() and v["ok"]}
    best_k = min(fixed, key=lambda k: fixed[k]["seconds"]) if fixed else None
    best = fixed[best_k]["seconds"] if best_k else None
    L += ["| -j | median s | all runs s | files/s | MB/s | max RSS MiB | best fixed / this | streams (auto) |",
          "|---|---:|---|---:|---:|---:|---:|---|"]
    order = sorted(runs, key=lambda k: (not k.startswith("auto"), int(k) if k.isdigit() else 0, k))
    for k in order:
        r = runs[k]
        ratio = f"{best / r['seconds']:.2f}" if best else "-"
        mark = " (best fixed)" if k == best_k else ""
        flag = "" if r["ok"] else " FAILED"
        L.append(f"| {k}{mark}{flag} | {r['seconds']:.2f} | {', '.join(f'{x:.1f}' for x in r['all_seconds'])} | "
                 f"{files / r['seconds']:.0f} | {nbytes / 1e6 / r['seconds']:.0f} | {r['rss_MiB']:.0f} | {ratio} | "
                 f"{trace_text(r.get('traces', [])) if k.startswith('auto') else ''} |")
    return best_k, best


def render(results):
    m = results["machine"]
    L = [f"# -j auto against fixed stream counts, {m['date']}", "",
         f"Machine: {m['cpus']} cores, kernel {m['kernel']}, {m['sluice']}.  ",
         f"Destination: {m['dst']}.  ", f"Sources: {m['sources']}.  ",
         "Every run: page cache dropped first; time includes a final `sync`. "
         "Fixed counts and auto take turns, round after round; the median is shown. "
         "'best fixed / this' above 1 means faster than the best fixed count. "
         "Streams (auto): the target at the start and after each one-second tuning step (AxN: held N steps).", ""]
    for name, pr in results["pairs"].items():
        L += [f"## {name}: {pr['files']} files, {pr['bytes'] / 2**30:.2f} GiB", ""]
        runs = dict(pr["runs"])
        if "auto_saved" in pr:
            runs["auto after probe --save"] = pr["auto_saved"]
        best_k, best = table(runs, pr["files"], pr["bytes"], L)
        if "probe" in pr:
            p = pr["probe"]
            at = pr["runs"].get(str(p["start"]))
            verdict = f"{best / at['seconds']:.2f} of the best fixed count's speed" if at and best else "-"
            L += ["", f"Probe: {p['seconds']:.1f} s, recommends {p['recommendations']}; "
                      f"-j {p['start']} runs at {verdict}."]
        L.append("")
    if "latency" in results:
        lt = results["latency"]
        L += [f"## onto latencyfs (1 ms per request, over a fresh ext4): {lt['files']} files of 1 KiB", ""]
        best_k, best = table(lt["runs"], lt["files"], lt["bytes"], L)
        one = lt["runs"]["1"]["seconds"]
        auto = lt["runs"]["auto"]["seconds"]
        L += ["", f"-j auto is {one / auto:.1f}x faster than -j 1 (target: 8x)."]
        if "probe" in lt:
            p = lt["probe"]
            L.append(f"Probe: {p['seconds']:.1f} s, recommends {p['recommendations']}.")
        L.append("")
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
