//! Runs the stomp.py interop suite (tests/interop) against the `haven` binary built for this
//! test run, so `cargo test` covers interop with a client this project did not write.
//!
//! Python is `$HAVEN_PYTHON`, else the repo's `.venv/bin/python3` (made by scripts/test.sh),
//! else `python3`. If stomp.py or pytest cannot be imported the test fails and says why:
//! nothing is skipped, in CI or out of it.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repo root")
}

fn python(root: &Path) -> PathBuf {
    if let Some(p) = std::env::var_os("HAVEN_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = root.join(".venv/bin/python3");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("python3")
}

#[test]
fn stomp_py_interop_suite_passes() {
    let root = repo_root();
    let python = python(&root);
    let probe = Command::new(&python)
        .args(["-c", "import stomp, pytest"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; run scripts/test.sh", python.display()));
    if !probe.status.success() {
        panic!(
            "{} cannot import stomp.py and pytest (CI={:?}): {}\n\
             Run scripts/test.sh (installs them into .venv) or set HAVEN_PYTHON.",
            python.display(),
            std::env::var("CI").ok(),
            String::from_utf8_lossy(&probe.stderr)
        );
    }
    let out = Command::new(&python)
        .args([
            "-m",
            "pytest",
            "tests/interop",
            "-q",
            "-p",
            "no:cacheprovider",
        ])
        .current_dir(&root)
        .env("HAVEN_BIN", env!("CARGO_BIN_EXE_haven"))
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("run pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "stomp.py interop suite failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}
