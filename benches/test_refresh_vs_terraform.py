"""Whole-process `python3 -I kl.pyz refresh` against every peer the test setup builds (Terraform
1.0.3, 1.8.5 and 1.12.2, OpenTofu 1.6.3 and 1.8.5: kit.paths.CLIS), each running `apply
-refresh-only -auto-approve` on the same state with the same provider binary (null 2.1.2), rounds
interleaved in the same run: median wall time and the peak RSS of each tool with its provider
processes.

Both state shapes, since Terraform's time depends on it: `count` (null_resource.r[0..N-1], config
tf/big-count) and `for_each` (null_resource.r["k0000"..], config tf/big). The states are slices of
the Terraform-made fixtures (big10000 for count, big2000-v1 for for_each).

Gates, per size: kl's speed-up over the FASTEST peer on the shape where that peer is fastest (the
issue's targets: 1.2x at 10, 4x at 2,000, 25x at 10,000), and kl's peak RSS below every peer's.
KL_BENCH_QUICK=1 (CI): sizes 10 and 2,000, gates a little below what CI's quiet 2-core machine
holds, on wall time and on CPU time (see SIZES); the full run adds 10,000.
"""
from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kit.paths import CACHE, CLIS, REPO
from kit.paths import PLUGIN_CACHE as PLUGINS
from kit.pyz import clean_env

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
# Peak RSS against each peer's, with its providers. The target is below every peer's (1.0). At 10
# instances kl and OpenTofu 1.6.3 measure within 1% of each other (85 MiB, most of it the same null
# provider and an interpreter's worth of Python), so CI's quick gate allows 5% over; full mode
# keeps the target.
RSS_GATE = 1.05 if QUICK else 1.0
PYTHON = "/usr/bin/python3"
PEERS = CLIS
SHAPES = {"count": "big-count", "for_each": "big"}

