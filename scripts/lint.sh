#!/usr/bin/env bash
# The linters, each at zero findings: ruff (defaults plus I, B, UP; pyproject.toml), mypy --strict
# over kilolock/ (pyproject.toml) and a lighter mypy over tests and benches (tests/mypy.ini), and
# clippy with warnings as errors over the Rust codec. Run by scripts/test.sh before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
[ -x "$py" ] || { echo "lint: no .venv: run bash scripts/setup-dev.sh first" >&2; exit 1; }
"$py" -m ruff check --quiet kilolock tests benches scripts examples build_zipapp.py
"$py" -m mypy
"$py" -m mypy --config-file tests/mypy.ini tests benches
cargo clippy --version >/dev/null 2>&1 || { echo "lint: cargo clippy is missing: rustup component add clippy" >&2; exit 1; }
for features in "--no-default-features" "--features pyo3/extension-module"; do
    # shellcheck disable=SC2086 # the feature flags are two words on purpose
    cargo clippy --quiet --manifest-path codec_rs/Cargo.toml --all-targets $features -- -D warnings
done
echo "lint: ruff, mypy and clippy found nothing"
