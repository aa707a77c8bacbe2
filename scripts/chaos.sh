#!/usr/bin/env bash
# Chaos run for `kl refresh`: N runs (--runs N, default 30) against real providers (null, random,
# local; a Terraform-made state) and the fault-injecting fake provider, with random faults, kills
# and database connection cuts; then the invariants (serials increase, versions parse, lifecycle
# rows = a re-index, audit rows finished or marked stale, no lock or process left). Prints a
# summary; exits non-zero on any violation. `--seed S` replays a run; see `scripts/chaos.sh --help`.
# The runner is test-kit code (tests/kit/chaos.py, with the invariant checks the tests use).
# Needs the test providers and Terraform 1.0.3 (scripts/test-providers.sh, scripts/test-terraform.sh)
# and PostgreSQL server binaries (its own throwaway cluster) unless --database-url is given.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${KL_PYTHON:-}"
if [ -z "$py" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then py="$repo/.venv/bin/python"; else py="$(command -v python3)"; fi
fi
export PYTHONPATH="$repo:$repo/tests${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m kit.chaos "$@"
