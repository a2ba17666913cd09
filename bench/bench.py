#!/usr/bin/env python3
"""sluice's benchmark harness: same data, same machine, same run.

Run by hand as root (it makes file systems and drops the page cache):

    bench/bench.py                      # all shapes, all tools
    bench/bench.py --shapes dense,huge  # some of them
    bench/bench.py --quick              # small datasets, for checking the harness

For each shape it makes the dataset once (bench/gen.py, deterministic) under
--data on the disk, then for every tool: makes a fresh ext4 file system on a
loop device (direct I/O, so no double caching) as the destination, drops the
page cache, and times `TOOL SRC DST && sync` with /usr/bin/time (wall
seconds and max RSS). A fresh destination per run matters here: the root
ext4 has no journal, and ext4 then scans past every recently deleted inode
when allocating, which made repeated runs into one directory 4x slower.
It checks each tool really copied (file count and bytes) and writes a
Markdown table and JSON to bench/results/.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# SLUICE=PATH runs that binary as "sluice" (a frozen copy, so a rebuild
# while the bench runs does not change what is measured).
SLUICE = os.environ.get("SLUICE") or os.path.join(ROOT, "target", "release", "sluice")
XCP = shutil.which("xcp") or os.path.expanduser("~/.cargo/bin/xcp")
MNT = "/mnt/sluice-bench-dst"


def sh(cmd, check=True, **kw):
    return subprocess.run(cmd, shell=True, check=check, text=True, **kw)


def install_peers():
    need = [p for p, exe in [("rsync", "rsync"), ("rclone", "rclone"), ("fpart", "fpsync"),
                             ("fio", "fio"), ("time", "/usr/bin/time"), ("e2fsprogs", "mkfs.ext4")]
            if not shutil.which(exe) and not os.path.exists(exe)]
    if need:
        sh("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq " + " ".join(need))
    if not os.path.exists(XCP):
        sh("cargo install xcp --locked")
    sh(f"cd {ROOT} && cargo build --release -q")


class Scratch:
    """A loop-mounted ext4 made fresh before every timed run."""

    def __init__(self, img, size_gb, discard=False):
        """`discard`: mkfs gives the image's blocks back to the disk each
        time, so that it never holds more than one run's data (for sets
        near the disk's free space; the default reuses them)."""
        self.img = img
        self.discard = "discard" if discard else "nodiscard"
        os.makedirs(os.path.dirname(img), exist_ok=True)  # a fresh machine has no data dir
        sh(f"truncate -s {size_gb}G {img}")
        self.dev = sh(f"losetup --direct-io=on -f --show {img}", capture_output=True).stdout.strip()
        os.makedirs(MNT, exist_ok=True)

    def fresh(self):
        sh(f"umount {MNT} 2>/dev/null", check=False)
        sh(f"mkfs.ext4 -q -F -N 1500000 -E lazy_itable_init=0,lazy_journal_init=0,{self.discard} {self.dev}")
        sh(f"mount {self.dev} {MNT}")
        drop_caches()

    def close(self):
        sh(f"umount {MNT}", check=False)
        sh(f"losetup -d {self.dev}", check=False)
        os.unlink(self.img)


def need_root(script):
    if os.geteuid() != 0:
        sys.exit(f"{script} needs root: it mounts file systems and drops the page cache")


def dataset(path, shape, extra=""):
    """Generates `shape` at `path` (bench/gen.py) unless it is there already."""
    if not os.path.exists(path):
        sh(f"python3 {HERE}/gen.py {shape} {path}.part {extra} && mv {path}.part {path}")
    return path


def drop_caches():
    sh("sync; echo 3 > /proc/sys/vm/drop_caches")


BEFORE = os.environ.get("SLUICE_BEFORE")  # another sluice binary, to compare builds


