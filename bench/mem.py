#!/usr/bin/env python3
"""Memory against speed: two sluice builds at several stream counts (by hand, as root).

    SLUICE=new-binary SLUICE_BEFORE=old-binary bench/mem.py [--repeat 3]

Every run copies onto a fresh ext4 on a loop device with the page cache
dropped (bench.py's method), rounds interleaved; the table has the median
seconds and the median max RSS of each build at each -j, per set. The sets
are the full-size mixed (30k files, 3.4 GiB) and a 2 GiB file, plus dense
50k: where buffers matter, and where they should not.

Writes bench/results/mem-<date>.md and .json.
"""
import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

SETS = {
    "dense 50k": ("ranks-dense-50000", "dense", "--files 50000"),
    "mixed 30k": ("ranks-mixed-full", "mixed", ""),
    "huge 2 GiB": ("ranks-huge-2147483648", "huge", f"--size {2 << 30}"),
}


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/work/bench-data")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--jobs", default="auto,8,64")
    p.add_argument("--sets", default=",".join(SETS))
    a = p.parse_args()
    bench.need_root("mem.py")
    builds = {"this build": bench.SLUICE, "before": os.environ.get("SLUICE_BEFORE")}
    builds = {k: v for k, v in builds.items() if v}
    scratch = bench.Scratch(os.path.join(a.data, "scratch-dst.img"), 40)
    res = {}
    try:
        for name in a.sets.split(","):
            d, shape, extra = SETS[name]
            src = bench.dataset(os.path.join(a.data, d), shape, extra)
            files, size = bench.tree_size(src)
            runs = {}
            for _ in range(a.repeat):
                for j in a.jobs.split(","):
                    for build, exe in builds.items():
                        scratch.fresh()
                        rc, secs, rss = bench.timed(
                            f"{exe} copy --no-progress -q -j {j} {src} {bench.MNT}/dst")
                        ok = rc == 0 and bench.tree_size(f"{bench.MNT}/dst") == (files, size)
                        print(name, build, j, secs, rss >> 10, "ok" if ok else "FAILED", flush=True)
                        if ok:
                            runs.setdefault(f"{build}|{j}", []).append((secs, rss >> 10))
            res[name] = {"files": files, "bytes": size, "runs": runs}
    finally:
        scratch.close()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    L = [f"# Memory against speed ({stamp})", "",
         f"Machine: {os.cpu_count()} cores. Fresh ext4 on a loop device per run, page cache",
         f"dropped, median of {a.repeat} interleaved rounds.", ""]
    for name, row in res.items():
        L += [f"## {name}: {row['files']} files, {row['bytes'] >> 20} MiB", "",
              "| -j | build | seconds | max RSS MiB |", "|---|---|---:|---:|"]
        for key, xs in row["runs"].items():
            build, j = key.split("|")
            L.append(f"| {j} | {build} | {median([x[0] for x in xs])} | {median([x[1] for x in xs])} |")
        L.append("")
    bench.save(res, stamp, name="mem-", render_fn=lambda _: "\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    main()
