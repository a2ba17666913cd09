#!/usr/bin/env python3
"""sluice over ssh against rsync, scp and tar|ssh|tar, on a veth rig.

Run by hand as root (it makes network namespaces, mounts file systems and
drops the page cache):

    bench/net.py                        # dense, mixed, huge, and a 1%-changed huge
    bench/net.py --shapes dense --repeat 1
    bench/net.py --link 1000 --per-flow 250 --shapes dense,huge
                                        # the link shaped: 1 Gbit/s in all, each TCP
                                        # connection at most 250 Mbit/s (HTB)
    bench/net.py --link 1000 --per-flow 250 --delay 20 --shapes dense,huge
                                        # and 20 ms more per round trip (netem is not
                                        # in this kernel: bench/delayline.py, a TUN
                                        # device and a Python loop, holds packets)

Two network namespaces joined by a veth pair (unshaped), an OpenSSH server
with throwaway keys in one; every tool runs in the other and copies this
host's tree to the server's DST (a push, as `rsync -a SRC host:DST`), DST
a fresh ext4 on a loop device each run, page cache dropped before each.
Both "hosts" are this machine's two cores, so the CPU each side spends is
reported: the client's from /usr/bin/time, the server's from the sshd
master's reaped children (/proc/PID/stat cutime+cstime), and the bytes on
the wire from the veth's counters. Datasets are smaller than bench.py's
(named in the table) so scp's per-file cost stays bearable.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (Scratch, dataset, drop_caches, sh)

SLUICE = os.environ.get("SLUICE") or bench.SLUICE
CLIENT, SERVER = "slbench-c", "slbench-s"
CIF, SIF = "slbc0", "slbs0"
CADDR, SADDR = "10.231.0.1", "10.231.0.2"
IN_CLIENT = f"nsenter --net=/var/run/netns/{CLIENT}"
SHAPES = {
    "dense": ("dense", "--files 20000", "20,000 files of 1 KiB"),
    "mixed": ("mixed", "--files 3000", "3,000 files, log-normal sizes"),
    "huge": ("huge", f"--size {2 << 30}", "one 2 GiB file"),
}


def sh(cmd, **kw):
    return bench.sh(cmd, **kw)


class Rig:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="slbench-ssh-")
        self.down()
        sh(f"ip netns add {CLIENT} && ip netns add {SERVER}")
        sh(f"ip link add {CIF} type veth peer name {SIF} && ip link set {CIF} netns {CLIENT} "
           f"&& ip link set {SIF} netns {SERVER}")
        for ns, ifc, addr in [(CLIENT, CIF, CADDR), (SERVER, SIF, SADDR)]:
            sh(f"ip -n {ns} addr add {addr}/24 dev {ifc} && ip -n {ns} link set {ifc} up "
               f"&& ip -n {ns} link set lo up")
        d = self.dir
        sh(f"ssh-keygen -q -t ed25519 -N '' -f {d}/host && ssh-keygen -q -t ed25519 -N '' -f {d}/id "
           f"&& cp {d}/id.pub {d}/authorized_keys && mkdir -p /run/sshd")
        with open(f"{d}/sshd_config", "w") as f:
            f.write(f"ListenAddress {SADDR}\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\n"
                    f"StrictModes no\nPidFile {d}/sshd.pid\nMaxStartups 64\nMaxSessions 64\n"
                    "Subsystem sftp /usr/lib/openssh/sftp-server\n")
        # nsenter --net, not `ip netns exec`: that also makes a mount
        # namespace, which would not see the fresh DST mounted per run.
        self.sshd = subprocess.Popen(["nsenter", f"--net=/var/run/netns/{SERVER}", "/usr/sbin/sshd",
                                      "-D", "-e", "-f", f"{d}/sshd_config"], stderr=subprocess.DEVNULL)
        self.ssh = (f"ssh -i {d}/id -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                    "-o BatchMode=yes -o LogLevel=ERROR")
        for _ in range(50):
            if sh(f"{IN_CLIENT} {self.ssh} {SADDR} true 2>/dev/null", check=False).returncode == 0:
                return
            time.sleep(0.1)
        sys.exit("sshd did not come up")

    def shape(self, link, per_flow):
        """What the client sends: `link` Mbit/s in all, each TCP connection
        at most `per_flow` (HTB, connections told apart by a hash of their
        source port into 256 classes; two may share one now and then)."""
        lines = [f"qdisc add dev {CIF} root handle 1: htb",
                 f"class add dev {CIF} parent 1: classid 1:1 htb rate {link}mbit",
                 f"filter add dev {CIF} parent 1: prio 1 handle 2: protocol ip u32 divisor 256",
                 f"filter add dev {CIF} parent 1: prio 1 protocol ip u32 ht 800:: "
                 "match ip protocol 6 0xff hashkey mask 0x00ff0000 at 20 link 2:"]
        for b in range(256):
            # A small guaranteed rate, so the link's rate bounds the sum.
            lines.append(f"class add dev {CIF} parent 1:1 classid 1:{0x100 + b:x} htb "
                         f"rate 1mbit ceil {per_flow}mbit")
            lines.append(f"filter add dev {CIF} parent 1: prio 1 protocol ip u32 ht 2:{b:x}: "
                         f"match u32 0 0 flowid 1:{0x100 + b:x}")
        path = os.path.join(self.dir, "shape.tc")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        sh(f"ip netns exec {CLIENT} tc -batch {path}")

    def delay(self, ms):
        """Adds `ms` to every packet the client sends (so to each round
        trip): what the client addresses to the server is routed into a
        TUN device, held there by bench/delayline.py, and forwarded on to
        the veth as it comes back out. The path's MTU goes to 65000 so a
        gigabit is a few thousand packets a second for the Python loop."""
        tun = "slbtun"
        self.delayline = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{CLIENT}", sys.executable,
             os.path.join(HERE, "delayline.py"), tun, str(ms)], stdout=subprocess.PIPE, text=True)
        if self.delayline.stdout.readline().strip() != "up":
            sys.exit("the delay line did not start")
        sh(f"ip -n {SERVER} link set {SIF} mtu 65000")
        sh(f"{IN_CLIENT} sh -c 'ip link set {CIF} mtu 65000 && ip link set {tun} up mtu 65000 "
           "&& sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 "
           f"net.ipv4.conf.{tun}.rp_filter=0 net.ipv4.conf.{tun}.accept_local=1 "
           f"&& ip route add {SADDR}/32 dev {tun} src {CADDR} "
           f"&& ip rule add iif {tun} lookup 100 && ip route add {SADDR}/32 dev {CIF} table 100'")

    def iperf(self, parallel):
        """Mbit/s iperf3 -P `parallel` gets from client to server in 5 s."""
        srv = subprocess.Popen(["nsenter", f"--net=/var/run/netns/{SERVER}", "iperf3", "-s", "-1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        out = sh(f"{IN_CLIENT} iperf3 -c {SADDR} -P {parallel} -t 5 -J", capture_output=True,
                 check=False).stdout
        srv.wait(timeout=10)
        try:
            return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
        except (ValueError, KeyError):
            return None

    def down(self):
        for ns in (CLIENT, SERVER):
            sh(f"ip netns del {ns} 2>/dev/null", check=False)

    def close(self):
        self.sshd.kill()
        if getattr(self, "delayline", None):
            self.delayline.kill()
        self.down()
        shutil.rmtree(self.dir, ignore_errors=True)

    def server_cpu(self):
        """Seconds of CPU the sshd master's finished children used."""
        with open(f"/proc/{self.sshd.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # After ')': state is fields[0]; cutime, cstime are stat fields 16, 17.
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def wire_bytes(self):
        out = sh(f"ip -n {CLIENT} -s -j link show {CIF}", capture_output=True).stdout
        s = json.loads(out)[0]["stats64"]
        return s["rx"]["bytes"] + s["tx"]["bytes"]


def tools(rig, src, dst):
    # The sshd master forks per connection; `ip netns exec` runs the ssh
    # client in the client namespace.
    remote = f"root@{SADDR}"
    return [
        ("sluice", f"{SLUICE} copy {src} {remote}:{dst} -e '{rig.ssh}' --remote-path {SLUICE} "
                   "--no-progress >/dev/null"),
        ("sluice --streams 0", f"{SLUICE} copy {src} {remote}:{dst} -e '{rig.ssh}' "
                               f"--remote-path {SLUICE} --streams 0 --no-progress >/dev/null"),
        ("sluice --streams 4", f"{SLUICE} copy {src} {remote}:{dst} -e '{rig.ssh}' "
                               f"--remote-path {SLUICE} --streams 4 --no-progress >/dev/null"),
        ("sluice --streams 8", f"{SLUICE} copy {src} {remote}:{dst} -e '{rig.ssh}' "
                               f"--remote-path {SLUICE} --streams 8 --no-progress >/dev/null"),
        ("sluice --streams 16", f"{SLUICE} copy {src} {remote}:{dst} -e '{rig.ssh}' "
                                f"--remote-path {SLUICE} --streams 16 --no-progress >/dev/null"),
        ("rsync -a", f"rsync -a -e '{rig.ssh}' {src}/ {remote}:{dst}/"),
        ("scp -r", f"{rig.ssh.replace('ssh ', 'scp -q -r ', 1)} {src} {remote}:{dst}"),
        ("tar | ssh | tar", f"tar -C {src} -cf - . | {rig.ssh} {remote} 'mkdir -p {dst} && tar -C {dst} -xf -'"),
        # What fpsync does, by hand: one rsync per top-level entry, 8 at once.
        ("xargs -P 8 rsync", f"{rig.ssh} {remote} mkdir -p {dst} && ls -A {src} | "
                             f"xargs -P 8 -I% rsync -a -e '{rig.ssh}' {src}/% {remote}:{dst}/"),
    ]


def timed(rig, cmd):
    """Wall seconds, client CPU seconds, server CPU seconds, wire bytes."""
    cpu0, wire0 = rig.server_cpu(), rig.wire_bytes()
    tf = tempfile.NamedTemporaryFile("r", delete=False)
    t0 = time.monotonic()
    p = sh(f"{IN_CLIENT} /usr/bin/time -o {tf.name} -f '%U %S' sh -c \"{cmd.replace(chr(34), chr(92) + chr(34))}\" && sync",
           check=False)
    wall = time.monotonic() - t0
    time.sleep(0.3)  # the server's session processes are reaped
    u, s = (float(x) for x in open(tf.name).read().split()[-2:])
    os.unlink(tf.name)
    return p.returncode, wall, u + s, rig.server_cpu() - cpu0, rig.wire_bytes() - wire0


def tree_size(path):
    n = b = 0
    for root, _, files in os.walk(path):
        for f in files:
            n += 1
            b += os.lstat(os.path.join(root, f)).st_size
    return n, b


def changed_huge(rig, scratch, data, repeat):
    """A 2 GiB file with 1% of it changed (20 regions of 1 MiB, spread),
    onto DST holding the old version: the bytes on the wire."""
    src = os.path.join(data, "net-huge")
    rows = []
    for tool, cmd in [t for t in tools(rig, src, bench.MNT + "/dst") if t[0] in ("sluice", "rsync -a")]:
        for _ in range(repeat):
            scratch.fresh()
            sh(f"cp -a {src} {bench.MNT}/dst && sync")
            work = os.path.join(data, "net-huge-changed")
            sh(f"rm -rf {work} && cp -a {src} {work}")
            f = os.path.join(work, os.listdir(work)[0])
            size = os.path.getsize(f)
            with open(f, "r+b") as fh:
                for i in range(20):
                    fh.seek(i * (size // 20) + 12345)
                    fh.write(os.urandom(1 << 20))
            bench.drop_caches()
            code, wall, ccpu, scpu, wire = timed(rig, cmd.replace(src, work))
            rows.append({"tool": tool, "ok": code == 0, "seconds": wall, "client_cpu": ccpu,
                         "server_cpu": scpu, "wire_bytes": wire, "file_bytes": size})
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="dense,mixed,huge")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data", default="/work/bench-data")
    ap.add_argument("--tools", help="comma-separated subset, e.g. 'sluice,rsync -a'")
    ap.add_argument("--link", type=int, help="shape the link to this many Mbit/s")
    ap.add_argument("--per-flow", type=int, help="...and each TCP connection to this many")
    ap.add_argument("--delay", type=int, help="add this many ms to each round trip")
    a = ap.parse_args()
    bench.need_root("net.py")
    rig = Rig()
    shaped = None
    if a.delay:
        rig.delay(a.delay)
    if a.link or a.delay:
        if a.link:
            rig.shape(a.link, a.per_flow or a.link)
        shaped = {"link_mbit": a.link, "per_flow_mbit": a.per_flow or a.link,
                  "delay_ms": a.delay or 0,
                  "iperf3_P1_mbit": rig.iperf(1), "iperf3_P8_mbit": rig.iperf(8)}
    scratch = bench.Scratch("/work/bench-data/net-dst.img", 12)
    results = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
               "machine": f"{platform.node()} {os.cpu_count()} cores, {platform.release()}",
               "sluice": sh(f"{SLUICE} --version", capture_output=True).stdout.strip(),
               "shapes": {}, "shaped": shaped}
    try:
        for shape in a.shapes.split(","):
            gen, extra, words = SHAPES[shape]
            src = bench.dataset(os.path.join(a.data, f"net-{shape}"), gen, extra)
            files, size = tree_size(src)
            runs = {}
            for _ in range(a.repeat):  # interleaved rounds
                for tool, cmd in tools(rig, src, bench.MNT + "/dst"):
                    if a.tools and tool not in a.tools.split(","):
                        continue
                    scratch.fresh()
                    code, wall, ccpu, scpu, wire = timed(rig, cmd)
                    got = tree_size(bench.MNT + "/dst") if code == 0 else (0, 0)
                    ok = code == 0 and got == (files, size)
                    print(shape, tool, f"{wall:.2f}", "ok" if ok else f"FAILED {code} {got}", flush=True)
                    runs.setdefault(tool, []).append((ok, wall, ccpu, scpu, wire))
            rows = []
            for tool, rs in runs.items():
                med = statistics.median(r[1] for r in rs)
                pick = min(rs, key=lambda r: abs(r[1] - med))
                rows.append({"tool": tool, "ok": all(r[0] for r in rs), "seconds": med,
                             "all_seconds": [r[1] for r in rs], "client_cpu": pick[2],
                             "server_cpu": pick[3], "wire_bytes": pick[4]})
            results["shapes"][shape] = {"what": words, "files": files, "bytes": size, "rows": rows}
        if "huge" in a.shapes.split(",") and not shaped:
            results["changed_huge"] = changed_huge(rig, scratch, a.data, 1)
    finally:
        scratch.close()
        rig.close()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = os.path.join(HERE, "results", f"net-{stamp}")
    with open(out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(report(results))
    print(report(results))


def report(r):
    lines = [f"# sluice over ssh, {r['date']}", "",
             f"Machine: {r['machine']}; {r['sluice']}. Client and server are two network namespaces "
             "on this machine joined by an unshaped veth pair, so both share its 2 cores; each tool "
             "pushes this host's tree to the server's DST (fresh ext4 on a loop device, cold cache, "
             "final sync). CPU is user+system seconds; wire is bytes both ways on the veth.", ""]
    if r.get("shaped"):
        s = r["shaped"]
        p1, p8 = s["iperf3_P1_mbit"] or 0, s["iperf3_P8_mbit"] or 0
        delay = (f"{s['delay_ms']} ms added to each round trip by bench/delayline.py (a TUN "
                 "device in the client's namespace; netem is not in this kernel), path MTU 65000"
                 if s.get("delay_ms") else "no delay added (netem is not in this kernel)")
        link = (f"{s['link_mbit']} Mbit/s in all, each TCP connection at most "
                f"{s['per_flow_mbit']} Mbit/s" if s.get("link_mbit") else "no rate limit")
        lines += [f"Shaped (HTB on the client's side): {link}; {delay}. "
                  f"iperf3 in the same run: -P 1 {p1:.0f} Mbit/s, -P 8 "
                  f"{p8:.0f} Mbit/s. The MB/s column against the -P 8 figure "
                  f"({p8 / 8:.0f} MB/s) is the share of the link a tool used.", ""]
    for shape, s in r["shapes"].items():
        peers = [x for x in s["rows"] if not x["tool"].startswith("sluice") and x["ok"]]
        best = {p["tool"]: p["seconds"] for p in peers}
        rsync = best.get("rsync -a")
        lines += [f"## {shape}: {s['what']} ({s['files']} files, {s['bytes'] / 2**20:.0f} MiB)", "",
                  "| tool | median s | all runs s | MB/s | client CPU s | server CPU s | wire MiB | vs rsync |",
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        for x in sorted(s["rows"], key=lambda x: x["seconds"]):
            flag = "" if x["ok"] else " (FAILED)"
            ratio = f"{rsync / x['seconds']:.2f}x" if rsync else "-"
            runs = ", ".join(f"{v:.1f}" for v in x["all_seconds"])
            lines.append(f"| {x['tool']}{flag} | {x['seconds']:.2f} | {runs} | "
                         f"{s['bytes'] / x['seconds'] / 1e6:.0f} | {x['client_cpu']:.1f} | "
                         f"{x['server_cpu']:.1f} | {x['wire_bytes'] / 2**20:.0f} | {ratio} |")
        lines.append("")
    if r.get("changed_huge"):
        lines += ["## huge, 1% changed (20 regions of 1 MiB), onto the old version", "",
                  "| tool | s | wire MiB | wire / file size | client CPU s | server CPU s |",
                  "|---|---:|---:|---:|---:|---:|"]
        for x in r["changed_huge"]:
            lines.append(f"| {x['tool']}{'' if x['ok'] else ' (FAILED)'} | {x['seconds']:.2f} | "
                         f"{x['wire_bytes'] / 2**20:.1f} | {100 * x['wire_bytes'] / x['file_bytes']:.2f}% | "
                         f"{x['client_cpu']:.1f} | {x['server_cpu']:.1f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
