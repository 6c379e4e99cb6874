//! [`NetLab`]: brokers in their own Linux network namespaces, cut apart by firewall rules, as
//! Jepsen partitions its nodes. The [`crate::Proxy`] can only fault links a test routes through
//! it; here the kernel drops the packets, so every connection between two hosts is cut, the
//! client's and the brokers' own alike, and a cut can be one-way.
//!
//! Layout of one lab (`P` = the test's pid, `N` = the lab's number in the process, `O` = a
//! third octet claimed for the lab's life):
//!
//! ```text
//!   test process (its own namespace, "the tester")       namespace hvP-N-br
//!     link hvPtN  10.200.O.254/24  ---- veth ----  tester ─┐
//!                                                          br0 (bridge)
//!   namespace hvP-N-0:  eth0 10.200.O.1/24  --- veth ---  h0 ─┤
//!   namespace hvP-N-1:  eth0 10.200.O.2/24  --- veth ---  h1 ─┘ ...
//! ```
//!
//! The bridge lives in a namespace of its own rather than in the tester's: the tester's
//! namespace is the machine's (or the CI container's) real one, where a host firewall,
//! Docker's FORWARD policy or `br_netfilter` could filter bridged traffic and make the lab
//! behave differently from machine to machine; and deleting that one namespace removes the
//! bridge and every port on it at once. The tester's namespace gets only one veth and one
//! address, so the test process reaches every broker directly (no proxy, no `ip netns exec`).
//!
//! Cuts are drop rules in the *host* namespaces (table `inet haven_netlab`, or the `INPUT` /
//! `OUTPUT` chains with iptables), never in the tester's: the lab never touches the real
//! namespace's firewall. Packets from X to host H are dropped in H's input hook; packets from
//! host H to the tester in H's output hook.
//!
//! Contract: drop every [`crate::BrokerProcess`] started in a lab before the lab (declare the
//! lab first). Dropping the lab deletes the tester's link and every namespace it made; a
//! process still inside a namespace keeps it alive (unnamed, unreachable) until it exits.
//! Namespaces left by a crashed run (named `hv<pid>-...` with that pid dead) are deleted by the
//! next lab. Every command is bounded by [`COMMAND_TIMEOUT_MS`].

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::error::io;
use crate::{BrokerOpts, TestkitError};

/// Bound on each `ip` / `nft` / `iptables` / `tc` command.
pub const COMMAND_TIMEOUT_MS: u64 = 10_000;
/// Hosts per lab: `.1` to `.253` of the lab's /24 (`.254` is the tester).
pub const HOSTS_PER_LAB_MAX: usize = 253;
/// The port every broker in a lab listens on (each host has its own address).
pub const STOMP_PORT: u16 = 61613;
/// Bytes kept of a command's stdout and of its stderr.
const COMMAND_OUTPUT_BYTES_MAX: usize = 64 * 1024;
/// Linux interface names are at most 15 bytes (IFNAMSIZ - 1).
const IFNAME_BYTES_MAX: usize = 15;
/// Third octets of 10.200.0.0/16 a lab may claim.
const SUBNET_OCTETS: std::ops::RangeInclusive<u8> = 1..=254;
/// One lock file per claimed subnet: `flock` is released by the kernel when the owner dies,
/// so a crashed run never leaves a subnet claimed.
const SUBNET_LOCK_DIR: &str = "/run/haven-netlab";
/// Pause between datagrams in [`NetLab::reaches`]; the first may wait on ARP.
const PROBE_INTERVAL_MS: u64 = 50;
const NFT_TABLE: &str = "haven_netlab";
/// Names the firewall [`NetLab::new`] uses, overriding detection.
const FIREWALL_ENV: &str = "HAVEN_NETLAB_FIREWALL";
const NFT_SETUP: &str = "table inet haven_netlab {
    chain input { type filter hook input priority 0; policy accept; }
    chain output { type filter hook output priority 0; policy accept; }
}
";