def tools(shape, src, dst):
    """(name, shell command) for each peer; each ends with sync. With
    SLUICE_BEFORE=PATH, "sluice before" runs that binary (a build from
    before a change) in the same rounds."""
    t = [
        ("sluice", f"{SLUICE} copy {src} {dst} --no-progress >/dev/null"),
        ("cp -a", f"cp -a {src} {dst}"),
        ("tar to tar", f"mkdir -p {dst} && tar -C {src} -cf - . | tar -C {dst} -xf -"),
        ("rsync -a", f"rsync -a {src}/ {dst}/"),
        ("rclone --transfers 8", f"rclone copy --transfers 8 --checkers 8 {src} {dst}"),
        ("rclone --transfers 32", f"rclone copy --transfers 32 --checkers 32 {src} {dst}"),
        ("fpsync -n 8", f"mkdir -p {dst} && fpsync -n 8 -t /tmp/fpsync-work {src}/ {dst}/ >/dev/null"),
        ("xcp -w 8", f"{XCP} -r -w 8 {src} {dst}"),
    ]
    if BEFORE:
        t.insert(1, ("sluice before", f"{BEFORE} copy {src} {dst} --no-progress >/dev/null"))
    if shape == "huge":
        # The classic parallel dd at offsets with O_DIRECT, 8 pieces.
        f = os.path.join(src, "huge.img")
        size = os.path.getsize(f)
        mib = size >> 20
        piece = (mib + 7) // 8
        dd = (f"mkdir -p {dst} && truncate -s {size} {dst}/huge.img && seq 0 7 | xargs -P 8 -I{{}} sh -c "
              f"'dd if={f} of={dst}/huge.img bs=1M skip=$(({{}}*{piece})) seek=$(({{}}*{piece})) count={piece} "
              f"iflag=direct oflag=direct conv=notrunc status=none'")
        t.append(("dd at offsets -P 8", dd))
    if shape == "onedir":
        t = [x for x in t if x[0] in ("sluice", "sluice before", "xcp -w 8", "tar to tar")]
    return t


def tree_size(path):
    """(regular files, their total bytes) under path."""
    n = total = 0
    for d, _, names in os.walk(path):
        for name in names:
            st = os.lstat(os.path.join(d, name))
            if stat.S_ISREG(st.st_mode):
                n += 1
                total += st.st_size
    return n, total


def timed(cmd):
    with open("/tmp/bench-cmd.sh", "w") as f:
        f.write(f"set -e\n{cmd}\nsync\n")
    r = sh("/usr/bin/time -f '%e %M' sh /tmp/bench-cmd.sh 2>/tmp/bench-time", check=False)
    last = open("/tmp/bench-time").read().strip().splitlines()[-1].split()
    return r.returncode, float(last[0]), int(last[1])


def fio_limits(data_dir, scratch):
    """The disk's own limits: sequential read, write, both at once (O_DIRECT),
    and the rate of creating+writing 1 KiB files from 8 threads."""
    res = {}
    scratch.fresh()
    rd = os.path.join(data_dir, "fio-read.dat")
    if not os.path.exists(rd):
        sh(f"fio --name=prep --filename={rd} --size=4G --rw=write --bs=1M --direct=1 --output-format=json >/dev/null")

    def run(args):
        out = sh(f"fio --output-format=json {args}", capture_output=True).stdout
        return json.loads(out)

    j = run(f"--name=r --filename={rd} --rw=read --bs=1M --direct=1 --iodepth=16 --ioengine=libaio --runtime=15 --time_based")
    res["seq_read_MBps"] = j["jobs"][0]["read"]["bw_bytes"] / 1e6
    j = run(f"--name=w --filename={MNT}/fio-write.dat --size=4G --rw=write --bs=1M --direct=1 --iodepth=16 --ioengine=libaio --runtime=15 --time_based")
    res["seq_write_MBps"] = j["jobs"][0]["write"]["bw_bytes"] / 1e6
    scratch.fresh()
    j = run(f"--name=r --filename={rd} --rw=read --bs=1M --direct=1 --iodepth=16 --ioengine=libaio --runtime=15 --time_based "
            f"--name=w --filename={MNT}/fio-write.dat --size=4G --rw=write --bs=1M --direct=1 --iodepth=16 --ioengine=libaio --runtime=15 --time_based")
    r = j["jobs"][0]["read"]["bw_bytes"] / 1e6
    w = j["jobs"][1]["write"]["bw_bytes"] / 1e6
    res["read_while_write_MBps"] = min(r, w)
    scratch.fresh()
    t0 = time.time()
    sh(f"fio --name=create --directory={MNT} --numjobs=8 --nrfiles=5000 --filesize=1k --bs=1k --rw=write "
       f"--create_on_open=1 --openfiles=1 --file_service_type=sequential --output-format=json >/dev/null")
    sh("sync")
    res["create_1k_files_per_s"] = 8 * 5000 / (time.time() - t0)
    return res


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="dense,mixed,huge,onedir")
    p.add_argument("--data", default="/work/bench-data")
    p.add_argument("--tools", default="", help="comma-separated subset of tool names")
    p.add_argument("--quick", action="store_true", help="tiny datasets, to check the harness")
    p.add_argument("--no-fio", action="store_true")
    p.add_argument("--repeat", type=int, default=3, help="runs per tool; the median is reported")
    a = p.parse_args()
    need_root("bench.py")
    install_peers()
    os.makedirs(a.data, exist_ok=True)
    scratch = Scratch(os.path.join(a.data, "scratch-dst.img"), 40)
    machine = {
        "date": datetime.date.today().isoformat(),
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "src": "ext4 (no journal) on the VM's virtio disk",
        "dst": "fresh ext4 on a loop device (direct I/O) backed by the same disk",
        "sluice": sh(f"{SLUICE} --version", capture_output=True).stdout.strip(),
    }
    results = {"machine": machine, "shapes": {}}
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    try:
        if not a.no_fio:
            results["disk"] = fio_limits(a.data, scratch)
            save(results, stamp)
            print("disk:", results["disk"], flush=True)
        for shape in a.shapes.split(","):
            extra = {"dense": "--files 2000", "mixed": "--files 300", "huge": "--size 268435456",
                     "onedir": "--files 20000"}[shape] if a.quick else ""
            src = dataset(os.path.join(a.data, shape + ("-quick" if a.quick else "")), shape, extra)
            files, nbytes = tree_size(src)
            chosen = [(n, c) for n, c in tools(shape, src, f"{MNT}/out") if not a.tools or n in a.tools.split(",")]
            runs = {n: [] for n, _ in chosen}
            # Tools take turns, round after round, so drift in the machine's
            # speed hits them all alike.
            for _ in range(1 if shape == "onedir" else a.repeat):
                for name, cmd in chosen:
                    scratch.fresh()
                    rc, secs, rss = timed(cmd)
                    got = tree_size(f"{MNT}/out") if os.path.exists(f"{MNT}/out") else (0, 0)
                    runs[name].append((secs, rss, rc, got))
                    print(shape, name, secs, flush=True)
            rows = []
            for name, rs in runs.items():
                # The median run: these machines are noisy (two identical
                # sluice runs here took 14.1 s and 21.3 s).
                rs.sort()
                secs, rss, rc, got = rs[len(rs) // 2]
                ok = all(r[2] == 0 and r[3] == (files, nbytes) for r in rs)
                row = {"tool": name, "seconds": secs, "files_per_s": files / secs, "MB_per_s": nbytes / 1e6 / secs,
                       "max_rss_MiB": max(r[1] for r in rs) / 1024, "ok": ok, "exit": rc,
                       "all_seconds": [r[0] for r in rs]}
                if not ok:
                    bad = next(r for r in rs if not (r[2] == 0 and r[3] == (files, nbytes)))
                    row["note"] = f"copied {bad[3][0]} files / {bad[3][1]} bytes of {files} / {nbytes}"
                rows.append(row)
            results["shapes"][shape] = {"files": files, "bytes": nbytes, "rows": rows}
            save(results, stamp)
    finally:
        scratch.close()
    print(render(results))


def save(results, stamp, name="", render_fn=None):
    """bench/results/{name}{stamp}.json and .md (rendered by render_fn)."""
    out_dir = os.path.join(HERE, "results")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}{stamp}.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, f"{name}{stamp}.md"), "w") as f:
        f.write((render_fn or render)(results))


