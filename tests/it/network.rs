//! Over a real network and a real sshd: two network namespaces joined by
//! a veth pair, an OpenSSH server with throwaway keys in one, sluice run
//! in the other through the system `ssh` (as root; nothing leaves the
//! namespaces this makes). The binary is reached at the same path on
//! both "hosts", since namespaces share the file system.

use crate::common::*;
use std::fs;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;

/// Two namespaces, a veth pair between them, and sshd in the server's.
struct SshRig {
    client_ns: String,
    server_ns: String,
    client_if: String,
    server_if: String,
    server_addr: String,
    sshd: Child,
    dir: tempfile::TempDir,
}

impl SshRig {
    /// `None` when not root or sshd is not installed (`.ci/run` installs
    /// it and runs the tests as root).
    fn new() -> Option<SshRig> {
        if !is_root() || !Path::new("/usr/sbin/sshd").exists() || !have("ip") {
            eprintln!("not root, or no sshd or ip: the network tests need both");
            return None;
        }
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Relaxed);
        let tag = format!("{}{}", std::process::id() % 10000, n);
        let (client_ns, server_ns) = (format!("slc{tag}"), format!("sls{tag}"));
        let (client_if, server_if) = (format!("slc{tag}"), format!("sls{tag}"));
        let net = 100 + (std::process::id() % 100) as u8 + n as u8;
        let (client_addr, server_addr) = (format!("10.{net}.0.1"), format!("10.{net}.0.2"));
        let sh = |cmd: &str| {
            let ok = Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .status()
                .unwrap()
                .success();
            assert!(ok, "rig: {cmd}");
        };
        sh(&format!(
            "ip netns add {client_ns} && ip netns add {server_ns}"
        ));
        sh(&format!(
            "ip link add {client_if} type veth peer name {server_if} && \
             ip link set {client_if} netns {client_ns} && ip link set {server_if} netns {server_ns}"
        ));
        for (ns, ifc, addr) in [
            (&client_ns, &client_if, &client_addr),
            (&server_ns, &server_if, &server_addr),
        ] {
            sh(&format!(
                "ip -n {ns} addr add {addr}/24 dev {ifc} && ip -n {ns} link set {ifc} up && \
                 ip -n {ns} link set lo up"
            ));
        }
        let dir = disk_dir("ssh-rig");
        let d = dir.path().to_path_buf();
        let d = d.as_path();
        sh(&format!(
            "ssh-keygen -q -t ed25519 -N '' -f {0}/host && ssh-keygen -q -t ed25519 -N '' -f {0}/id \
             && cp {0}/id.pub {0}/authorized_keys && mkdir -p /run/sshd",
            d.display()
        ));
        fs::write(
            d.join("sshd_config"),
            format!(
                "ListenAddress {server_addr}\nHostKey {0}/host\nAuthorizedKeysFile {0}/authorized_keys\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\n\
                 StrictModes no\nPidFile {0}/sshd.pid\nClientAliveInterval 1\nClientAliveCountMax 3\n",
                d.display()
            ),
        )
        .unwrap();
        let sshd = Command::new("ip")
            .args([
                "netns",
                "exec",
                &server_ns,
                "/usr/sbin/sshd",
                "-D",
                "-e",
                "-f",
            ])
            .arg(d.join("sshd_config"))
            .stderr(fs::File::create(d.join("sshd.log")).unwrap())
            .spawn()
            .unwrap();
        let rig = SshRig {
            client_ns,
            server_ns,
            client_if,
            server_if,
            server_addr,
            sshd,
            dir,
        };
        // Ready once a login works.
        let up = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            rig.client(&rig.ssh_words())
                .arg(&rig.server_addr)
                .arg("true")
                .status()
                .unwrap()
                .success()
        });
        assert!(
            up,
            "sshd did not come up: {}",
            fs::read_to_string(d.join("sshd.log")).unwrap_or_default()
        );
        Some(rig)
    }

    /// The ssh command, with throwaway keys, and keepalives so a cut link
    /// is noticed within seconds.
    fn ssh_words(&self) -> Vec<String> {
        let d = self.dir.path().display();
        format!(
            "ssh -i {d}/id -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
             -o BatchMode=yes -o LogLevel=ERROR -o ServerAliveInterval=1 -o ServerAliveCountMax=3"
        )
        .split(' ')
        .map(str::to_string)
        .collect()
    }

    /// A command run in the client's namespace.
    fn client(&self, words: &[String]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.client_ns]).args(words);
        c
    }

    /// `sluice ARGS` in the client's namespace, reaching the server with
    /// the rig's ssh; `remote(path)` names a path on the server.
    fn sluice(&self, args: &[&str]) -> Command {
        let mut c = self.client(&[env!("CARGO_BIN_EXE_sluice").to_string()]);
        c.env(
            "XDG_STATE_HOME",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-saved-probes"),
        )
        .args(args)
        .arg("-e")
        .arg(self.ssh_words().join(" "))
        .args([
            "--remote-path",
            env!("CARGO_BIN_EXE_sluice"),
            "--no-progress",
        ]);
        c
    }

    fn remote(&self, path: &Path) -> String {
        format!("root@{}:{}", self.server_addr, path.display())
    }

    /// Shapes what the server sends: the link at 1 Gbit/s, and each TCP
    /// connection at most `mbit` (HTB; netem and fq are not in this
    /// kernel). Connections are told apart by a hash of their port into
    /// 256 classes, so one connection cannot fill the link and several
    /// can (two may share a class now and then).
    fn cap_each_flow(&self, mbit: u32) {
        let dev = &self.server_if;
        let mut batch = format!(
            "qdisc add dev {dev} root handle 1: htb
             class add dev {dev} parent 1: classid 1:1 htb rate 1gbit
             filter add dev {dev} parent 1: prio 1 handle 2: protocol ip u32 divisor 256
             filter add dev {dev} parent 1: prio 1 protocol ip u32 ht 800::              match ip protocol 6 0xff hashkey mask 0x000000ff at 20 link 2:
"
        );
        for b in 0..256 {
            let class = 0x100 + b;
            batch += &format!(
                "class add dev {dev} parent 1:1 classid 1:{class:x} htb rate {mbit}mbit                  ceil {mbit}mbit
                 filter add dev {dev} parent 1: prio 1 protocol ip u32 ht 2:{b:x}:                  match u32 0 0 flowid 1:{class:x}
"
            );
        }
        let file = self.dir.path().join("shape.tc");
        fs::write(&file, batch).unwrap();
        assert!(run(
            "ip",
            &[
                "netns",
                "exec",
                &self.server_ns,
                "tc",
                "-batch",
                file.to_str().unwrap()
            ]
        ));
    }

    /// Lets only ssh through from the client: a host behind a firewall
    /// that takes nothing but ssh. (This kernel has no tc actions to drop
    /// with, so everything else waits in an HTB class of 8 bit/s, already
    /// a long way in debt from one big ping: a connection attempt never
    /// gets its first packet out.)
    fn only_ssh_in(&self) {
        let dev = &self.client_if;
        let batch = format!(
            "qdisc add dev {dev} root handle 1: htb default 20
             class add dev {dev} parent 1: classid 1:10 htb rate 1gbit
             class add dev {dev} parent 1: classid 1:20 htb rate 8bit ceil 8bit
             filter add dev {dev} parent 1: prio 1 protocol ip u32 match ip dport 22 0xffff flowid 1:10
             filter add dev {dev} parent 1: prio 2 protocol arp u32 match u32 0 0 flowid 1:10
"
        );
        let file = self.dir.path().join("firewall.tc");
        fs::write(&file, batch).unwrap();
        let ns = &self.client_ns;
        assert!(run(
            "ip",
            &["netns", "exec", ns, "tc", "-batch", file.to_str().unwrap()]
        ));
        let _ = Command::new("ip")
            .args([
                "netns", "exec", ns, "ping", "-c", "1", "-W", "1", "-s", "8000",
            ])
            .arg(&self.server_addr)
            .output();
    }

    fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        assert!(run(
            "ip",
            &["-n", &self.client_ns, "link", "set", &self.client_if, state]
        ));
    }
}

