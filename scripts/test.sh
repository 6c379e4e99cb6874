#!/usr/bin/env bash
# Runs every Haven test. The README's single test command for a fresh Debian machine
# (run as root, or as a user with sudo): installs what the tests need if it is missing,
# then builds and tests the whole workspace. Idempotent; a second run skips the installs.
#
#   bash scripts/test.sh
#
# What it installs: python3 with venv/pip, iproute2, nftables and postgresql (Debian packages;
# the tests start their own throwaway clusters, never the system service), and the
# pinned packages of tests/interop/requirements.txt (stomp.py, pytest) into .venv at the repo
# root.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
VENV="$ROOT/.venv"
REQS="$ROOT/tests/interop/requirements.txt"

log() { printf '==> %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# --- system packages --------------------------------------------------------------------
missing=()
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    missing+=(python3-venv python3-pip)
fi
# crates/cli/tests/netns_partitions.rs: network namespaces (ip) cut apart by nft rules. They
# live in sbin, which a non-root PATH may lack; the tests themselves skip unless run as root.
sbin_path="$PATH:/usr/sbin:/sbin"
PATH="$sbin_path" command -v ip >/dev/null 2>&1 || missing+=(iproute2)
PATH="$sbin_path" command -v nft >/dev/null 2>&1 || missing+=(nftables)
# crates/store-pg/tests: each test starts its own throwaway PostgreSQL cluster from the server
# binaries (initdb, postgres); the system service is not started.
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    missing+=(postgresql)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    # policy-rc.d exit 101 = "do not start services": the postgresql package must not start
    # its system cluster here. Removed again right after the install (or if it fails).
    policy=/usr/sbin/policy-rc.d
    policy_added=""
    if [[ " ${missing[*]} " == *" postgresql "* ]] && [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
        as_root chmod +x "$policy"
        policy_added=1
        trap 'as_root rm -f "$policy"' EXIT
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    if [ -n "$policy_added" ]; then
        as_root rm -f "$policy"
        trap - EXIT
    fi
fi
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install the Rust toolchain (rustup) first" >&2
    exit 1
fi

# --- Python venv for the interop tests ---------------------------------------------------
# Reused while it works and was made from the current requirements (stamp = their hash).
stamp="$VENV/.haven-requirements.sha256"
want="$(sha256sum "$REQS" | cut -d' ' -f1)"
if [ -x "$VENV/bin/python3" ] && ! "$VENV/bin/python3" -c 'import sys' >/dev/null 2>&1; then
    log "removing broken venv $VENV"
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python3" ]; then
    log "creating venv $VENV"
    python3 -m venv "$VENV"
fi
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ] \
    || ! "$VENV/bin/python3" -c 'import stomp, pytest' >/dev/null 2>&1; then
    log "installing $(grep -v '^#' "$REQS" | xargs) into $VENV"
    "$VENV/bin/python3" -m pip install -q --disable-pip-version-check -r "$REQS"
    echo "$want" > "$stamp"
fi

# --- what the tests read -----------------------------------------------------------------
export PATH="$VENV/bin:$PATH"
export HAVEN_PYTHON="$VENV/bin/python3"          # crates/cli/tests/interop_stomp_py.rs
export HAVEN_BIN="$ROOT/target/debug/haven"       # tests/interop when pytest is run by hand
export PYTHONDONTWRITEBYTECODE=1

# --- build and test ----------------------------------------------------------------------
log "cargo build --workspace"
cargo build --workspace
log "cargo test --workspace"
cargo test --workspace