/// Labs made by this process; the number is part of every name, so labs in parallel tests
/// never share one. 0 is reserved for [`NetLab::available`]'s probe.
static LABS: AtomicU32 = AtomicU32::new(0);
static PROBES: AtomicU32 = AtomicU32::new(0);

/// A host of a lab, as returned by [`NetLab::add_host`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostId(usize);

impl HostId {
    pub fn index(self) -> usize {
        self.0
    }
}

/// One end of a cut: a host, or the test process (the tester) in its own namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Peer {
    Host(HostId),
    Tester,
}

impl From<HostId> for Peer {
    fn from(host: HostId) -> Peer {
        Peer::Host(host)
    }
}

/// How cuts are made inside the host namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Firewall {
    Nft,
    Iptables,
}

impl Firewall {
    /// `nft` if it runs, else `iptables`, else `None`.
    pub fn detect() -> Option<Firewall> {
        if tool_runs(&["nft", "--version"]) {
            Some(Firewall::Nft)
        } else if tool_runs(&["iptables", "--version"]) {
            Some(Firewall::Iptables)
        } else {
            None
        }
    }
}

#[derive(Debug)]
struct Host {
    namespace: String,
    addr: Ipv4Addr,
}

/// A set of network namespaces on one bridge, for one test. See the module documentation.
#[derive(Debug)]
pub struct NetLab {
    /// `hv<pid>-<n>`; every namespace of the lab is `<prefix>-<something>`.
    prefix: String,
    octet: u8,
    /// Held (flock) for the lab's life; the kernel releases it if the process dies.
    _subnet_lock: File,
    bridge_namespace: String,
    /// The tester's end of its veth, in the tester's namespace.
    tester_link: String,
    hosts: Vec<Host>,
    firewall: Firewall,
    /// Every namespace created, in order, for `Drop`.
    namespaces: Vec<String>,
    /// Cuts in force, as `(from, to)`.
    cuts: Vec<(Peer, Peer)>,
}