# size: (rounds, the target, the wall-time gate, the CPU-time gate). Quick-mode gates sit
# below what this code holds on the shared 2-core machine of 2026-11-30, loaded by five other
# agents (load average 9-20): there a CPU-bound Python process gets a smaller share of the cores
# than Go's many threads, so kl's wall-time ratio sags under load while its CPU-time ratio (kl
# with its provider against the peer with its provider) holds; the CPU gate is what catches a
# start-up regression in CI. The full run gates wall time on the targets themselves.
SIZES: dict[int, tuple[int, float, float, float | None]] = {
    # Measured there: 0.44-0.89x wall, 0.97-1.09x CPU at 10; 4.6x wall, 4.8x CPU at 2,000 (count).
    # After session 6's fixed-cost cuts (JIT off in the commit, argparse's catalogue searches,
    # kl.pyz's start-up code from the code cache, only the chosen command's parser), same machine,
    # load 11-17: 0.93x wall (count; 0.50x for_each) and 1.06x CPU, where the code before measured
    # 0.76x/0.57x and 0.92x in the same hour. With kl, the peers and PostgreSQL at nice -10 (load
    # 4-8, nearer a quiet CI box), 15 interleaved rounds, count: kl 439 -> 374 ms against
    # OpenTofu 1.8.5 346 and Terraform 1.8.5 342, 0.78x -> 0.91x the fastest. The CPU gate moves
    # up to what the new code holds with room for the spread. The quick wall gate moves to 0.7x:
    # CI's quiet box held 0.80-0.83x with the code before and holds ~0.9x now (the target, 1.2x,
    # is not reached yet); a machine as loaded as above can sag below it.
    # Session 10 moved every provider call to kl's native HTTP/2 client (no grpc import): CI's quick
    # runs since held 0.97-1.09x wall and 1.10-1.25x CPU against the fastest peer (sessions 10 and
    # 11, eight runs). The quick gates follow, with room for CI's spread: 0.85x wall, 1.0x CPU. The
    # target stays out of reach on two cores: importing psycopg alone is ~80-120 ms of kl's ~300 ms
    # critical path, and the store's round trips (~30 statements before the reads, ~20 in the
    # commit, three synchronous commits) most of the rest.
    # Session 14 (a no-change commit sends no document; no garbage collection before the state is
    # loaded), quick mode on a quiet machine: 1.12x count (kl 0.45 s, OpenTofu 1.8.5 0.50 s), 1.22x
    # for_each, CPU 1.19x; session 13's CI had 0.87x and 1.03x. The target holds for for_each, not
    # yet for count, the shape the gate uses.
    # Session 15 (the AutoMTLS key from aws-lc; the unused modules deferred), quick mode, four runs in
    # one hour: 1.22x / 1.28x / 1.26x / 1.24x in the gate's shape (count 1.22x / 1.17x / 1.26x /
    # 1.25x, for_each 1.25x / 1.28x / 1.28x / 1.24x; kl 0.22-0.27 s against OpenTofu's 0.27-0.35 s),
    # CPU 1.23-1.37x; the session's first code, run in the same hour: 1.21x count, 1.14x for_each.
    # The machine is slower in other hours (the peers at 0.42-0.50 s), where the same first code had
    # measured 1.03x count / 1.12x for_each.
    # Session 21, full mode (9 interleaved rounds), three runs at different hours on a quiet machine
    # (load 0.3-0.8): 1.22x (20:29, gate shape for_each), 1.30x (21:23, count), 1.31x (22:13, count);
    # kl 0.20-0.22 s against the fastest peer's 0.26-0.29 s, CPU 1.28-1.32x. The target holds.
    # The measure is the median of at least 9 interleaved rounds: the full run takes 9.
    10: (7 if QUICK else 9, 1.2, 0.85 if QUICK else 1.2, 1.0 if QUICK else None),
    # On a quiet machine with all five peers (CI of 2026-11-30, load ~1): 2.37x wall, 2.64x CPU
    # against OpenTofu 1.8.5. (A loaded machine slows the peers more than kl: 4.4-6.9x there.)
    # Reads from the event loop (session 8, quick mode, quiet machine): kl.pyz 0.78 s against
    # Terraform 1.8.5's 3.02 s, 3.88x wall, 4.27x CPU (CI's quiet run before: 2.78x, kl 1.55 s). The
    # quick gates move up so that losing the async path (back to ~2.4-2.8x) fails CI.
    # Through the native HTTP/2 client (session 9, quick mode, quiet but slower machine: every peer
    # took ~2x session 8's time): kl.pyz 1.13 s against Terraform 1.8.5's 5.74 s, 5.07x wall, 6.00x
    # CPU, the target met. The quick gates move to the target itself (wall) and 4.5x (CPU), ~20% below
    # what was measured, for CI's noise.
    2000: (3, 4.0, 4.0, 4.5 if QUICK else None),
}
if not QUICK:
    # Session 8, quiet machine, reads from the event loop: kl.pyz 2.84 s (100 MiB) against OpenTofu
    # 1.6.3's 50.3 s (292 MiB), 17.7x; the target (25x) is not reached. (Session 7's 23.2x, kl 4.44 s,
    # was against peers slowed by a loaded machine: OpenTofu 1.8.5 took 103 s there.)
    # Session 9, native HTTP/2 client, quiet but slower machine: kl.pyz 4.17 s (98 MiB) against
    # OpenTofu 1.8.5's 201.0 s (281 MiB), 48.2x; every peer took 201-231 s there, four times its
    # session 8 time, while kl took 1.5x its own, so this machine flatters the ratio.
    SIZES[10000] = (1, 25.0, 25.0, None)
