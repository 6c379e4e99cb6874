//! `BrokerProcess`: one `haven run` child process and the data directory it owns.
//!
//! The process is started as `BIN run --data DIR --stomp ADDR [--config FILE] EXTRA...`, with
//! stdout and stderr appended to `<parent of DIR>/<name of DIR>.log` (one file across restarts,
//! each start marked by a `=== haven-testkit start N ===` line), and counts as started only once
//! the port answers a STOMP CONNECT with CONNECTED — a listening socket alone does not mean
//! recovery has finished. Every wait is bounded.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::io;
use crate::net::stomp_connect_probe;
use crate::TestkitError;

/// Bound on start-up (spawn to CONNECTED), including journal recovery.
pub const READY_TIMEOUT_MS: u64 = 30_000;
/// Bound on a graceful stop (SIGTERM to exit) before SIGKILL.
pub const STOP_TIMEOUT_MS: u64 = 10_000;
/// Bytes of log returned in errors.
const LOG_TAIL_BYTES_MAX: u64 = 4096;

#[derive(Debug, Clone)]
pub struct BrokerOpts {
    /// The `haven` binary (`env!("CARGO_BIN_EXE_haven")` in haven-cli's tests).
    pub bin: PathBuf,
    /// Passed as `--data`; created if missing. Kept across restarts.
    pub data_dir: PathBuf,
    /// Passed as `--stomp`, e.g. `127.0.0.1:61613` from [`crate::free_addr`].
    pub stomp_addr: SocketAddr,
    /// Appended after the standard arguments.
    pub extra_args: Vec<String>,
    /// Written next to the data directory and passed as `--config` when set.
    pub config_toml: Option<String>,
    /// A command the broker is started under, e.g. `ip netns exec NS` (see
    /// [`crate::NetLab::broker_opts`]); empty: the binary is spawned directly. The wrapper must
    /// `exec` the binary in place (as `ip netns exec` does), so that the child's pid is the
    /// broker's and `kill9`, `sigstop` and `stop` hit the broker, not a parent that would leave
    /// it running. Every start checks this (`/proc/<pid>/exe` is the binary) and fails with
    /// [`TestkitError::WrapperKeptPid`] otherwise.
    pub wrapper: Vec<String>,
    /// Names the log and config files (`<name>.log` beside the data directory); `None`: the
    /// data directory's name. Brokers sharing one data directory (shared-fs master/slave) need
    /// names of their own.
    pub name: Option<String>,
}

impl BrokerOpts {
    pub fn new(
        bin: impl Into<PathBuf>,
        data_dir: impl Into<PathBuf>,
        stomp_addr: SocketAddr,
    ) -> BrokerOpts {
        BrokerOpts {
            bin: bin.into(),
            data_dir: data_dir.into(),
            stomp_addr,
            extra_args: Vec::new(),
            config_toml: None,
            wrapper: Vec::new(),
            name: None,
        }
    }
}

/// A running (or stopped, or killed) broker process. Dropping it kills the process.
#[derive(Debug)]
pub struct BrokerProcess {
    opts: BrokerOpts,
    child: Option<Child>,
    log_path: PathBuf,
    config_path: Option<PathBuf>,
    starts: u32,
}

impl BrokerProcess {
    /// Spawns the broker and waits (at most [`READY_TIMEOUT_MS`]) until it answers CONNECT.
    pub fn start(opts: BrokerOpts) -> Result<BrokerProcess, TestkitError> {
        let mut broker = BrokerProcess::start_inner(opts)?;
        broker.spawn_and_wait()?;
        Ok(broker)
    }

