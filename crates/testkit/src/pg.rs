//! A throwaway PostgreSQL cluster for tests of the shared-database mode.
//!
//! `PgCluster::start` runs `initdb` into a temporary directory and starts `postgres` on
//! 127.0.0.1 at a free port, with its unix sockets in that directory, `fsync` on (the tests
//! check durability, so the database must really make commits durable). As root, `initdb`
//! and `postgres` refuse to run, so they run as the `postgres` user (`setpriv`, which execs in place so signals reach the postmaster), and the
//! directory is handed to that user. The postmaster is a child of the test process: `kill`
//! SIGKILLs it (a crashed database), `restart` stops it cleanly and starts it again on the
//! same port and data, and Drop stops it and removes the directory, so a failing test never
//! leaves a database behind.
//!
//! Under CI (`CI=true`) a missing PostgreSQL is an error, not a reason to skip: see
//! [`PgCluster::skip_reason`].

use crate::error::{io, TestkitError};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where Debian puts the server binaries, one directory per major version.
const PG_LIB_DIR: &str = "/usr/lib/postgresql";
/// How long `initdb` may take (it fsyncs the new cluster).
pub const PG_INITDB_TIMEOUT_MS: u64 = 120_000;
/// How long the postmaster may take to accept connections after it was started.
pub const PG_READY_TIMEOUT_MS: u64 = 60_000;
/// How long a clean stop may take before the postmaster is killed.
const PG_STOP_TIMEOUT_MS: u64 = 30_000;
/// Between readiness probes.
const PG_PROBE_INTERVAL_MS: u64 = 50;
/// The unprivileged user the server runs as when the tests run as root.
const PG_OS_USER: &str = "postgres";
/// Connections the test cluster accepts: several brokers with three connections each, plus
/// the tests' own.
const PG_CONNECTIONS_MAX: u32 = 100;

/// One running (or stopped) throwaway cluster.
pub struct PgCluster {
    bin: PathBuf,
    /// Owns the temporary directory: removed on drop.
    dir: tempfile::TempDir,
    data: PathBuf,
    port: u16,
    postmaster: Option<Child>,
    run_as_postgres: bool,
}

impl PgCluster {
    /// `None` when a cluster can be started here; otherwise why not. Under CI (`CI=true`) it
    /// panics instead: the database tests must run there, and a missing PostgreSQL is a
    /// broken CI image, not a reason to skip.
    pub fn skip_reason() -> Option<String> {
        let reason = find_bin_dir().err()?;
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(
            !ci,
            "CI=true: the PostgreSQL tests must run, but {reason} (scripts/test.sh installs it)"
        );
        Some(reason)
    }

    /// initdb + start; returns once the server accepts connections.
    pub fn start() -> Result<PgCluster, TestkitError> {
        let bin = find_bin_dir().map_err(|reason| TestkitError::Unsupported {
            what: "a PostgreSQL test cluster".into(),
            reason,
        })?;
        // SAFETY: geteuid has no preconditions.
        let run_as_postgres = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::Builder::new()
            .prefix("haven-pg-")
            .tempdir()
            .map_err(io("create the cluster's temporary directory"))?;
        let data = dir.path().join("data");
        if run_as_postgres {
            // The server refuses a data directory it does not own, and needs to traverse the
            // temporary directory to reach it.
            chown_to_postgres(dir.path())?;
            set_mode(dir.path(), 0o755)?;
        }
        let mut cluster = PgCluster {
            bin,
            dir,
            data,
            port: crate::free_port(),
            postmaster: None,
            run_as_postgres,
        };
        cluster.initdb()?;
        cluster.spawn()?;
        Ok(cluster)
    }