def render(results):
    m = results["machine"]
    lines = [f"# sluice benchmark, {m['date']}", "",
             f"Machine: {m['cpus']} cores ({m['cpu']}), {m['mem_gib']} GiB RAM, kernel {m['kernel']}.  ",
             f"Source: {m['src']}. Destination: {m['dst']}.  ",
             "Every run: fresh destination file system, page cache dropped, time includes a final `sync`.", ""]
    if "disk" in results:
        d = results["disk"]
        lines += ["Disk limits (fio, O_DIRECT, 1 MiB, iodepth 16): "
                  f"sequential read {d['seq_read_MBps']:.0f} MB/s, write {d['seq_write_MBps']:.0f} MB/s, "
                  f"read while writing {d['read_while_write_MBps']:.0f} MB/s; "
                  f"creating 1 KiB files from 8 threads: {d['create_1k_files_per_s']:.0f} files/s.", ""]
    for shape, s in results["shapes"].items():
        rows = s["rows"]
        # "sluice before" (SLUICE_BEFORE) is an earlier build, not a peer.
        peers = [r for r in rows if not r["tool"].startswith("sluice") and r["ok"]]
        best = min((r["seconds"] for r in peers), default=None)
        lines += [f"## {shape}: {s['files']} files, {s['bytes'] / 2**30:.2f} GiB", "",
                  "| tool | median s | all runs s | files/s | MB/s | max RSS MiB | speed vs best peer |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for r in sorted(rows, key=lambda r: r["seconds"]):
            ratio = f"{best / r['seconds']:.2f}x" if best else "-"
            flag = "" if r["ok"] else f" (FAILED: exit {r['exit']}; {r.get('note', '')})"
            runs = ", ".join(f"{x:.1f}" for x in r.get("all_seconds", []))
            lines.append(f"| {r['tool']}{flag} | {r['seconds']:.2f} | {runs} | {r['files_per_s']:.0f} | {r['MB_per_s']:.0f} | "
                         f"{r['max_rss_MiB']:.1f} | {ratio} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
