#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup-dev.sh), runs the linters
# (scripts/lint.sh), then the whole pytest suite against a real PostgreSQL and real providers,
# then the benchmark ratio gates in quick mode. Extra arguments go to the pytest run of tests/.
set -euo pipefail
cd "$(dirname "$0")/.."
KL_SETUP_CLIS="${KL_SETUP_CLIS-background}" bash scripts/setup-dev.sh
bash scripts/lint.sh
# The documentation site: --strict fails on any warning, so a broken link or anchor between the
# pages fails the run (mkdocs.yml's validation settings; not --quiet, under which mkdocs stops
# counting warnings and --strict passes anything). The extra's pins are in pyproject.toml.
NO_MKDOCS_2_WARNING=1 .venv/bin/python -m mkdocs build --strict
export KL_TEST_CACHE="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
# The Rust codec's own tests read the same vector file as the Python suite. Debug builds use far
# bigger stack frames than the release build Python loads, so the 64-deep nesting vectors need a
# bigger test-thread stack here.
RUST_MIN_STACK=67108864 cargo test -q --manifest-path codec_rs/Cargo.toml --no-default-features --features transport
# kl.pyz is built once per run and shared by tests/pyz and the start-up bench.
.venv/bin/python build_zipapp.py --wheel-cache "$KL_TEST_CACHE/pyz-wheels"
export KL_TEST_PYZ="$PWD/dist/kl.pyz"
# The web UI's browser tests leave a screenshot of every page here (desktop and phone width).
export KL_UI_SCREENSHOTS="${KL_UI_SCREENSHOTS:-$PWD/dist/ui-screenshots}"
# The slowest tests are listed at the end: the budget (CI) is spent there first.
.venv/bin/python -m pytest tests --durations=25 "$@"
# The benchmarks race every CLI: a background build of them (setup-dev.sh) must be over, and good.
cli_bin="$KL_TEST_CACHE/bin"
waited=0
while [ -f "$cli_bin/background-build.pid" ] && kill -0 "$(cat "$cli_bin/background-build.pid" 2>/dev/null)" 2>/dev/null; do
    [ "$waited" -lt 3600 ] || { echo "test: the background build of the Terraform/OpenTofu CLIs is still running after an hour (log: $cli_bin/background-build.log)" >&2; exit 1; }
    sleep 5
    waited=$((waited + 5))
done
if [ -f "$cli_bin/background-build.status" ] && [ "$(cat "$cli_bin/background-build.status")" != 0 ]; then
    echo "test: the background build of the Terraform/OpenTofu CLIs failed; $cli_bin/background-build.log ends:" >&2
    tail -n 15 "$cli_bin/background-build.log" | sed "s/^/  | /" >&2
    exit 1
fi
if [ -d benches ] && ls benches/test_*.py >/dev/null 2>&1; then
    KL_BENCH_QUICK=1 .venv/bin/python -m pytest benches -q --benchmark-disable-gc --benchmark-columns=min,mean,ops -p no:cacheprovider
fi
