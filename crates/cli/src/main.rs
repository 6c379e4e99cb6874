//! The `haven` binary: `haven run` serves a broker; `haven bench` measures any STOMP broker;
//! `haven send` and `haven receive` move messages from the command line.

mod admin;
mod bench;
mod client_cmd;
mod receive;
mod reload;
mod send;

/// The broker allocates and frees a few small buffers per message on several threads; glibc's
/// allocator fragments and spends a quarter of the CPU on that path (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};
use haven_server::{run_shared, Config, HaMode, Role, Server, SharedFsStore, SharedStore};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "haven",
    version,
    about = "Haven: a highly available STOMP message broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a broker. Without flags: STOMP on 127.0.0.1:61613, journal in ./data.
    Run {
        /// Configuration file (haven.toml); every setting has a default. SIGHUP re-reads its
        /// [cluster] table.
        #[arg(long)]
        config: Option<PathBuf>,
        /// STOMP listen address; overrides stomp.listen.
        #[arg(long)]
        stomp: Option<SocketAddr>,
        /// Journal directory; overrides journal.dir.
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Benchmark a STOMP broker (Haven, ActiveMQ, RabbitMQ).
    Bench(Box<bench::BenchArgs>),
    /// Send messages to a destination (like `activemq producer`).
    Send(Box<send::SendArgs>),
    /// Receive messages from a destination (like `activemq consumer`).
    Receive(Box<receive::ReceiveArgs>),
    /// Administer a running broker group (`haven admin cluster status|add|remove`).
    Admin(admin::AdminArgs),
}

impl Cmd {
    /// The log level when RUST_LOG is unset: the messaging commands print their own
    /// summary, so only the client's warnings (reconnects, refusals) go with it.
    fn default_log_level(&self) -> &'static str {
        match self {
            Cmd::Send(_) | Cmd::Receive(_) | Cmd::Admin(_) => "warn",
            Cmd::Run { .. } | Cmd::Bench(_) => "info",
        }
    }
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    shorten_allocator_purge_delay();
    haven_server::set_idle_hook(collect_freed_memory);
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| cli.command.default_log_level().into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = |workers: Option<usize>| {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = workers {
            builder.worker_threads(n);
        }
        builder.enable_all().build().expect("tokio runtime")
    };
    match cli.command {
        Cmd::Run {
            config,
            stomp,
            data,
        } => {
            // The configuration first: it says how many threads the runtime gets.
            let (cfg, started_text) = match load_run_config(config.as_deref(), stomp, data) {
                Ok(loaded) => loaded,
                Err(code) => return code,
            };
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            let workers = cfg.worker_threads_effective(cores);
            runtime(Some(workers)).block_on(run(cfg, config, started_text))
        }
        Cmd::Bench(args) => match runtime(None).block_on(bench::run(*args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("haven bench: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Send(args) => match runtime(None).block_on(send::run(*args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("haven send: {e}");
                e.exit_code()
            }
        },
        Cmd::Admin(args) => match runtime(None).block_on(admin::run(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("haven admin: {e}");
                ExitCode::FAILURE
            }
        },
        Cmd::Receive(args) => match runtime(None).block_on(receive::run(*args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("haven receive: {e}");
                e.exit_code()
            }
        },
    }
}