impl Drop for SshRig {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "pids", &self.server_ns])
            .output()
            .map(|o| {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            });
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
        for ns in [&self.client_ns, &self.server_ns] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn out(c: &mut Command) -> Output {
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

fn tree(src: &Path) {
    for i in 0..200 {
        write(
            &src.join(format!("d{}/f{i}", i % 7)),
            &bytes(1500 + i, i as u64),
        );
    }
    write(&src.join("big.bin"), &bytes(24 << 20, 1));
    std::os::unix::fs::symlink("d0/f0", src.join("link")).unwrap();
}

#[test]
fn copy_sync_and_verify_over_ssh_both_ways() {
    let Some(rig) = SshRig::new() else { return };
    let t = disk_dir("net-both");
    let (src, pulled, pushed) = (
        t.path().join("src"),
        t.path().join("pulled"),
        t.path().join("pushed"),
    );
    tree(&src);
    let args = ["--chunk-size", "4M", "--json"];
    // From the server's tree to here.
    // File data crosses the default direct TLS streams to the address
    // sshd was reached at, not the ssh channel.
    let o = out(rig
        .sluice(&["copy", &rig.remote(&src), pulled.to_str().unwrap()])
        .args(args));
    ok(&o);
    // 4 to start with; more if more carried more.
    assert!(
        summary(&o)["wire"]["data_streams"].as_u64() >= Some(4),
        "{}",
        stderr(&o)
    );
    assert_same_tree(&src, &pulled);
    // From here to the server.
    let o = out(rig
        .sluice(&["copy", src.to_str().unwrap(), &rig.remote(&pushed)])
        .args(args));
    ok(&o);
    // 4 to start with; more if more carried more.
    assert!(
        summary(&o)["wire"]["data_streams"].as_u64() >= Some(4),
        "{}",
        stderr(&o)
    );
    assert_same_tree(&src, &pushed);
    assert_no_temporaries(&pushed);
    // Reruns move nothing; verify finds them identical.
    let o = out(rig
        .sluice(&["copy", src.to_str().unwrap(), &rig.remote(&pushed)])
        .args(args));
    ok(&o);
    assert_eq!(summary(&o)["bytes_copied"], 0);
    ok(&out(&mut rig.sluice(&[
        "verify",
        &rig.remote(&src),
        pulled.to_str().unwrap(),
        "-q",
    ])));
    // sync --delete over the wire removes an extra on the far side.
    write(&pushed.join("d1/extra"), b"x");
    ok(&out(&mut rig.sluice(&[
        "sync",
        "--delete",
        "-q",
        src.to_str().unwrap(),
        &rig.remote(&pushed),
    ])));
    assert_same_tree(&src, &pushed);
}

#[test]
fn a_link_taken_down_mid_copy_stops_with_exit_2_and_the_rerun_resumes() {
    let Some(rig) = SshRig::new() else { return };
    let t = disk_dir("net-cut");
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    let size = 64u64 << 20;
    write(&src.join("big.bin"), &bytes(size as usize, 2));
    let args = ["--chunk-size", "1M", "-j", "2", "--json"];
    let child = rig
        .sluice(&[
            "copy",
            &rig.remote(&src),
            dst.to_str().unwrap(),
            "--bwlimit",
            "16MB/s",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Cut once the copy is surely under way: 8 MiB written here (a slow
    // machine may take a while to set up ssh).
    let written = |pid: u32| {
        let io = fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
        io.lines()
            .find_map(|l| l.strip_prefix("wchar: "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    let started = (0..400).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        written(child.id()) >= 8 << 20
    });
    assert!(started, "the copy never got going");
    rig.link(false);
    let cut = child.wait_with_output().unwrap();
    rig.link(true);
    assert_eq!(code(&cut), 2, "{}", stderr(&cut));
    assert!(stderr(&cut).contains("lost"), "{}", stderr(&cut));
    let before = summary(&cut)["bytes_copied"].as_u64().unwrap();
    assert!(before > 0 && before < size, "{before}");
    assert_no_partial_files(&src, &dst);
    let o = out(rig
        .sluice(&["copy", &rig.remote(&src), dst.to_str().unwrap()])
        .args(args));
    ok(&o);
    let after = summary(&o)["bytes_copied"].as_u64().unwrap();
    assert!(
        before + after <= size + (2 << 20),
        "{before} + {after} for {size}"
    );
    assert_same_tree(&src, &dst);
    assert_no_temporaries(&dst);
}

#[test]
fn paths_that_would_leave_the_far_dst_are_refused() {
    let Some(rig) = SshRig::new() else { return };
    let t = disk_dir("net-escape");
    let (src, dst, outside) = (
        t.path().join("src"),
        t.path().join("dst"),
        t.path().join("outside"),
    );
    write(&src.join("sub/f"), b"data");
    fs::create_dir_all(&outside).unwrap();
    fs::create_dir_all(&dst).unwrap();
    // An absolute symlink planted in the far DST where SRC has a directory.
    std::os::unix::fs::symlink(&outside, dst.join("sub")).unwrap();
    let o = out(&mut rig.sluice(&["copy", "-q", src.to_str().unwrap(), &rig.remote(&dst)]));
    ok(&o);
    assert!(
        fs::read_dir(&outside).unwrap().next().is_none(),
        "wrote through the symlink"
    );
    assert_eq!(fs::read(dst.join("sub/f")).unwrap(), b"data");
    // A name from the wire is one component or nothing: the far end
    // resolves every DST name with the sys layer, which refuses `/` and
    // `..` (its unit tests), so a peer cannot name its way out either.
}

#[test]
fn several_data_streams_carry_more_than_one_on_a_per_flow_capped_link() {
    let Some(rig) = SshRig::new() else { return };
    let t = disk_dir("net-shaped");
    let src = t.path().join("src");
    write(&src.join("big.bin"), &bytes(32 << 20, 7));
    rig.cap_each_flow(50);
    let timed = |streams: &str, dst: &Path| {
        let start = std::time::Instant::now();
        let o = out(rig
            .sluice(&["copy", &rig.remote(&src), dst.to_str().unwrap()])
            .args(["--streams", streams, "--chunk-size", "4M", "--json"]));
        ok(&o);
        assert_same_tree(&src, dst);
        (start.elapsed().as_secs_f64(), summary(&o))
    };
    // One connection (everything over ssh) is held to 50 Mbit/s: 32 MiB
    // take over 5 s. Four share the link's gigabit, as the file's 4 MiB
    // chunks are read by several streams at once. (What each class sent
    // is in the message, should it fail.)
    let (one, s1) = timed("0", &t.path().join("one"));
    let (four, s) = timed("4", &t.path().join("four"));
    assert_eq!(s["wire"]["data_streams"], 4, "{s}");
    assert!(one > 5.0, "one capped connection took {one:.1} s");
    // The summary names what held the one connection back: the link, not
    // either host (each says how busy it was).
    let said = s1["bottleneck"].as_str().unwrap_or_default();
    assert!(said.starts_with("bound by the link"), "{s1}");
    assert!(
        s1["wire"]["source_host"]["cpu_s"].as_f64().unwrap() > 0.0,
        "{s1}"
    );
    assert!(
        s1["wire"]["destination_host"]["cpu_s"].as_f64().unwrap() > 0.0,
        "{s1}"
    );
    let classes = out(Command::new("ip").args([
        "netns",
        "exec",
        &rig.server_ns,
        "sh",
        "-c",
        &format!(
            "tc -s class show dev {} | grep -A1 'class htb' | grep -B1 'Sent [1-9]'",
            rig.server_if
        ),
    ]));
    assert!(
        four * 2.0 < one,
        "4 streams {four:.1} s, 1 connection {one:.1} s: {}\n{s}",
        stdout(&classes)
    );
}

#[test]
fn a_data_stream_killed_mid_copy_loses_nothing_and_is_replaced() {
    let Some(rig) = SshRig::new() else { return };
    let t = disk_dir("net-kill-stream");
    let src = t.path().join("src");
    write(&src.join("big.bin"), &bytes(48 << 20, 8));
    for way in ["pull", "push"] {
        let dst = t.path().join(way);
        let (from, to) = match way {
            "pull" => (rig.remote(&src), dst.to_str().unwrap().to_string()),
            _ => (src.to_str().unwrap().to_string(), rig.remote(&dst)),
        };
        kill_a_stream_mid_copy(&rig, &from, &to, &src, &dst);
    }
}

fn kill_a_stream_mid_copy(rig: &SshRig, from: &str, to: &str, src: &Path, dst: &Path) {
    let child = rig
        .sluice(&["copy", from, to])
        .args([
            "--streams",
            "3",
            "--bwlimit",
            "16MB/s",
            "--chunk-size",
            "4M",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The client's data connections: established, to the server's
    // listener rather than to ssh's port. `ss -H` columns (with a state
    // filter): Recv-Q Send-Q Local Peer.
    let streams = || {
        let o = out(&mut rig.client(&[
            "ss".into(),
            "-tnH".into(),
            "state".into(),
            "established".into(),
        ]));
        stdout(&o)
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (local, peer) = (f.get(2)?, f.get(3)?);
                (!peer.ends_with(":22")).then(|| local.rsplit(':').next().unwrap().to_string())
            })
            .collect::<Vec<_>>()
    };
    let mut ports = Vec::new();
    let up = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(50));
        ports = streams();
        ports.len() >= 3
    });
    assert!(up, "the streams never came up: {ports:?}");
    std::thread::sleep(Duration::from_millis(700));
    // Kill one stream's socket mid-copy (the kernel aborts it).
    let o = out(&mut rig.client(&[
        "ss".into(),
        "-K".into(),
        "-tn".into(),
        "sport".into(),
        "=".into(),
        format!(":{}", ports[0]),
    ]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!(":{}", ports[0])),
        "ss killed nothing: {}",
        stdout(&o)
    );
    let o = child.wait_with_output().unwrap();
    ok(&o);
    let s = summary(&o);
    // The broken stream was replaced: the job ends with the 3 it asked for.
    assert_eq!(s["wire"]["streams_dropped"], 1, "{from} to {to}: {s}");
    // --bwlimit holds for the streams together: 48 MiB at 16 MB/s is 3.1 s.
    let took = s["elapsed_s"].as_f64().unwrap();
    assert!(took > 2.9, "{from} to {to}: 48 MiB in {took:.2} s: {s}");
    assert_eq!(s["wire"]["data_streams"], 3, "{from} to {to}: {s}");
    assert_same_tree(src, dst);
    assert_no_temporaries(dst);
}

#[test]
fn with_only_ssh_let_in_each_data_stream_gets_its_own_ssh_connection() {
    let Some(rig) = SshRig::new() else { return };
    let t = disk_dir("net-relay");
    let src = t.path().join("src");
    tree(&src);
    write(&src.join("big.bin"), &bytes(24 << 20, 9));
    rig.only_ssh_in();
    for (way, dst) in [
        ("pull", t.path().join("pulled")),
        ("push", t.path().join("pushed")),
    ] {
        let (from, to) = match way {
            "pull" => (rig.remote(&src), dst.to_str().unwrap().to_string()),
            _ => (src.to_str().unwrap().to_string(), rig.remote(&dst)),
        };
        let o = out(rig.sluice(&["copy", &from, &to]).args([
            "--streams",
            "3",
            "--chunk-size",
            "4M",
            "--json",
        ]));
        ok(&o);
        assert_same_tree(&src, &dst);
        assert_no_temporaries(&dst);
        let s = summary(&o);
        assert_eq!(s["wire"]["data_streams"], 3, "{way}: {s}\n{}", stderr(&o));
        assert!(
            stderr(&o).contains("go through their own ssh connections"),
            "{way}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn without_streams_given_the_count_grows_while_more_carry_more() {
    let Some(rig) = SshRig::new() else { return };
    let t = disk_dir("net-tune");
    let src = t.path().join("src");
    write(&src.join("big.bin"), &bytes(64 << 20, 10));
    rig.cap_each_flow(10);
    let timed = |streams: Option<&str>, dst: &Path| {
        let start = std::time::Instant::now();
        let mut c = rig.sluice(&["copy", &rig.remote(&src), dst.to_str().unwrap()]);
        c.args(["-j", "16", "--chunk-size", "2M", "--json"]);
        if let Some(n) = streams {
            c.args(["--streams", n]);
        }
        let o = out(&mut c);
        ok(&o);
        assert_same_tree(&src, dst);
        (start.elapsed().as_secs_f64(), summary(&o))
    };
    // Each connection is held to 10 Mbit/s: 4 pinned streams take about
    // 13 s for 64 MiB; left to itself the count grows past 4, and the copy
    // is done much sooner.
    let (pinned, s) = timed(Some("4"), &t.path().join("pinned"));
    assert_eq!(s["wire"]["data_streams"], 4, "{s}");
    let (tuned, s) = timed(None, &t.path().join("tuned"));
    let n = s["wire"]["data_streams"].as_u64().unwrap();
    eprintln!("tuned ({n} streams) {tuned:.1} s, 4 pinned {pinned:.1} s");
    assert!(n > 4, "the count did not grow: {s}");
    assert!(
        tuned * 1.3 < pinned,
        "tuned ({n} streams) {tuned:.1} s, 4 pinned {pinned:.1} s"
    );
}
