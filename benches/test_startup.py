"""Start-up of kl.pyz under Debian's python3 -I: warm (extraction cached) and cold (a fresh cache dir,
so the run extracts the natives and compiles the code it imports), gated on ratios to a bare
``python3 -I -c pass`` measured in the same run, rounds interleaved, medians. The absolute figures
are printed and recorded against the product budgets (warm < 0.3 s, cold < 1 s); "cold" means a
cold cache dir, not a cold disk (the OS page cache still holds kl.pyz).

Uses $KL_TEST_PYZ if set (a kl.pyz built earlier in the run), else builds one. KL_BENCH_QUICK=1 for CI.
"""
from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.pyz import clean_env

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
ROUNDS = 5 if QUICK else 15
PYTHON = "/usr/bin/python3"
# The budgets over a typical bare interpreter start (~25 ms): 0.3 s and 1 s become these ratios.
WARM_GATE = 12.0
COLD_GATE = 40.0
WARM_BUDGET_S = 0.3
COLD_BUDGET_S = 1.0


@pytest.fixture(scope="module")
def pyz(kl_pyz: Path) -> Path:
    if not Path(PYTHON).exists():
        pytest.fail(f"{PYTHON} is missing: install Debian's python3", pytrace=False)
    return kl_pyz


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + sys) of one run: on a shared, loaded machine the CPU
    figure is the steadier absolute number."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


Sample = tuple[float, float]


def _interleaved(baseline: Callable[[], Sample], ours: Callable[[], Sample]) -> tuple[Sample, Sample]:
    baseline(), ours()  # warm-up: page cache, and for warm runs the extraction itself
    b, o = [], []
    for _ in range(ROUNDS):
        b.append(baseline())
        o.append(ours())

    def med(xs: list[Sample]) -> Sample:
        return statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs)

    return med(b), med(o)


def _summary(request: pytest.FixtureRequest) -> list[str]:
    """The run's closing table of figures (benches/conftest.py), when the suite has one."""
    try:
        return request.getfixturevalue("bench_summary")
    except pytest.FixtureLookupError:
        return []


def _report(benchmark, request: pytest.FixtureRequest, what: str, floor: Sample, mine: Sample, budget: float) -> float:
    ratio = mine[0] / floor[0]
    benchmark.extra_info.update({"baseline_ms": round(floor[0] * 1e3, 2), "kl_ms": round(mine[0] * 1e3, 2),
                                 "baseline_cpu_ms": round(floor[1] * 1e3, 2), "kl_cpu_ms": round(mine[1] * 1e3, 2),
                                 "ratio": round(ratio, 2), "budget_ms": budget * 1e3})
    verdict = "within" if mine[0] < budget else "OVER"
    line = (f"startup {what}: python -c pass {floor[0]*1e3:.1f} ms (cpu {floor[1]*1e3:.1f}), kl.pyz {mine[0]*1e3:.1f} ms "
            f"(cpu {mine[1]*1e3:.1f}), ratio {ratio:.1f} ({verdict} the {budget:.1f} s budget)")
    print("\n" + line)
    _summary(request).append(line)
    return ratio


def test_warm_version(pyz: Path, benchmark, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    baseline = lambda: _timed([PYTHON, "-I", "-c", "pass"], env)
    warm = lambda: _timed([PYTHON, "-I", str(pyz), "version"], env)
    floor, mine = _interleaved(baseline, warm)
    ratio = _report(benchmark, request, "warm `kl.pyz version`", floor, mine, WARM_BUDGET_S)
    benchmark.pedantic(warm, rounds=ROUNDS, iterations=1)
    assert ratio < WARM_GATE, f"warm start is {ratio:.1f}x a bare python start (gate {WARM_GATE}x)"


def test_warm_help(pyz: Path, benchmark, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    env = clean_env(tmp_path)
    baseline = lambda: _timed([PYTHON, "-I", "-c", "pass"], env)
    warm = lambda: _timed([PYTHON, "-I", str(pyz), "--help"], env)
    floor, mine = _interleaved(baseline, warm)
    ratio = _report(benchmark, request, "warm `kl.pyz --help`", floor, mine, WARM_BUDGET_S)
    benchmark.pedantic(warm, rounds=ROUNDS, iterations=1)
    assert ratio < WARM_GATE, f"warm --help is {ratio:.1f}x a bare python start (gate {WARM_GATE}x)"


def test_cold_version(pyz: Path, benchmark, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    counter = iter(range(10**6))

    def cold() -> Sample:  # every run gets a cache dir of its own: full extraction each time
        cache = tmp_path / f"cache-{next(counter)}"
        sample = _timed([PYTHON, "-I", str(pyz), "version"], clean_env(tmp_path, KL_CACHE_DIR=str(cache)))
        shutil.rmtree(cache)  # ~30 MB each
        return sample

    env = clean_env(tmp_path)
    baseline = lambda: _timed([PYTHON, "-I", "-c", "pass"], env)
    floor, mine = _interleaved(baseline, cold)
    ratio = _report(benchmark, request, "cold `kl.pyz version` (extracts)", floor, mine, COLD_BUDGET_S)
    benchmark.pedantic(cold, rounds=ROUNDS, iterations=1)
    assert ratio < COLD_GATE, f"cold start is {ratio:.1f}x a bare python start (gate {COLD_GATE}x)"