impl NetLab {
    /// Whether labs can be made here: root, `ip`, `nft` or `iptables`, and a namespace that
    /// can be added and given a firewall table. `Err` is the reason, for a `SKIPPED:` line.
    pub fn available() -> Result<(), String> {
        // SAFETY: geteuid(2) has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        if uid != 0 {
            return Err(format!(
                "network namespaces need root (running as uid {uid})"
            ));
        }
        if !tool_runs(&["ip", "-V"]) {
            return Err("`ip` not found (Debian package iproute2)".into());
        }
        let firewall = chosen_firewall()?;
        let probe = format!(
            "hv{}-0-probe{}",
            std::process::id(),
            PROBES.fetch_add(1, Ordering::Relaxed)
        );
        run(&["ip", "netns", "add", &probe]).map_err(|e| format!("`ip netns add` refused: {e}"))?;
        let setup = firewall_setup(firewall, &probe);
        let deleted = run(&["ip", "netns", "del", &probe]);
        setup.map_err(|e| format!("no firewall inside a network namespace: {e}"))?;
        deleted.map_err(|e| format!("`ip netns del` refused: {e}"))?;
        Ok(())
    }

    /// `None` when labs can be made. Otherwise the reason to skip, except that under CI
    /// (`CI=true`) as root, where the tests must run, it panics: a lab that cannot be made
    /// there is a broken CI image, not a reason to skip.
    pub fn skip_reason() -> Option<String> {
        let reason = NetLab::available().err()?;
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        // SAFETY: as in `available`.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            !(ci && root),
            "CI=true and running as root: the network-namespace tests must run, but {reason}"
        );
        Some(reason)
    }

    /// A lab for test `test`, or `None` after printing `SKIPPED: <test>: <reason>` where labs
    /// cannot be made (and panicking where they must: see [`NetLab::skip_reason`]).
    pub fn for_test(test: &str) -> Option<NetLab> {
        if let Some(reason) = NetLab::skip_reason() {
            eprintln!("SKIPPED: {test}: {reason}");
            return None;
        }
        let lab = NetLab::new().expect("network lab");
        eprintln!("{test}: lab {} ({:?})", lab.prefix(), lab.firewall());
        Some(lab)
    }

    /// A lab with no hosts yet. Its firewall is the one named by `HAVEN_NETLAB_FIREWALL`
    /// (`nft` or `iptables`, so CI can exercise both), else nft if present, else iptables.
    pub fn new() -> Result<NetLab, TestkitError> {
        let firewall = chosen_firewall().map_err(|reason| TestkitError::Unsupported {
            what: "a network lab".into(),
            reason,
        })?;
        NetLab::with_firewall(firewall)
    }

    pub fn with_firewall(firewall: Firewall) -> Result<NetLab, TestkitError> {
        remove_stale_namespaces()?;
        let pid = std::process::id();
        let n = LABS.fetch_add(1, Ordering::Relaxed) + 1;
        let prefix = format!("hv{pid}-{n}");
        let tester_link = format!("hv{pid}t{n}");
        assert!(
            tester_link.len() <= IFNAME_BYTES_MAX,
            "interface name {tester_link} longer than {IFNAME_BYTES_MAX} bytes"
        );
        let (octet, subnet_lock) = claim_subnet()?;
        let mut lab = NetLab {
            bridge_namespace: format!("{prefix}-br"),
            prefix,
            octet,
            _subnet_lock: subnet_lock,
            tester_link,
            hosts: Vec::new(),
            firewall,
            namespaces: Vec::new(),
            cuts: Vec::new(),
        };
        // From here on `Drop` removes whatever was made, should a later step fail.
        let br = lab.bridge_namespace.clone();
        lab.add_namespace(&br)?;
        run(&["ip", "-n", &br, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &br, "link", "set", "br0", "up"])?;
        let link = lab.tester_link.clone();
        run(&[
            "ip", "link", "add", &link, "type", "veth", "peer", "name", "tester", "netns", &br,
        ])?;
        run(&[
            "ip", "-n", &br, "link", "set", "tester", "master", "br0", "up",
        ])?;
        let tester_cidr = format!("{}/24", lab.addr(Peer::Tester));
        run(&["ip", "addr", "add", &tester_cidr, "dev", &link])?;
        run(&["ip", "link", "set", &link, "up"])?;
        Ok(lab)
    }

    /// A new namespace on the bridge with the next address (`10.200.O.1` for the first), its
    /// loopback up and an empty firewall table.
    pub fn add_host(&mut self) -> Result<HostId, TestkitError> {
        let i = self.hosts.len();
        assert!(
            i < HOSTS_PER_LAB_MAX,
            "a lab holds at most {HOSTS_PER_LAB_MAX} hosts"
        );
        let namespace = format!("{}-{i}", self.prefix);
        let addr = Ipv4Addr::new(
            10,
            200,
            self.octet,
            u8::try_from(i + 1).expect("host < 254"),
        );
        self.add_namespace(&namespace)?;
        let br = self.bridge_namespace.clone();
        let port = format!("h{i}");
        run(&[
            "ip", "-n", &br, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns",
            &namespace,
        ])?;
        run(&["ip", "-n", &br, "link", "set", &port, "master", "br0", "up"])?;
        run(&["ip", "-n", &namespace, "link", "set", "lo", "up"])?;
        let cidr = format!("{addr}/24");
        run(&["ip", "-n", &namespace, "addr", "add", &cidr, "dev", "eth0"])?;
        run(&["ip", "-n", &namespace, "link", "set", "eth0", "up"])?;
        firewall_setup(self.firewall, &namespace)?;
        self.hosts.push(Host { namespace, addr });
        Ok(HostId(i))
    }

    fn add_namespace(&mut self, name: &str) -> Result<(), TestkitError> {
        run(&["ip", "netns", "add", name])?;
        self.namespaces.push(name.to_string());
        Ok(())
    }

    fn host(&self, host: HostId) -> &Host {
        self.hosts
            .get(host.0)
            .unwrap_or_else(|| panic!("{host:?} is not a host of lab {}", self.prefix))
    }

    /// The address of a host, or the tester's (`10.200.O.254`).
    pub fn addr(&self, peer: Peer) -> Ipv4Addr {
        match peer {
            Peer::Host(h) => self.host(h).addr,
            Peer::Tester => Ipv4Addr::new(10, 200, self.octet, 254),
        }
    }

    /// Where a broker on `host` listens: `10.200.O.x:61613`.
    pub fn stomp_addr(&self, host: HostId) -> SocketAddr {
        SocketAddr::from((self.addr(Peer::Host(host)), STOMP_PORT))
    }

    /// The namespace's name, for `ip netns exec`.
    pub fn namespace(&self, host: HostId) -> &str {
        &self.host(host).namespace
    }

    /// `hv<pid>-<n>`: every namespace of this lab is named `<prefix>-...`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The tester's veth in the tester's namespace.
    pub fn tester_link(&self) -> &str {
        &self.tester_link
    }

    pub fn hosts(&self) -> Vec<HostId> {
        (0..self.hosts.len()).map(HostId).collect()
    }

    pub fn firewall(&self) -> Firewall {
        self.firewall
    }

    /// Options for a broker listening on `host`'s address, started under
    /// `ip netns exec <namespace>` (which execs, so signals reach the broker itself).
    pub fn broker_opts(
        &self,
        host: HostId,
        bin: impl Into<PathBuf>,
        data_dir: impl Into<PathBuf>,
    ) -> BrokerOpts {
        let mut opts = BrokerOpts::new(bin, data_dir, self.stomp_addr(host));
        opts.wrapper = ["ip", "netns", "exec", self.namespace(host)]
            .map(String::from)
            .to_vec();
        opts
    }

    /// Drops every packet from `from` to `to` (one way); the other direction still flows.
    /// A TCP connection across a one-way cut stalls (segments or their ACKs are lost) without
    /// being reset, like a real asymmetric partition.
    pub fn cut(&mut self, from: Peer, to: Peer) -> Result<(), TestkitError> {
        assert_ne!(from, to, "a peer cannot be cut from itself");
        let (host, hook, addr) = match (from, to) {
            // Into a host: its input hook, matching the sender.
            (_, Peer::Host(h)) => (h, Hook::Input, self.addr(from)),
            // Out of a host to the tester: the host's output hook (no rule in the tester's
            // real namespace).
            (Peer::Host(h), Peer::Tester) => (h, Hook::Output, self.addr(Peer::Tester)),
            (Peer::Tester, Peer::Tester) => unreachable!("asserted above"),
        };
        let namespace = self.host(host).namespace.clone();
        add_drop_rule(self.firewall, &namespace, hook, addr)?;
        self.cuts.push((from, to));
        Ok(())
    }

    /// Cuts `a` and `b` apart both ways.
    pub fn partition(&mut self, a: Peer, b: Peer) -> Result<(), TestkitError> {
        self.cut(a, b)?;
        self.cut(b, a)
    }

    /// Removes every cut.
    pub fn heal(&mut self) -> Result<(), TestkitError> {
        for host in &self.hosts {
            clear_rules(self.firewall, &host.namespace)?;
        }
        self.cuts.clear();
        Ok(())
    }

    /// Cuts in force, as `(from, to)`.
    pub fn cuts(&self) -> &[(Peer, Peer)] {
        &self.cuts
    }

    /// Delays (and drops a share of) every packet `host` sends, with `tc netem`.
    /// [`TestkitError::Unsupported`] when the kernel has no netem.
    pub fn impair(
        &self,
        host: HostId,
        delay_ms: u64,
        loss_percent: u8,
    ) -> Result<(), TestkitError> {
        assert!(loss_percent <= 100, "loss of {loss_percent}%");
        let namespace = self.namespace(host);
        let delay = format!("{delay_ms}ms");
        let loss = format!("{loss_percent}%");
        run(&[
            "ip", "netns", "exec", namespace, "tc", "qdisc", "replace", "dev", "eth0", "root",
            "netem", "delay", &delay, "loss", &loss,
        ])
        .map_err(|e| match e {
            TestkitError::Command { stderr, .. } if stderr.contains("unknown") => {
                TestkitError::Unsupported {
                    what: "tc netem".into(),
                    reason: stderr.trim().to_string(),
                }
            }
            e => e,
        })
        .map(drop)
    }

    /// Removes what [`NetLab::impair`] set on `host`.
    pub fn clear_impairment(&self, host: HostId) -> Result<(), TestkitError> {
        let namespace = self.namespace(host);
        run(&[
            "ip", "netns", "exec", namespace, "tc", "qdisc", "del", "dev", "eth0", "root",
        ])
        .map(drop)
    }

    /// Whether a UDP datagram from `from` reaches `to` within `timeout_ms` (several are sent;
    /// the first may wait on ARP). Checks one direction only, so it tells a one-way cut from a
    /// two-way one; a TCP probe could not.
    pub fn reaches(&self, from: Peer, to: Peer, timeout_ms: u64) -> Result<bool, TestkitError> {
        let (from_addr, to_addr) = (self.addr(from), self.addr(to));
        let receiver = in_namespace(self.namespace_of(to), move || {
            let socket = UdpSocket::bind((to_addr, 0))?;
            socket.set_read_timeout(Some(Duration::from_millis(PROBE_INTERVAL_MS)))?;
            Ok(socket)
        })?;
        let target = receiver.local_addr().map_err(io("probe local_addr"))?;
        let sender = in_namespace(self.namespace_of(from), move || {
            UdpSocket::bind((from_addr, 0))
        })?;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let mut buf = [0u8; 64];
        loop {
            match sender.send_to(b"haven-netlab-probe", target) {
                Ok(_) => {}
                // A drop rule in the sender's output hook refuses the send outright.
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
                Err(e) => return Err(io(format!("probe {from_addr} -> {target}"))(e)),
            }
            match receiver.recv_from(&mut buf) {
                Ok((_, source)) => {
                    // Only the lab's own sender binds to `from_addr`.
                    assert_eq!(source.ip(), from_addr, "probe from an unexpected sender");
                    return Ok(true);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(io(format!("probe recv at {target}"))(e)),
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }

    fn namespace_of(&self, peer: Peer) -> Option<String> {
        match peer {
            Peer::Host(h) => Some(self.host(h).namespace.clone()),
            Peer::Tester => None,
        }
    }

    /// Names of every network namespace on the machine (`ip netns list`).
    pub fn existing_namespaces() -> Result<Vec<String>, TestkitError> {
        let list = run(&["ip", "netns", "list"])?;
        // Lines are `NAME` or `NAME (id: N)`.
        Ok(list
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(String::from)
            .collect())
    }

    /// Whether an interface of this name exists in the tester's namespace.
    pub fn tester_link_exists(name: &str) -> bool {
        // /sys/class/net shows the devices of the namespace /sys was mounted in: the tester's.
        Path::new("/sys/class/net").join(name).exists()
    }
}

impl Drop for NetLab {
    fn drop(&mut self) {
        // The tester's veth first, explicitly: the kernel tears a deleted namespace's devices
        // down asynchronously, so relying on the bridge namespace's deletion would leave the
        // link visible for a moment after drop.
        if NetLab::tester_link_exists(&self.tester_link) {
            if let Err(e) = run(&["ip", "link", "del", &self.tester_link]) {
                eprintln!("netlab {}: {e}", self.prefix);
            }
        }
        for namespace in self.namespaces.iter().rev() {
            if let Err(e) = run(&["ip", "netns", "del", namespace]) {
                eprintln!("netlab {}: {e}", self.prefix);
            }
        }
    }
}

/// The firewall named by `HAVEN_NETLAB_FIREWALL`, if it runs; else the detected one.
fn chosen_firewall() -> Result<Firewall, String> {
    let (firewall, tool) = match std::env::var(FIREWALL_ENV).ok().as_deref() {
        None | Some("") => {
            return Firewall::detect().ok_or_else(|| {
                "neither `nft` (Debian package nftables) nor `iptables` found".to_string()
            })
        }
        Some("nft") => (Firewall::Nft, "nft"),
        Some("iptables") => (Firewall::Iptables, "iptables"),
        Some(other) => return Err(format!("{FIREWALL_ENV}={other}: expected nft or iptables")),
    };
    if !tool_runs(&[tool, "--version"]) {
        return Err(format!("{FIREWALL_ENV}={tool} but `{tool}` does not run"));
    }
    Ok(firewall)
}

#[derive(Debug, Clone, Copy)]
enum Hook {
    Input,
    Output,
}

fn firewall_setup(firewall: Firewall, namespace: &str) -> Result<(), TestkitError> {
    match firewall {
        Firewall::Nft => run_with_input(
            &["ip", "netns", "exec", namespace, "nft", "-f", "-"],
            Some(NFT_SETUP),
        )
        .map(drop),
        // A new namespace's INPUT and OUTPUT chains exist and accept; list them to make sure
        // iptables works in there at all.
        Firewall::Iptables => run(&[
            "ip", "netns", "exec", namespace, "iptables", "-w", "5", "-L",
        ])
        .map(drop),
    }
}

fn add_drop_rule(
    firewall: Firewall,
    namespace: &str,
    hook: Hook,
    addr: Ipv4Addr,
) -> Result<(), TestkitError> {
    let addr = addr.to_string();
    let exec = ["ip", "netns", "exec", namespace];
    match (firewall, hook) {
        (Firewall::Nft, Hook::Input) => run(&[
            &exec[..],
            &[
                "nft", "add", "rule", "inet", NFT_TABLE, "input", "ip", "saddr", &addr, "drop",
            ],
        ]
        .concat()),
        (Firewall::Nft, Hook::Output) => run(&[
            &exec[..],
            &[
                "nft", "add", "rule", "inet", NFT_TABLE, "output", "ip", "daddr", &addr, "drop",
            ],
        ]
        .concat()),
        (Firewall::Iptables, Hook::Input) => run(&[
            &exec[..],
            &[
                "iptables", "-w", "5", "-A", "INPUT", "-s", &addr, "-j", "DROP",
            ],
        ]
        .concat()),
        (Firewall::Iptables, Hook::Output) => run(&[
            &exec[..],
            &[
                "iptables", "-w", "5", "-A", "OUTPUT", "-d", &addr, "-j", "DROP",
            ],
        ]
        .concat()),
    }
    .map(drop)
}

fn clear_rules(firewall: Firewall, namespace: &str) -> Result<(), TestkitError> {
    let exec = ["ip", "netns", "exec", namespace];
    match firewall {
        // Flushing a table empties its chains and keeps them.
        Firewall::Nft => {
            run(&[&exec[..], &["nft", "flush", "table", "inet", NFT_TABLE]].concat()).map(drop)
        }
        Firewall::Iptables => {
            run(&[&exec[..], &["iptables", "-w", "5", "-F", "INPUT"]].concat())?;
            run(&[&exec[..], &["iptables", "-w", "5", "-F", "OUTPUT"]].concat()).map(drop)
        }
    }
}

/// Claims a free `10.200.O.0/24`: its lock file, and no address of it in the tester's
/// namespace (someone else's network there would make routes ambiguous).
fn claim_subnet() -> Result<(u8, File), TestkitError> {
    std::fs::create_dir_all(SUBNET_LOCK_DIR).map_err(io(format!("create {SUBNET_LOCK_DIR}")))?;
    // Start at a pid-dependent octet so parallel processes rarely contend for the same lock.
    let span = SUBNET_OCTETS.len();
    let start = std::process::id() as usize % span;
    for i in 0..span {
        let octet = *SUBNET_OCTETS.start() + u8::try_from((start + i) % span).expect("< 254");
        let path = Path::new(SUBNET_LOCK_DIR).join(format!("10.200.{octet}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(format!("open {}", path.display())))?;
        // SAFETY: flock(2) on a descriptor we own; no memory is shared with the kernel.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            continue; // Another lab (this process or another) holds it.
        }
        let cidr = format!("10.200.{octet}.0/24");
        if run(&["ip", "-4", "-o", "addr", "show", "to", &cidr])?
            .trim()
            .is_empty()
        {
            return Ok((octet, file));
        }
    }
    Err(TestkitError::SubnetsExhausted { tried: span })
}

/// Deletes namespaces named `hv<pid>-<n>-...` whose pid is dead: left by a run that crashed
/// or was killed before its labs were dropped, together with the brokers that run still had
/// in them (orphans: nothing else would ever stop them, and they would keep the namespace
/// alive after its name is gone). If the pid was reused meanwhile they stay until a later
/// run; they hold no addresses in the tester's namespace, so they harm no one.
fn remove_stale_namespaces() -> Result<Vec<String>, TestkitError> {
    let own = std::process::id();
    let mut removed = Vec::new();
    for name in NetLab::existing_namespaces()? {
        let Some(pid) = lab_pid(&name) else { continue };
        if pid != own && !Path::new(&format!("/proc/{pid}")).exists() {
            kill_processes_in(&name)?;
            match run(&["ip", "netns", "del", &name]) {
                Ok(_) => removed.push(name),
                // Another lab starting at the same moment may have removed it first.
                Err(_) if !Path::new("/run/netns").join(&name).exists() => {}
                Err(e) => return Err(e),
            }
        }
    }
    if !removed.is_empty() {
        eprintln!("netlab: removed stale namespaces {removed:?}");
    }
    Ok(removed)
}

/// SIGKILLs every process inside namespace `name` (`ip netns pids`), then waits (bounded)
/// for them to be gone.
fn kill_processes_in(name: &str) -> Result<(), TestkitError> {
    let pids: Vec<libc::pid_t> = match run(&["ip", "netns", "pids", name]) {
        Ok(out) => out
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect(),
        // Removed meanwhile by another lab.
        Err(_) if !Path::new("/run/netns").join(name).exists() => return Ok(()),
        Err(e) => return Err(e),
    };
    for &pid in &pids {
        assert!(pid > 1, "namespace {name} lists pid {pid}");
        eprintln!("netlab: killing pid {pid}, left in stale namespace {name}");
        // SAFETY: kill(2) has no memory-safety preconditions. The pid was just listed inside
        // a namespace only this harness creates; one that exited meanwhile gives ESRCH.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let deadline = Instant::now() + Duration::from_millis(COMMAND_TIMEOUT_MS);
    while !pids.iter().all(|&pid| process_gone(pid)) {
        if Instant::now() >= deadline {
            return Err(TestkitError::CommandTimeout {
                command: format!("kill -9 of {pids:?} in {name}"),
                ms: COMMAND_TIMEOUT_MS,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// No such process, or a zombie: it has stopped running and holds no namespace; reaping it
/// is its new parent's business (often an init that reaps lazily).
fn process_gone(pid: libc::pid_t) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S ...`: the state follows the last ')' (comm may contain one).
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// The pid in a lab namespace's name `hv<pid>-<n>-<rest>`; `None` for any other name.
fn lab_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("hv")?;
    let (pid, rest) = rest.split_once('-')?;
    let (n, tail) = rest.split_once('-')?;
    n.parse::<u32>().ok()?;
    if tail.is_empty() {
        return None;
    }
    pid.parse().ok()
}

/// Runs `f` on a thread that first enters network namespace `namespace` (`None`: stays in
/// the tester's). Sockets made there stay in that namespace when used from any thread. A
/// scoped thread, not a pool's: a thread that changed namespace must not be reused.
fn in_namespace<T: Send>(
    namespace: Option<String>,
    f: impl FnOnce() -> std::io::Result<T> + Send,
) -> Result<T, TestkitError> {
    let what = format!("in namespace {namespace:?}");
    std::thread::scope(|s| {
        s.spawn(|| {
            if let Some(ns) = &namespace {
                let file = File::open(format!("/run/netns/{ns}"))?;
                // SAFETY: setns(2) on a descriptor we own; it changes only this thread's
                // network namespace, and this thread ends when `f` returns.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            f()
        })
        .join()
        .expect("namespace thread panicked")
    })
    .map_err(io(what))
}

fn tool_runs(argv: &[&str]) -> bool {
    run(argv).is_ok()
}

fn run(argv: &[&str]) -> Result<String, TestkitError> {
    run_bounded(argv, None, COMMAND_TIMEOUT_MS)
}

fn run_with_input(argv: &[&str], input: Option<&str>) -> Result<String, TestkitError> {
    run_bounded(argv, input, COMMAND_TIMEOUT_MS)
}

/// Runs `argv` with `input` on stdin (small: written before the output is read), waits at
/// most `timeout_ms` and returns stdout. A non-zero exit is [`TestkitError::Command`] with
/// stderr; a hang is killed and [`TestkitError::CommandTimeout`].
fn run_bounded(
    argv: &[&str],
    input: Option<&str>,
    timeout_ms: u64,
) -> Result<String, TestkitError> {
    let (program, args) = argv.split_first().expect("a command");
    let command = argv.join(" ");
    let mut child = Command::new(program)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!("spawn `{command}`")))?;
    if let Some(text) = input {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        stdin
            .write_all(text.as_bytes())
            .map_err(io(format!("stdin of `{command}`")))?;
        // Dropping `stdin` closes it: the command sees end of input.
    }
    let stdout = read_bounded(child.stdout.take().expect("stdout is piped"));
    let stderr = read_bounded(child.stderr.take().expect("stderr is piped"));
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(io(format!("wait for `{command}`")))?
        {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TestkitError::CommandTimeout {
                command,
                ms: timeout_ms,
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    if !status.success() {
        return Err(TestkitError::Command {
            command,
            status,
            stderr,
        });
    }
    Ok(stdout)
}

/// Reads a pipe to its end on a thread (so a chatty command never blocks on a full pipe),
/// keeping the first [`COMMAND_OUTPUT_BYTES_MAX`] bytes.
fn read_bounded(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut chunk = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            let room = COMMAND_OUTPUT_BYTES_MAX - kept.len();
            kept.extend_from_slice(&chunk[..n.min(room)]);
        }
        String::from_utf8_lossy(&kept).into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_names_are_recognised_and_nothing_else() {
        assert_eq!(lab_pid("hv123-4-0"), Some(123));
        assert_eq!(lab_pid("hv123-4-br"), Some(123));
        assert_eq!(lab_pid("hv123-0-probe7"), Some(123));
        for other in [
            "hv123-4",
            "hv123-x-0",
            "hvx-4-0",
            "docker-1-2",
            "hv123-4-",
            "h123-4-0",
        ] {
            assert_eq!(lab_pid(other), None, "{other}");
        }
    }

    #[test]
    fn commands_report_failure_and_output() {
        assert_eq!(run(&["echo", "hi"]).unwrap(), "hi\n");
        let input = run_with_input(&["cat"], Some("in\n")).unwrap();
        assert_eq!(input, "in\n");
        match run(&["sh", "-c", "echo oops >&2; exit 3"]) {
            Err(TestkitError::Command { stderr, status, .. }) => {
                assert_eq!(stderr, "oops\n");
                assert_eq!(status.code(), Some(3));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            run(&["/nonexistent-haven-tool"]),
            Err(TestkitError::Io { .. })
        ));
    }

    #[test]
    fn a_hung_command_is_killed_at_its_bound() {
        let start = Instant::now();
        match run_bounded(&["sleep", "30"], None, 200) {
            Err(TestkitError::CommandTimeout { ms: 200, .. }) => {}
            other => panic!("{other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }
}