    /// For tokio-postgres: `host=127.0.0.1 port=N user=postgres dbname=postgres`.
    pub fn url(&self) -> String {
        format!(
            "postgres://{PG_OS_USER}@127.0.0.1:{}/postgres?connect_timeout=10",
            self.port
        )
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Runs SQL through `psql` (for tests that inspect or tamper with the store directly).
    /// Returns psql's unaligned, tuples-only output.
    pub fn psql(&self, sql: &str) -> Result<String, TestkitError> {
        let out = self.psql_command(sql).output().map_err(io("run psql"))?;
        if !out.status.success() {
            return Err(TestkitError::Command {
                command: format!("psql -c {sql:?}"),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Starts `psql -c sql` without waiting for it: for a session that holds a lock while
    /// the test goes on. The caller waits for (or kills) the child.
    pub fn psql_spawn(&self, sql: &str) -> Result<Child, TestkitError> {
        self.psql_command(sql)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("spawn psql"))
    }

    fn psql_command(&self, sql: &str) -> Command {
        let psql = self.bin.join("psql");
        let mut cmd = Command::new(if psql.exists() {
            psql
        } else {
            PathBuf::from("psql")
        });
        cmd.args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", PG_OS_USER, "-d", "postgres", "-c", sql])
            .stdin(Stdio::null());
        cmd
    }

    /// A clean (fast) shutdown: every session is disconnected, commits stay.
    pub fn stop(&mut self) -> Result<(), TestkitError> {
        let Some(mut child) = self.postmaster.take() else {
            return Ok(());
        };
        // SIGINT = "fast shutdown": abort sessions, checkpoint, exit.
        signal(&child, libc::SIGINT)?;
        let deadline = Instant::now() + Duration::from_millis(PG_STOP_TIMEOUT_MS);
        loop {
            if child
                .try_wait()
                .map_err(io("wait for the postmaster"))?
                .is_some()
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(TestkitError::CommandTimeout {
                    command: "postgres fast shutdown".into(),
                    ms: PG_STOP_TIMEOUT_MS,
                });
            }
            std::thread::sleep(Duration::from_millis(PG_PROBE_INTERVAL_MS));
        }
    }

    /// Starts a stopped (or killed) cluster again on the same port and data.
    pub fn start_again(&mut self) -> Result<(), TestkitError> {
        assert!(self.postmaster.is_none(), "the cluster is running");
        self.spawn()
    }

    /// `stop` then `start_again`.
    pub fn restart(&mut self) -> Result<(), TestkitError> {
        self.stop()?;
        self.start_again()
    }

    /// SIGKILLs the postmaster: a crashed database server. Its backends notice their parent
    /// is gone and exit; `start_again` recovers from the WAL.
    pub fn kill(&mut self) -> Result<(), TestkitError> {
        let Some(mut child) = self.postmaster.take() else {
            return Err(TestkitError::NotRunning);
        };
        signal(&child, libc::SIGKILL)?;
        child.wait().map_err(io("wait for the killed postmaster"))?;
        // Orphaned backends keep the shared memory (and the port) until they notice; a new
        // postmaster refuses to start while they live, so wait for the lock file's owner.
        let deadline = Instant::now() + Duration::from_millis(PG_STOP_TIMEOUT_MS);
        while self.backends_alive() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(PG_PROBE_INTERVAL_MS));
        }
        Ok(())
    }

    fn backends_alive(&self) -> bool {
        // Backends keep the data directory as their working directory.
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return false;
        };
        entries
            .flatten()
            .any(|e| std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| cwd == self.data))
    }

    fn initdb(&self) -> Result<(), TestkitError> {
        let initdb = self.bin.join("initdb");
        let mut cmd = self.as_server_user(&initdb);
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-U", PG_OS_USER, "--auth=trust", "-E", "UTF8"])
            .args(["--locale=C", "--no-instructions"]);
        run_bounded(cmd, "initdb", PG_INITDB_TIMEOUT_MS)
    }

    fn spawn(&mut self) -> Result<(), TestkitError> {
        let postgres = self.bin.join("postgres");
        let log = std::fs::File::create(self.dir.path().join("postgres.log"))
            .map_err(io("create postgres.log"))?;
        let log2 = log.try_clone().map_err(io("clone postgres.log"))?;
        let mut cmd = self.as_server_user(&postgres);
        cmd.arg("-D")
            .arg(&self.data)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", &format!("port={}", self.port)])
            .args([
                "-c",
                &format!("unix_socket_directories={}", self.dir.path().display()),
            ])
            .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
            .args(["-c", &format!("max_connections={PG_CONNECTIONS_MAX}")])
            .args(["-c", "shared_buffers=32MB"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2);
        let child = cmd
            .spawn()
            .map_err(io(format!("spawn {}", postgres.display())))?;
        self.postmaster = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), TestkitError> {
        let deadline = Instant::now() + Duration::from_millis(PG_READY_TIMEOUT_MS);
        loop {
            if let Some(child) = self.postmaster.as_mut() {
                if let Some(status) = child.try_wait().map_err(io("wait for postgres"))? {
                    self.postmaster = None;
                    return Err(TestkitError::ExitedEarly {
                        status,
                        log_tail: self.log_tail(),
                    });
                }
            }
            // A query, not just a TCP connect: the server accepts TCP before recovery ends.
            if self.psql("SELECT 1").is_ok_and(|out| out == "1") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::NotReady {
                    addr: std::net::SocketAddr::from(([127, 0, 0, 1], self.port)),
                    ms: PG_READY_TIMEOUT_MS,
                    log_tail: self.log_tail(),
                });
            }
            std::thread::sleep(Duration::from_millis(PG_PROBE_INTERVAL_MS));
        }
    }

    /// The last lines of the server's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn as_server_user(&self, program: &Path) -> Command {
        if self.run_as_postgres {
            // setpriv execs in place (runuser would fork and not pass our signals on), so
            // the child we signal is the postmaster itself.
            let mut cmd = Command::new("setpriv");
            cmd.args([
                &format!("--reuid={PG_OS_USER}"),
                &format!("--regid={PG_OS_USER}"),
                "--init-groups",
                "--",
            ])
            .arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if self.postmaster.is_some() && self.stop().is_err() {
            // stop() killed it already when it timed out.
        }
    }
}