/// mimalloc asks for transparent huge pages on its arenas (`MADV_HUGEPAGE`), and it returns
/// freed memory to the kernel as it goes. A broker's heap churns (messages arrive and leave),
/// so each refault of a 2 MiB page is zeroed whole: 9% of the broker's CPU in scenario (c),
/// and 30 to 40 MiB more peak RSS (docs/PERFORMANCE.md). Off for this process and its threads;
/// a failure (a kernel without the call) only loses the saving.
fn disable_transparent_huge_pages() {
    // SAFETY: prctl with PR_SET_THP_DISABLE takes integer arguments only and touches no memory
    // of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        eprintln!(
            "haven: cannot disable transparent huge pages: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// mimalloc's `mi_option_purge_delay`: its position in the `mi_option_e` enum of mimalloc v3's
/// `mimalloc.h`, which `libmimalloc-sys` builds by default. A test checks it still names the
/// purge delay (by its default) when the dependency moves.
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;
/// How long freed memory waits before mimalloc returns it to the kernel: 100 ms. mimalloc v3
/// waits 1 s, and purges only while it is allocating, so a broker kept what a burst had freed:
/// 227 MiB resident after scenario (g) instead of 156 MiB, and peak RSS in (c) 155-163 MiB
/// instead of 131 (docs/PERFORMANCE.md). 0 (purge at once) saved more memory but cost about
/// 10% of (c)'s throughput.
const ALLOCATOR_PURGE_DELAY_MS: std::ffi::c_long = 100;

extern "C" {
    // Part of the mimalloc library that `mimalloc` links (libmimalloc-sys declares them only
    // behind its `extended` feature).
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    fn mi_collect(force: bool);
    #[cfg(test)]
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
}

/// The broker's idle hook: gives what this thread freed back to the kernel now, instead of
/// when it next allocates (`haven_server::set_idle_hook`).
fn collect_freed_memory() {
    // SAFETY: asks mimalloc to collect the calling thread's heap; no memory is touched.
    unsafe { mi_collect(false) };
}

fn shorten_allocator_purge_delay() {
    // SAFETY: sets one integer option of the allocator; mimalloc reads options atomically.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS) };
}

/// `haven run`'s configuration: the file (or the defaults) with the command line's
/// overrides, and the file's text (what SIGHUP compares against).
fn load_run_config(
    config: Option<&Path>,
    stomp: Option<SocketAddr>,
    data: Option<PathBuf>,
) -> Result<(Config, Option<String>), ExitCode> {
    let (mut cfg, started_text) = match config {
        Some(path) => match reload::load(path) {
            Ok((c, text)) => (c, Some(text)),
            Err(e) => {
                eprintln!("haven: {e}");
                return Err(ExitCode::from(2));
            }
        },
        None => (Config::default(), None),
    };
    if let Some(addr) = stomp {
        cfg.stomp.listen = addr;
    }
    if let Some(dir) = data {
        cfg.journal.dir = dir;
    }
    Ok((cfg, started_text))
}

async fn run(cfg: Config, config: Option<PathBuf>, started_text: Option<String>) -> ExitCode {
    // SIGHUP re-reads the config file's [cluster]. Installed before the broker listens, so a
    // SIGHUP sent once clients can connect is never lost (or fatal: its default action).
    // Without a config file there is nothing to re-read and SIGHUP keeps its default.
    let hup = match &config {
        Some(_) => {
            use tokio::signal::unix::{signal, SignalKind};
            Some(signal(SignalKind::hangup()).expect("SIGHUP handler"))
        }
        None => None,
    };
    if cfg.ha.mode != HaMode::Standalone {
        return run_shared_store(cfg).await;
    }
    let server = match Server::start(cfg).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("haven: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let (Some(hup), Some(path), Some(text)) = (hup, config, started_text) {
        tokio::spawn(reload::on_sighup(hup, path, text, server.cluster_handle()));
    }
    stop_on_signal(server.stopper());
    match server.wait().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("haven: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `[ha] mode = "shared-fs"` (or `"shared-db"`): wait as a slave, serve as master, step down
/// when mastership is lost, until SIGTERM/SIGINT.
async fn run_shared_store(cfg: Config) -> ExitCode {
    let store: Arc<dyn SharedStore> = match cfg.ha.mode {
        HaMode::SharedFs => Arc::new(SharedFsStore::new(&cfg)),
        HaMode::SharedDb => {
            // A record must fit what the local journal would take, so a store can move between
            // modes; PostgreSQL itself takes up to 1 GB per value.
            let mut journal = haven_journal::JournalConfig::new(cfg.journal.dir.clone());
            journal.segment_bytes = cfg.journal.segment_bytes;
            match haven_store_pg::PgSharedStore::new(
                &cfg.ha,
                &cfg.broker.name,
                journal.record_bytes_max(),
            ) {
                Ok(store) => Arc::new(store),
                Err(e) => {
                    eprintln!("haven: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        HaMode::Replicated => return run_replicated(cfg).await,
        HaMode::Standalone => unreachable!("standalone runs Server::start"),
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (role_tx, _role_rx) = tokio::sync::watch::channel(Role::Slave);
    stop_on_signal(stop_tx);
    match run_shared(cfg, store, stop_rx, role_tx).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("haven: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `[ha] mode = "replicated"`: start this member's Raft node, serve clients while it leads,
/// until SIGTERM/SIGINT.
async fn run_replicated(mut cfg: Config) -> ExitCode {
    if let Err(e) = cfg.validate(std::path::Path::new("<config>")) {
        eprintln!("haven: {e}");
        return ExitCode::from(2);
    }
    // The leader announces the data members to failover clients unless [cluster] says
    // otherwise (a witness serves no clients).
    if cfg.cluster.members.is_empty() {
        cfg.cluster.members = cfg
            .ha
            .members
            .iter()
            .filter_map(|m| m.stomp)
            .map(|a| format!("tcp://{a}"))
            .collect();
    }
    let store = match haven_raft::ReplicatedStore::start(&cfg).await {
        Ok(store) => Arc::new(store),
        Err(e) => {
            eprintln!("haven: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (role_tx, _role_rx) = tokio::sync::watch::channel(Role::Slave);
    stop_on_signal(stop_tx);
    let shared: Arc<dyn SharedStore> = store.clone();
    let result = run_shared(cfg, shared, stop_rx, role_tx).await;
    if let Ok(store) = Arc::try_unwrap(store) {
        store.shutdown().await;
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("haven: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sets `stop` on the first SIGTERM or SIGINT. The handlers are installed before this returns.
fn stop_on_signal(stop: tokio::sync::watch::Sender<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("stopping on signal");
        let _ = stop.send(true);
    });
}

#[cfg(test)]
mod allocator_tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_mimalloc_defaults_to_one_second() {
        // Before `main` changes it (tests do not run `main`): mimalloc v3's default purge
        // delay is 1,000 ms, and no neighbouring option of mimalloc.h defaults to that.
        // SAFETY: reads one integer option.
        assert_eq!(unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }, 1_000);
    }
}
