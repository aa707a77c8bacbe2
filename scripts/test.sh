#!/usr/bin/env bash
# The test command: installs what is missing (scripts/setup-dev.sh), then runs the whole pytest
# suite against a real PostgreSQL and real providers, then the benchmark ratio gates in quick
# mode. Extra arguments go to the pytest run of tests/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-dev.sh
export KL_TEST_CACHE="${KL_TEST_CACHE:-$HOME/.cache/kilolock-test}"
.venv/bin/python -m pytest tests "$@"
if [ -d benches ] && ls benches/test_*.py >/dev/null 2>&1; then
    KL_BENCH_QUICK=1 .venv/bin/python -m pytest benches -q --benchmark-disable-gc --benchmark-columns=min,mean,ops -p no:cacheprovider
fi