# The shapes run at each size. for_each is slow for every peer at scale (Terraform 1.0.3 evaluates
# it per instance; on 2026-11-30 Terraform 1.8.5 was still refreshing the 2,000-key state after
# 9 minutes on the loaded machine), so a CI run compares it at 10 instances and gates 2,000 on
# count, where the peers are fastest (which is the shape the targets hold for); the full run adds
# for_each at 2,000. No peer refreshes 10,000 for_each keys in reasonable time.
SHAPES_AT: dict[int, tuple[str, ...]] = {10: ("count", "for_each"), 2000: ("count",) if QUICK else ("count", "for_each"),
                                         10000: ("count",)}


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
    provider plugins it runs, sampled every 5 ms. wait4's ru_maxrss would not do: it is the
    largest single process of the tree, and every tool runs the same provider."""
    while not done.is_set():
        total = _status_kib(pid, "VmRSS:") + sum(_status_kib(c, "VmRSS:") for c in _children(pid))
        peak[0] = max(peak[0], total)
        peak[1] = max(peak[1], _status_kib(pid, "VmHWM:"))
        done.wait(0.005)


@dataclass
class Sample:
    seconds: float
    rss_kib: int  # with its providers
    own_kib: int  # the command's own process
    # CPU seconds (user + system) of the command and the providers it reaped: on a loaded shared
    # machine the steadier figure, reported beside the wall time the gates use.
    cpu: float


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> Sample:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    done, peak = threading.Event(), [0, 0]
    sampler = threading.Thread(target=_sample_memory, args=(proc.pid, done, peak), daemon=True)
    sampler.start()
    out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, f"{' '.join(cmd[:4])} failed ({proc.returncode}):\n{(out + err).decode()[-2000:]}"
    return Sample(elapsed, peak[0], peak[1], usage.ru_utime + usage.ru_stime)


def _count_state(n: int) -> bytes:
    doc = json.loads(gzip.decompress((REPO / "tests/fixtures/states/big10000.tfstate.gz").read_bytes()))
    for r in doc["resources"]:
        if r["mode"] == "managed":
            r["instances"] = r["instances"][:n]
    return json.dumps(doc, indent=2).encode() + b"\n"


def _for_each_state(n: int) -> bytes:
    doc = json.loads((REPO / "tests/fixtures/states/big2000-v1.tfstate").read_bytes())
    for r in doc["resources"]:
        if r["mode"] == "managed":
            r["instances"] = r["instances"][:n]
    return json.dumps(doc, indent=2).encode() + b"\n"


STATES = {"count": _count_state, "for_each": _for_each_state}


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """An initialised workspace per (peer, shape), with the provider from the test plugin cache."""
    for path, script in ((PLUGINS, "scripts/test-providers.sh"),):
        if not path.exists():
            pytest.fail(f"{path} is missing: run {script}", pytrace=False)
    out = {}
    for peer in PEERS:
        binary = CACHE / "bin" / peer
        if not binary.exists():
            pytest.fail(f"{binary} is missing: run scripts/test-terraform.sh {peer}", pytrace=False)
        for shape, config in SHAPES.items():
            ws = tmp_path_factory.mktemp(f"{peer}-{shape}")
            main_tf = (REPO / "tests/fixtures/tf" / config / "main.tf").read_text()
            # The full source address: OpenTofu's default registry differs, the filesystem mirror does not.
            (ws / "main.tf").write_text(main_tf.replace('"hashicorp/null"', '"registry.terraform.io/hashicorp/null"'))
            subprocess.run([str(binary), "init", "-input=false"], cwd=ws, env=_peer_env(), check=True, capture_output=True)
            out[(peer, shape)] = ws
    return out


def _peer_env() -> dict[str, str]:
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(CACHE / "terraformrc"), "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}
    env.pop("TF_LOG", None)
    return env


@dataclass
class ShapeResult:
    shape: str
    kl: list[Sample] = field(default_factory=list)
    peers: dict[str, list[Sample]] = field(default_factory=dict)

    @staticmethod
    def median(samples: list[Sample]) -> float:
        return statistics.median(s.seconds for s in samples)

    @staticmethod
    def cpu(samples: list[Sample]) -> float:
        return statistics.median(s.cpu for s in samples)

    @staticmethod
    def peak(samples: list[Sample]) -> int:
        return max(s.rss_kib for s in samples)

    def fastest_peer(self) -> tuple[str, float]:
        return min(((p, self.median(s)) for p, s in self.peers.items()), key=lambda x: x[1])


def _mib(kib: int) -> str:
    return f"{kib / 1024:.0f} MiB"


@pytest.mark.parametrize("size", list(SIZES), ids=[str(s) for s in SIZES])
def test_refresh_speed_and_memory_vs_peers(benchmark, bench_db, bench_summary, kl_pyz: Path, workspaces, tmp_path: Path,
                                           size: int) -> None:
    if not Path(PYTHON).exists():
        pytest.fail(f"{PYTHON} is missing: install Debian's python3", pytrace=False)
    rounds, target, gate, cpu_gate = SIZES[size]
    kl_env = clean_env(tmp_path, KL_DATABASE_URL=bench_db)
    kl_dir = tmp_path / "kl"
    kl_dir.mkdir()
    subprocess.run([PYTHON, "-I", str(kl_pyz), "version"], env=kl_env, check=True, capture_output=True)  # extracts
    results: dict[str, ShapeResult] = {}
    for shape in SHAPES_AT[size]:
        state = STATES[shape](size)
        name = f"{shape.replace('_', '')}{size}"
        subprocess.run([PYTHON, "-I", str(kl_pyz), "state", "import", name, "-"], input=state, env=kl_env, check=True,
                       capture_output=True)
        kl_cmd = [PYTHON, "-I", str(kl_pyz), "refresh", name, "-q", "--provider-search-path", str(PLUGINS)]
        peers = list(PEERS)
        for peer in peers:
            (workspaces[(peer, shape)] / "size.tfvars").write_text(f"instances = {size}\n")
        res = results[shape] = ShapeResult(shape, peers={p: [] for p in peers})
        _run(kl_cmd, kl_dir, kl_env)  # warm-up: page cache, compiled-code cache
        for _ in range(rounds):  # interleaved, so machine load weighs on every tool alike
            for peer in peers:
                ws = workspaces[(peer, shape)]
                (ws / "terraform.tfstate").write_bytes(state)
                cmd = [str(CACHE / "bin" / peer), "apply", "-refresh-only", "-auto-approve", "-input=false",
                       "-var-file=size.tfvars"]
                res.peers[peer].append(_run(cmd, ws, _peer_env()))
            res.kl.append(_run(kl_cmd, kl_dir, kl_env))

    # The gate's shape: where the fastest peer is fastest.
    gate_shape = min(results.values(), key=lambda r: r.fastest_peer()[1])
    best_peer, best_t = gate_shape.fastest_peer()
    kl_t = ShapeResult.median(gate_shape.kl)
    speedup = best_t / kl_t
    cpu_speedup = ShapeResult.cpu(gate_shape.peers[best_peer]) / ShapeResult.cpu(gate_shape.kl)
    lines = []
    for r in results.values():
        peer, peer_t = r.fastest_peer()
        k = ShapeResult.median(r.kl)
        each = ", ".join(f"{p} {ShapeResult.median(s):.2f} s (cpu {ShapeResult.cpu(s):.2f}) {_mib(ShapeResult.peak(s))}"
                         for p, s in r.peers.items())
        lines.append(f"refresh {size} ({r.shape}): kl.pyz {k:.2f} s (cpu {ShapeResult.cpu(r.kl):.2f}) "
                     f"{_mib(ShapeResult.peak(r.kl))}; {each}; {peer_t / k:.2f}x the fastest ({peer})")
        benchmark.extra_info[r.shape] = {"kl_s": round(k, 3), "kl_rss_kib": ShapeResult.peak(r.kl),
                                         "kl_cpu_s": round(ShapeResult.cpu(r.kl), 3),
                                         **{f"{p}_s": round(ShapeResult.median(s), 3) for p, s in r.peers.items()},
                                         **{f"{p}_cpu_s": round(ShapeResult.cpu(s), 3) for p, s in r.peers.items()},
                                         **{f"{p}_rss_kib": ShapeResult.peak(s) for p, s in r.peers.items()},
                                         "speedup_vs_fastest": round(peer_t / k, 2)}
    lines.append(f"refresh {size}: gate shape {gate_shape.shape}, fastest peer {best_peer} {best_t:.2f} s, kl.pyz {kl_t:.2f} s: "
                 f"{speedup:.2f}x (target {target}x, gate {gate}x); CPU time {cpu_speedup:.2f}x (gate {cpu_gate}x)")
    benchmark.extra_info.update(instances=size, speedup_vs_fastest=round(speedup, 2), gate=gate, target=target,
                                cpu_speedup_vs_fastest=round(cpu_speedup, 2), cpu_gate=cpu_gate)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)  # the figures are in extra_info
    for line in lines:
        bench_summary.append(line)
        print("\n" + line)
    for r in results.values():
        kl_rss = ShapeResult.peak(r.kl)
        for peer, samples in r.peers.items():
            assert kl_rss < ShapeResult.peak(samples) * RSS_GATE, (
                f"{size} ({r.shape}): kl's peak RSS with its providers, {kl_rss} KiB, is not below {RSS_GATE:g}x "
                f"{peer}'s {ShapeResult.peak(samples)} KiB")
    assert speedup >= gate, f"{size} instances: kl.pyz is {speedup:.2f}x the fastest peer ({best_peer}); the gate is {gate}x"
    if cpu_gate is not None:
        assert cpu_speedup >= cpu_gate, (f"{size} instances: kl.pyz used 1/{cpu_speedup:.2f} of the CPU time of the fastest "
                                         f"peer ({best_peer}); the gate is {cpu_gate}x")
