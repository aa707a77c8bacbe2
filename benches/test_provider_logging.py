"""What kl's quiet plugin-log default buys: ReadResource against the time provider (terraform-plugin-go,
TRACE logging by default, as Terraform runs it) versus kl's default (provider asked for WARN).
Ratio gate measured in this run; KL_BENCH_QUICK=1 for CI."""
from __future__ import annotations

import os
import statistics
import time

import msgpack
import pytest

from kilolock.provider import launch_provider
from kilolock.provider.client import ProviderClient
from kit.providers import BY_TYPE, require

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
CALLS = 100 if QUICK else 600
ROUNDS = 3 if QUICK else 5
GATE = 0.8  # the quiet default must save at least a fifth of the per-read cost


def _open(monkeypatch: pytest.MonkeyPatch, trace: bool) -> tuple[ProviderClient, bytes]:
    with monkeypatch.context() as m:
        for var in ("TF_LOG", "KL_LOG", "TF_LOG_PROVIDER"):
            m.delenv(var, raising=False)
        if trace:
            m.setenv("TF_LOG_SDK", "trace")  # what an unset level means inside the provider
            m.setenv("TF_LOG_SDK_PROTO", "trace")
            m.setenv("TF_LOG_SDK_FRAMEWORK", "trace")
            m.setenv("TF_LOG_PROVIDER", "trace")
        client = launch_provider(require(BY_TYPE["time"]), tls=False)
    schema = client.get_schema().resource_schemas["time_static"]
    state = {a.name: None for a in schema.block.attributes} | {"id": "2024-01-02T03:04:05Z", "rfc3339": "2024-01-02T03:04:05Z"}
    client.configure(b"\x80")
    return client, msgpack.packb(state)


def _per_call(client: ProviderClient, state: bytes) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        client.read_resource("time_static", state)
    return (time.perf_counter() - start) / CALLS


def test_quiet_plugin_logs_cut_read_cost(benchmark, monkeypatch: pytest.MonkeyPatch) -> None:
    noisy, state = _open(monkeypatch, trace=True)
    quiet, _ = _open(monkeypatch, trace=False)
    try:
        _per_call(noisy, state), _per_call(quiet, state)
        n, q = [], []
        for _ in range(ROUNDS):
            n.append(_per_call(noisy, state))
            q.append(_per_call(quiet, state))
        trace_cost, quiet_cost = statistics.median(n), statistics.median(q)
        ratio = quiet_cost / trace_cost
        benchmark.extra_info.update({"trace_ms": round(trace_cost * 1e3, 4), "quiet_ms": round(quiet_cost * 1e3, 4), "ratio": round(ratio, 3)})
        benchmark.pedantic(lambda: quiet.read_resource("time_static", state), rounds=CALLS, iterations=1)
    finally:
        noisy.close()
        quiet.close()
    print(f"\ntime_static ReadResource: provider TRACE logs {trace_cost*1e3:.3f} ms, kl default {quiet_cost*1e3:.3f} ms, ratio {ratio:.2f}")
    assert ratio < GATE
