//! Errors from starting, probing and stopping broker processes. Each carries the tail of the
//! broker's log, because "did not start" is useless without the broker's own reason.

#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("broker exited during start-up ({status}); log tail:\n{log_tail}")]
    ExitedEarly {
        status: std::process::ExitStatus,
        log_tail: String,
    },
    #[error("broker at {addr} did not answer CONNECT within {ms} ms; log tail:\n{log_tail}")]
    NotReady {
        addr: std::net::SocketAddr,
        ms: u64,
        log_tail: String,
    },
    #[error("broker is not running")]
    NotRunning,
    #[error("{path}: no `{field}: N kB` line", path = path.display())]
    ProcStatus {
        path: std::path::PathBuf,
        field: &'static str,
    },
    #[error(
        "pid {pid} runs {exe}, not {bin}: the wrapper must exec the broker in place so that \
         signals reach it"
    )]
    WrapperKeptPid { pid: u32, exe: String, bin: String },
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("`{command}` did not finish within {ms} ms (killed)")]
    CommandTimeout { command: String, ms: u64 },
    #[error("{what} is not supported here: {reason}")]
    Unsupported { what: String, reason: String },
    #[error("no free 10.200.N.0/24 subnet for a network lab ({tried} tried)")]
    SubnetsExhausted { tried: usize },
    #[error("signal {signal} to pid {pid} failed: {source}")]
    Signal {
        signal: i32,
        pid: u32,
        source: std::io::Error,
    },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> TestkitError {
    let what = what.into();
    move |source| TestkitError::Io { what, source }
}