    fn start_inner(opts: BrokerOpts) -> Result<BrokerProcess, TestkitError> {
        std::fs::create_dir_all(&opts.data_dir)
            .map_err(io(format!("create {}", opts.data_dir.display())))?;
        let parent = opts
            .data_dir
            .parent()
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let name = opts.name.clone().unwrap_or_else(|| {
            opts.data_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "haven".to_string())
        });
        let log_path = parent.join(format!("{name}.log"));
        let config_path = match &opts.config_toml {
            Some(toml) => {
                let path = parent.join(format!("{name}.haven.toml"));
                std::fs::write(&path, toml).map_err(io(format!("write {}", path.display())))?;
                Some(path)
            }
            None => None,
        };
        Ok(BrokerProcess {
            opts,
            child: None,
            log_path,
            config_path,
            starts: 0,
        })
    }

    /// Spawns the broker without waiting for it to serve: a shared-store slave serves only
    /// once it becomes master. [`BrokerProcess::wait_ready`] waits for that.
    pub fn spawn(opts: BrokerOpts) -> Result<BrokerProcess, TestkitError> {
        let mut broker = BrokerProcess::start_inner(opts)?;
        broker.spawn_only()?;
        Ok(broker)
    }

    /// Starts the process again (after `kill9` or `stop`) without waiting for it to serve.
    pub fn respawn(&mut self) -> Result<(), TestkitError> {
        if self.is_running() {
            self.stop()?;
        }
        self.spawn_only()
    }

    /// Starts the broker again on the same data directory, address and config, stopping the
    /// current process first (gracefully) if it is still running.
    pub fn restart(&mut self) -> Result<(), TestkitError> {
        if self.is_running() {
            self.stop()?;
        }
        self.spawn_and_wait()
    }

    fn spawn_and_wait(&mut self) -> Result<(), TestkitError> {
        self.spawn_only()?;
        self.wait_ready()
    }

    fn spawn_only(&mut self) -> Result<(), TestkitError> {
        assert!(
            self.child.is_none() || !self.is_running(),
            "spawn over a running broker"
        );
        self.starts += 1;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(io(format!("open {}", self.log_path.display())))?;
        writeln!(log, "=== haven-testkit start {} ===", self.starts).map_err(io("write log"))?;
        let stderr = log.try_clone().map_err(io("clone log handle"))?;
        let mut cmd = match self.opts.wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&self.opts.bin);
                cmd
            }
            None => Command::new(&self.opts.bin),
        };
        cmd.arg("run")
            .arg("--data")
            .arg(&self.opts.data_dir)
            .arg("--stomp")
            .arg(self.opts.stomp_addr.to_string());
        if let Some(config) = &self.config_path {
            cmd.arg("--config").arg(config);
        }
        cmd.args(&self.opts.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(stderr));
        let child = cmd
            .spawn()
            .map_err(io(format!("spawn {}", self.opts.bin.display())))?;
        self.child = Some(child);
        Ok(())
    }

    /// The broker answers CONNECT, so a wrapper that execs has done so by now: the child's
    /// executable must be the broker binary itself.
    fn check_wrapper_execed(&mut self) -> Result<(), TestkitError> {
        let pid = self.child_mut()?.id();
        let exe_link = format!("/proc/{pid}/exe");
        let exe = std::fs::read_link(&exe_link).map_err(io(format!("readlink {exe_link}")))?;
        let bin = std::fs::canonicalize(&self.opts.bin)
            .map_err(io(format!("canonicalize {}", self.opts.bin.display())))?;
        // A binary rebuilt while the broker runs shows as "PATH (deleted)".
        let exe_text = exe.to_string_lossy();
        let exe_path = exe_text.strip_suffix(" (deleted)").unwrap_or(&exe_text);
        if Path::new(exe_path) != bin {
            let err = TestkitError::WrapperKeptPid {
                pid,
                exe: exe_text.into_owned(),
                bin: bin.display().to_string(),
            };
            self.kill_now();
            return Err(err);
        }
        Ok(())
    }

    /// Waits (at most [`READY_TIMEOUT_MS`]) until the broker answers CONNECT.
    pub fn wait_ready(&mut self) -> Result<(), TestkitError> {
        self.wait_ready_inner()?;
        if !self.opts.wrapper.is_empty() {
            self.check_wrapper_execed()?;
        }
        Ok(())
    }

    fn wait_ready_inner(&mut self) -> Result<(), TestkitError> {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(READY_TIMEOUT_MS);
        loop {
            if let Some(status) = self
                .child_mut()?
                .try_wait()
                .map_err(io("wait for broker"))?
            {
                self.child = None;
                return Err(TestkitError::ExitedEarly {
                    status,
                    log_tail: self.log_tail(),
                });
            }
            match stomp_connect_probe(self.opts.stomp_addr, Duration::from_millis(1000)) {
                Ok(command) if command == "CONNECTED" => return Ok(()),
                // A standby or a broker still recovering may refuse: keep waiting.
                Ok(_) | Err(_) => {}
            }
            if Instant::now() >= deadline {
                let log_tail = self.log_tail();
                self.kill_now();
                return Err(TestkitError::NotReady {
                    addr: self.opts.stomp_addr,
                    ms: READY_TIMEOUT_MS,
                    log_tail,
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn child_mut(&mut self) -> Result<&mut Child, TestkitError> {
        self.child.as_mut().ok_or(TestkitError::NotRunning)
    }

    fn signal(&mut self, signal: i32) -> Result<(), TestkitError> {
        let pid = self.child_mut()?.id();
        let pid_t = libc::pid_t::try_from(pid).expect("pid fits pid_t");
        // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own unreaped child,
        // so it cannot have been recycled for another process.
        let rc = unsafe { libc::kill(pid_t, signal) };
        if rc != 0 {
            return Err(TestkitError::Signal {
                signal,
                pid,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// `kill -9`, then reap. The data directory is left exactly as the crash left it.
    pub fn kill9(&mut self) -> Result<(), TestkitError> {
        self.signal(libc::SIGKILL)?;
        self.child_mut()?.wait().map_err(io("reap killed broker"))?;
        self.child = None;
        Ok(())
    }

    /// Freezes the process (SIGSTOP): its sockets stay open but it answers nothing. Returns
    /// once the kernel reports it stopped (state `T`), so nothing the test does next can race
    /// the last instructions the process ran.
    pub fn sigstop(&mut self) -> Result<(), TestkitError> {
        self.signal(libc::SIGSTOP)?;
        let pid = self.child_mut()?.id();
        let deadline = Instant::now() + Duration::from_millis(STOP_TIMEOUT_MS);
        loop {
            // Every thread, not just the leader: a group stop completes thread by thread.
            let mut state = None;
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map_err(io(format!("list /proc/{pid}/task")))?;
            for task in tasks.flatten() {
                let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
                // The state follows the command name, which is in parentheses.
                let s = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().next())
                    .map(str::to_string);
                if !matches!(s.as_deref(), Some("T") | Some("t")) {
                    state = Some(s);
                    break;
                }
            }
            let Some(state) = state else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                return Err(TestkitError::Signal {
                    signal: libc::SIGSTOP,
                    pid,
                    source: std::io::Error::other(format!("still in state {state:?}")),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Thaws a process frozen by [`BrokerProcess::sigstop`].
    pub fn sigcont(&mut self) -> Result<(), TestkitError> {
        self.signal(libc::SIGCONT)
    }

    /// SIGHUP: `haven run` re-reads its config file (see [`BrokerProcess::config_path`]).
    pub fn sighup(&mut self) -> Result<(), TestkitError> {
        self.signal(libc::SIGHUP)
    }

    /// SIGTERM, wait up to [`STOP_TIMEOUT_MS`], then SIGKILL. Returns how the process ended.
    pub fn stop(&mut self) -> Result<ExitStatus, TestkitError> {
        // A frozen process cannot act on SIGTERM.
        let _ = self.signal(libc::SIGCONT);
        self.signal(libc::SIGTERM)?;
        let deadline = Instant::now() + Duration::from_millis(STOP_TIMEOUT_MS);
        loop {
            if let Some(status) = self
                .child_mut()?
                .try_wait()
                .map_err(io("wait for broker"))?
            {
                self.child = None;
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.signal(libc::SIGKILL)?;
                let status = self.child_mut()?.wait().map_err(io("reap broker"))?;
                self.child = None;
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Peak resident set size of the running process since it was spawned (`VmHWM`), in bytes.
    /// Each restart is a new process, so the peak covers only the current one.
    pub fn rss_peak_bytes(&mut self) -> Result<u64, TestkitError> {
        let pid = self.running_pid()?;
        crate::rss_peak_bytes(pid)
    }

    /// Current resident set size of the running process (`VmRSS`), in bytes.
    pub fn rss_bytes(&mut self) -> Result<u64, TestkitError> {
        let pid = self.running_pid()?;
        crate::rss_bytes(pid)
    }

    /// The pid of a process that has not exited. An exited but unreaped child still has a
    /// `/proc` entry (a zombie, with no memory figures), so this checks first.
    fn running_pid(&mut self) -> Result<u32, TestkitError> {
        if !self.is_running() {
            return Err(TestkitError::NotRunning);
        }
        Ok(self.child_mut()?.id())
    }

    pub fn addr(&self) -> SocketAddr {
        self.opts.stomp_addr
    }

    /// `tcp://ADDR`, ready for `haven_client::Connection::connect`.
    pub fn stomp_url(&self) -> String {
        format!("tcp://{}", self.opts.stomp_addr)
    }

    pub fn data_dir(&self) -> &Path {
        &self.opts.data_dir
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The config file written from [`BrokerOpts::config_toml`] and passed as `--config`; a
    /// test may rewrite it (restarts use whatever it then holds).
    pub fn config_path(&self) -> Option<&Path> {
        self.config_path.as_deref()
    }

    /// How many times the process was spawned (1 after `start`).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// The last few KiB of the broker's log, for error messages.
    pub fn log_tail(&self) -> String {
        read_tail(&self.log_path)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log_path.display()))
    }

    fn kill_now(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.kill_now();
    }
}

fn read_tail(path: &Path) -> std::io::Result<String> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES_MAX)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