/// The newest `/usr/lib/postgresql/<major>/bin` holding `initdb` and `postgres`.
fn find_bin_dir() -> Result<PathBuf, String> {
    let entries = std::fs::read_dir(PG_LIB_DIR)
        .map_err(|e| format!("PostgreSQL server binaries not found ({PG_LIB_DIR}: {e})"))?;
    let mut best: Option<(u32, PathBuf)> = None;
    for entry in entries.flatten() {
        let Some(major) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.split('.').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        let bin = entry.path().join("bin");
        if bin.join("initdb").exists()
            && bin.join("postgres").exists()
            && best.as_ref().is_none_or(|(m, _)| major > *m)
        {
            best = Some((major, bin));
        }
    }
    best.map(|(_, bin)| bin)
        .ok_or_else(|| format!("no {PG_LIB_DIR}/*/bin/initdb (install Debian's `postgresql`)"))
}

fn chown_to_postgres(path: &Path) -> Result<(), TestkitError> {
    let mut cmd = Command::new("chown");
    cmd.arg(format!("{PG_OS_USER}:")).arg(path);
    run_bounded(cmd, "chown", PG_STOP_TIMEOUT_MS)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), TestkitError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io(format!("chmod {}", path.display())))
}

fn signal(child: &Child, signal: i32) -> Result<(), TestkitError> {
    // SAFETY: kill(2) on our own child's pid; the child has not been reaped yet.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    if rc != 0 {
        return Err(TestkitError::Signal {
            signal,
            pid: child.id(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Runs a command to completion within `ms`, capturing its output for the error.
fn run_bounded(mut cmd: Command, what: &str, ms: u64) -> Result<(), TestkitError> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!("spawn {what}")))?;
    let deadline = Instant::now() + Duration::from_millis(ms);
    loop {
        if child
            .try_wait()
            .map_err(io(format!("wait for {what}")))?
            .is_some()
        {
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(TestkitError::CommandTimeout {
                command: what.into(),
                ms,
            });
        }
        std::thread::sleep(Duration::from_millis(PG_PROBE_INTERVAL_MS));
    }
    let out = child
        .wait_with_output()
        .map_err(io(format!("collect {what}")))?;
    if !out.status.success() {
        return Err(TestkitError::Command {
            command: what.into(),
            status: out.status,
            stderr: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        });
    }
    Ok(())
}
