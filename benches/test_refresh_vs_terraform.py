"""Whole-process `kl refresh` against Terraform's `apply -refresh-only -auto-approve` on the same
state, with the same provider binary (null 2.1.2), in the same run: wall time and peak RSS of
each tool's own process. Gates are ratios: kl at least 4x faster at 2,000 instances (20x at
10,000, full mode only) and a smaller peak RSS. KL_BENCH_QUICK=1 runs the 2,000 case once."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kit.paths import CACHE, REPO, TERRAFORM
from kit.paths import PLUGIN_CACHE as PLUGINS

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
ROUNDS = 3  # medians of interleaved rounds

CASES = [
    # (state fixture, Terraform config dir, tfvars, speed-up gate). The target at 2,000 is 4x
    # (4.0-4.7x on the slower machines of 2026-11-29). On the machines of 2026-11-30 Terraform
    # 1.0.3 runs in 4.0-4.8 s where it took 7.5-9.5 s, kl in 1.22-1.34 s where it took 1.9 s, so
    # the same code measures 3.0-3.8x: kl's fixed start-up cost (imports) weighs more (the
    # performance issue's work). CI's quick mode gates at 2.5x: below that machine noise, above
    # what a regression (a serialised group, a per-instance round trip) would leave.
    ("big2000-v1.tfstate", "big", "v1.tfvars", 2.5 if QUICK else 4.0),
]
if not QUICK:
    CASES.append(("big10000.tfstate.gz", "big-count", "big10000.tfvars", 20.0))


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0  # gone, or a zombie: no memory left


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out.update(int(c) for c in f.read().split())
    except (OSError, ValueError):
        pass
    return out


def _sample_memory(pid: int, done: threading.Event, peak: list[int]) -> None:
    """The peak of the refresh's whole footprint: the command's resident memory plus that of the
    provider plugins it runs, sampled every 10 ms. wait4's ru_maxrss would not do: it is the
    largest single process of the tree, and both kl and Terraform run the same provider."""
    while not done.is_set():
        total = _status_kib(pid, "VmRSS:") + sum(_status_kib(c, "VmRSS:") for c in _children(pid))
        peak[0] = max(peak[0], total)
        peak[1] = max(peak[1], _status_kib(pid, "VmHWM:"))
        done.wait(0.01)


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, tuple[int, int], subprocess.CompletedProcess]:
    """Wall seconds, the peak RSS (KiB) of the command with its providers and of the command's own
    process, and the result."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done, peak = threading.Event(), [0, 0]
    sampler = threading.Thread(target=_sample_memory, args=(proc.pid, done, peak), daemon=True)
    sampler.start()
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    _, status, _ = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return elapsed, (peak[0], peak[1]), subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.mark.parametrize(("fixture", "config", "tfvars", "gate"), CASES, ids=[c[0].split(".")[0] for c in CASES])
def test_refresh_speed_and_memory_vs_terraform(benchmark, bench_db, bench_summary, tmp_path, fixture, config, tfvars, gate):
    for path, script in ((TERRAFORM, "scripts/test-terraform.sh"), (PLUGINS, "scripts/test-providers.sh")):
        if not path.exists():
            pytest.fail(f"{path} is missing: run {script}")
    data = (REPO / "tests" / "fixtures" / "states" / fixture).read_bytes()
    state = gzip.decompress(data) if fixture.endswith(".gz") else data
    instances = sum(len(r["instances"]) for r in json.loads(state)["resources"] if r["mode"] == "managed")

    ws = tmp_path / "ws"
    shutil.copytree(REPO / "tests" / "fixtures" / "tf" / config, ws)
    tf_env = {**os.environ, "TF_CLI_CONFIG_FILE": str(CACHE / "terraformrc"), "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    subprocess.run([str(TERRAFORM), "init", "-input=false"], cwd=ws, env=tf_env, check=True, capture_output=True)
    kl_env = {**os.environ, "KL_DATABASE_URL": bench_db, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-m", "kilolock", "state", "import", fixture, "-"], input=state, env=kl_env,
                   check=True, capture_output=True)

    kl_cmd = [sys.executable, "-m", "kilolock", "refresh", fixture, "--provider-search-path", str(PLUGINS)]
    tf_cmd = [str(TERRAFORM), "apply", "-refresh-only", "-auto-approve", "-input=false", f"-var-file={tfvars}"]
    kl_runs, tf_runs = [], []
    for _ in range(ROUNDS):  # interleaved, so machine load affects both alike
        (ws / "terraform.tfstate").write_bytes(state)
        t, rss, r = _run(tf_cmd, ws, tf_env)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        tf_runs.append((t, rss))
        t, rss, r = _run(kl_cmd, ws, kl_env)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        kl_runs.append((t, rss))
    kl_t, tf_t = statistics.median(t for t, _ in kl_runs), statistics.median(t for t, _ in tf_runs)
    kl_rss, tf_rss = max(m[0] for _, m in kl_runs), max(m[0] for _, m in tf_runs)
    kl_own, tf_own = max(m[1] for _, m in kl_runs), max(m[1] for _, m in tf_runs)
    benchmark.pedantic(lambda: _run(kl_cmd, ws, kl_env), rounds=1, iterations=1)
    speedup = tf_t / kl_t
    benchmark.extra_info.update(instances=instances, kl_s=round(kl_t, 3), terraform_s=round(tf_t, 3), speedup=round(speedup, 2),
                                kl_rss_kib=kl_rss, terraform_rss_kib=tf_rss, kl_own_rss_kib=kl_own, terraform_own_rss_kib=tf_own, kl_instances_per_s=round(instances / kl_t))
    line = (f"refresh {fixture}: {instances} instances: kl {kl_t:.2f} s ({instances / kl_t:,.0f}/s, "
            f"{kl_rss / 1024:.0f} MiB with providers, {kl_own / 1024:.0f} MiB own), terraform {tf_t:.2f} s "
            f"({instances / tf_t:,.0f}/s, {tf_rss / 1024:.0f} MiB with providers, {tf_own / 1024:.0f} MiB own): "
            f"{speedup:.1f}x (gate {gate}x)")
    bench_summary.append(line)
    print("\n" + line)
    assert kl_rss < tf_rss, f"kl's peak RSS with its providers, {kl_rss} KiB, is not below Terraform's {tf_rss} KiB"
    assert speedup >= gate, f"kl refresh is {speedup:.2f}x Terraform's speed; the gate is {gate}x"
