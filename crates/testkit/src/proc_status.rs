//! Memory of a running process as Linux reports it in `/proc/<pid>/status`.
//!
//! Tests that bound a broker's memory read `VmHWM` (peak resident set since the process
//! started, or since the last reset through `/proc/<pid>/clear_refs`) rather than sampling
//! `VmRSS`: sampling misses a short spike, the kernel's high-water mark does not. Both are
//! reported in KiB by the kernel and returned here in bytes. Linux only, like the rest of the
//! testkit's process handling.

use std::path::PathBuf;

use crate::TestkitError;

/// Peak resident set size of process `pid` (`VmHWM`), in bytes.
pub fn rss_peak_bytes(pid: u32) -> Result<u64, TestkitError> {
    status_field_bytes(pid, "VmHWM")
}

/// Current resident set size of process `pid` (`VmRSS`), in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64, TestkitError> {
    status_field_bytes(pid, "VmRSS")
}

fn status_field_bytes(pid: u32, field: &'static str) -> Result<u64, TestkitError> {
    let path = PathBuf::from(format!("/proc/{pid}/status"));
    let text = std::fs::read_to_string(&path).map_err(|source| TestkitError::Io {
        what: format!("read {}", path.display()),
        source,
    })?;
    parse_kib_field(&text, field)
        .map(|kib| kib * 1024)
        .ok_or(TestkitError::ProcStatus { path, field })
}

/// The value of a `NAME:   1234 kB` line of a `/proc/<pid>/status` text, in KiB.
fn parse_kib_field(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let mut words = rest.split_whitespace();
        let value = words.next()?.parse::<u64>().ok()?;
        (words.next() == Some("kB") && words.next().is_none()).then_some(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kib_fields_and_rejects_other_shapes() {
        let status =
            "Name:\thaven\nVmPeak:\t  500000 kB\nVmHWM:\t   12345 kB\nVmRSS:\t    9000 kB\n\
                      VmBad:\t 12 MB\nThreads:\t5\n";
        assert_eq!(parse_kib_field(status, "VmHWM"), Some(12345));
        assert_eq!(parse_kib_field(status, "VmRSS"), Some(9000));
        assert_eq!(parse_kib_field(status, "VmBad"), None, "unit must be kB");
        assert_eq!(parse_kib_field(status, "Threads"), None, "no unit");
        assert_eq!(parse_kib_field(status, "VmSwap"), None, "absent");
        assert_eq!(
            parse_kib_field(status, "Vm"),
            None,
            "prefix of a name is not a name"
        );
    }

    #[test]
    fn reads_the_test_process_own_rss_and_peak() {
        // Two reads are two moments, so only each value is checked, not their order.
        let pid = std::process::id();
        assert!(rss_bytes(pid).unwrap() > 0);
        assert!(rss_peak_bytes(pid).unwrap() > 0);
        assert!(matches!(
            rss_peak_bytes(u32::MAX),
            Err(TestkitError::Io { .. })
        ));
    }
}
