"""Codec speed: JSON -> msgpack -> JSON for a realistic corpus, Rust vs pure Python vs the
schema-less C floor (stdlib json + msgpack-python), gated on ratios measured in this run.

Gates: Rust >= 10x faster than pure Python; Rust no slower than 2x the C floor.
KL_BENCH_QUICK=1 runs few rounds (CI); the gates still apply.
"""
from __future__ import annotations

import gc
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from kilolock.codec import block_type_json, pure
from kilolock.schema import Attribute, Block, NestedBlock, NestingMode
from kit.codec import BUILD_HINT

try:
    from kilolock._native import codec as native_codec
except ImportError:  # the gate tests fail with the build hint (kit.codec)
    native_codec = None  # type: ignore[assignment]

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"


# --- corpus ---------------------------------------------------------------------------------------

def _attr(name: str, ty: str, *, sensitive: bool = False) -> Attribute:
    return Attribute(name=name, type=ty.encode(), optional=True, sensitive=sensitive)


def _rule_block() -> Block:
    return Block(attributes=(
        _attr("cidr_blocks", '["list","string"]'), _attr("description", '"string"'),
        _attr("from_port", '"number"'), _attr("to_port", '"number"'), _attr("protocol", '"string"'),
        _attr("ipv6_cidr_blocks", '["list","string"]'), _attr("prefix_list_ids", '["list","string"]'),
        _attr("security_groups", '["set","string"]'), _attr("self", '"bool"'),
    ))


def _device_block(extra: int) -> Block:
    attrs = [_attr("device_name", '"string"'), _attr("volume_size", '"number"'), _attr("volume_type", '"string"'),
             _attr("iops", '"number"'), _attr("throughput", '"number"'), _attr("encrypted", '"bool"'),
             _attr("kms_key_id", '"string"'), _attr("delete_on_termination", '"bool"'),
             _attr("tags", '["map","string"]')]
    attrs += [_attr(f"device_extra_{i:02d}", '"string"') for i in range(extra)]
    return Block(attributes=tuple(attrs))


def aws_like_block() -> Block:
    attrs: list[Attribute] = []
    attrs += [_attr(f"str_attr_{i:03d}", '"string"') for i in range(55)]
    attrs += [_attr(f"num_attr_{i:03d}", '"number"') for i in range(18)]
    attrs += [_attr(f"bool_attr_{i:03d}", '"bool"') for i in range(12)]
    attrs += [
        _attr("id", '"string"'), _attr("arn", '"string"'), _attr("tags", '["map","string"]'),
        _attr("tags_all", '["map","string"]'), _attr("security_groups", '["set","string"]'),
        _attr("vpc_security_group_ids", '["set","string"]'), _attr("secondary_private_ips", '["list","string"]'),
        _attr("cpu_core_count", '"number"'), _attr("spot_price", '"number"'),
        _attr("user_data_config", '"dynamic"'), _attr("password_data", '"string"', sensitive=True),
    ]
    blocks = (
        NestedBlock("ingress", _rule_block(), NestingMode.SET),
        NestedBlock("egress", _rule_block(), NestingMode.SET),
        NestedBlock("ebs_block_device", _device_block(3), NestingMode.SET),
        NestedBlock("root_block_device", _device_block(0), NestingMode.LIST, max_items=1),
        NestedBlock("metadata_options", Block(attributes=(
            _attr("http_endpoint", '"string"'), _attr("http_tokens", '"string"'),
            _attr("http_put_response_hop_limit", '"number"'), _attr("instance_metadata_tags", '"string"'))),
            NestingMode.LIST, max_items=1),
        NestedBlock("timeouts", Block(attributes=(_attr("create", '"string"'), _attr("delete", '"string"'))),
                    NestingMode.SINGLE),
    )
    return Block(attributes=tuple(attrs), block_types=blocks)


def _rule(i: int) -> dict[str, Any]:
    return {"cidr_blocks": [f"10.{i}.0.0/16", f"172.16.{i}.0/24"], "description": f"rule number {i} for service traffic",
            "from_port": 1000 + i, "to_port": 2000 + i, "protocol": "tcp", "ipv6_cidr_blocks": [],
            "prefix_list_ids": [], "security_groups": [f"sg-{i:017x}"], "self": i % 2 == 0}


def _device(i: int, extra: int) -> dict[str, Any]:
    d: dict[str, Any] = {"device_name": f"/dev/sd{chr(98 + i)}", "volume_size": 100 * (i + 1), "volume_type": "gp3",
                         "iops": 3000, "throughput": 125, "encrypted": True,
                         "kms_key_id": f"arn:aws:kms:eu-west-1:123456789012:key/{i:08d}-aaaa-bbbb-cccc-000000000000",
                         "delete_on_termination": True, "tags": {"Name": f"disk-{i}", "Backup": "daily"}}
    d.update({f"device_extra_{j:02d}": f"value {j}" for j in range(extra)})
    return d


def aws_like_value() -> dict[str, Any]:
    v: dict[str, Any] = {f"str_attr_{i:03d}": f"value-{i}-" + "x" * (i % 23) for i in range(55)}
    v.update({f"num_attr_{i:03d}": (i * 37 if i % 3 else i + 0.5) for i in range(18)})
    v.update({f"bool_attr_{i:03d}": i % 2 == 0 for i in range(12)})
    tags = {f"tag-key-{i:02d}": f"tag value number {i}" for i in range(20)}
    v.update({
        "id": "i-0123456789abcdef0", "arn": "arn:aws:ec2:eu-west-1:123456789012:instance/i-0123456789abcdef0",
        "tags": tags, "tags_all": {**tags, "ManagedBy": "terraform"},
        "security_groups": [f"sg-{i:017x}" for i in range(5)],
        "vpc_security_group_ids": [f"sg-{i:017x}" for i in range(5, 9)],
        "secondary_private_ips": ["10.0.1.10", "10.0.1.11"], "cpu_core_count": 4, "spot_price": 0.0125,
        "user_data_config": {"value": {"packages": ["nginx", "jq"], "runcmd": [["systemctl", "start", "nginx"]],
                                        "write_files": [{"path": "/etc/motd", "content": "hello", "mode": 420}]},
                             "type": ["object", {"packages": ["list", "string"],
                                                 "runcmd": ["list", ["list", "string"]],
                                                 "write_files": ["list", ["object", {"content": "string",
                                                                                     "mode": "number",
                                                                                     "path": "string"}]]}]},
        "password_data": "",
        "ingress": [_rule(i) for i in range(10)], "egress": [_rule(100 + i) for i in range(3)],
        "ebs_block_device": [_device(i, 3) for i in range(3)], "root_block_device": [_device(9, 0)],
        "metadata_options": [{"http_endpoint": "enabled", "http_tokens": "required",
                              "http_put_response_hop_limit": 2, "instance_metadata_tags": "disabled"}],
        "timeouts": None,
    })
    return v


def _jsonb_order(value: Any) -> Any:
    """Keys as PostgreSQL's jsonb keeps them (shorter first, then bytewise): not the wire order."""
    if isinstance(value, dict):
        return {k: _jsonb_order(value[k]) for k in sorted(value, key=lambda k: (len(k.encode()), k.encode()))}
    if isinstance(value, list):
        return [_jsonb_order(x) for x in value]
    return value


NULL_BLOCK = Block(attributes=(Attribute(name="id", type=b'"string"', computed=True),
                               Attribute(name="triggers", type=b'["map","string"]', optional=True)))
NULL_VALUE = {"id": "8374659283746529384", "triggers": {"always": "2026-11-29T11:00:00Z", "version": "3"}}

CORPORA = {
    # Terraform writes state with sorted keys (the codec's direct path).
    "aws_like": (aws_like_block(), json.dumps(aws_like_value(), sort_keys=True, separators=(",", ":")).encode()),
    # The same resource as text from a jsonb column: other key order, spaced separators.
    "aws_like_jsonb": (aws_like_block(), json.dumps(_jsonb_order(aws_like_value())).encode()),
    "null_resource": (NULL_BLOCK, json.dumps(NULL_VALUE, sort_keys=True, separators=(",", ":")).encode()),
}


# --- the three contenders -------------------------------------------------------------------------

def _roundtrip(compiled: Any, data: bytes) -> Callable[[], bytes]:
    encode, decode = compiled.encode, compiled.decode
    return lambda: decode(encode(data))


def _c_floor(data: bytes) -> Callable[[], bytes]:
    loads, dumps, packb, unpackb = json.loads, json.dumps, msgpack.packb, msgpack.unpackb
    return lambda: dumps(unpackb(packb(loads(data)))).encode()


def _contender(name: str, corpus: str) -> Callable[[], bytes]:
    block, data = CORPORA[corpus]
    if name == "c_floor":
        return _c_floor(data)
    if name == "python":
        return _roundtrip(pure.compile_type(block_type_json(block)), data)
    if native_codec is None:
        pytest.fail(BUILD_HINT)
    return _roundtrip(native_codec.compile_type(block_type_json(block)), data)


def _rounds(contender: str, corpus: str) -> tuple[int, int]:
    """(rounds, calls per round) for one contender on one corpus."""
    small = corpus == "null_resource"
    iterations = (200 if small else 20) if QUICK else (2000 if small else 100)
    rounds = 12 if QUICK else 30
    if contender == "python":
        iterations = max(1, iterations // 10)
    return rounds, iterations


@pytest.mark.parametrize("corpus", list(CORPORA))
@pytest.mark.parametrize("contender", ["rust", "python", "c_floor"])
def test_roundtrip_speed(benchmark: Any, contender: str, corpus: str) -> None:
    fn = _contender(contender, corpus)
    fn()  # warm up (and prove it works)
    rounds, iterations = _rounds(contender, corpus)
    benchmark.group = corpus
    benchmark.pedantic(fn, rounds=rounds, iterations=iterations, warmup_rounds=1)


# The gates' rounds: the three contenders take turns, round after round, so a stall of the shared
# machine slows each of them alike. Timed one after another, Rust's whole quick measurement lasted
# ~40 ms, and one stall that long made even its fastest round 46% slow (9.8x Python in a CI run
# where 14-16x is usual).
GATE_ROUNDS = 30


def _best_times(corpus: str) -> dict[str, float]:
    """Seconds per call in each contender's fastest round (on a shared machine noise only ever
    adds time), timed here rather than taken from test_roundtrip_speed: a gate holds on its own,
    whatever ran before it, in any order or alone, and with --benchmark-disable too."""
    names = ("rust", "python", "c_floor")
    fns = {name: _contender(name, corpus) for name in names}
    best = dict.fromkeys(names, math.inf)
    for fn in fns.values():
        fn()  # warm up
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as the bench run's --benchmark-disable-gc (and timeit) time it
    try:
        for _ in range(GATE_ROUNDS):
            for name, fn in fns.items():
                iterations = _rounds(name, corpus)[1]
                start = time.perf_counter()
                for _ in range(iterations):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - start) / iterations)
    finally:
        if gc_was_enabled:
            gc.enable()
    return best


@pytest.mark.parametrize("corpus", list(CORPORA))
def test_gates(corpus: str, bench_summary: list[str]) -> None:
    best = _best_times(corpus)
    rust, python, floor = best["rust"], best["python"], best["c_floor"]
    size = len(CORPORA[corpus][1])
    bench_summary.append(
        f"{corpus:15s} {size:6d} B JSON | rust {rust * 1e6:8.1f} µs ({size / rust / 1e6:6.1f} MB/s) | "
        f"python {python * 1e6:9.1f} µs ({size / python / 1e6:5.1f} MB/s) | "
        f"C floor {floor * 1e6:8.1f} µs ({size / floor / 1e6:6.1f} MB/s) | "
        f"python/rust {python / rust:5.1f}x | rust/floor {rust / floor:4.2f}x")
    assert python / rust >= 10, f"{corpus}: Rust only {python / rust:.1f}x faster than pure Python (gate: 10x)"
    assert rust <= 2 * floor, f"{corpus}: Rust {rust / floor:.2f}x the C floor (gate: at most 2x)"


def test_roundtrips_agree() -> None:
    """The contenders do the same work: Rust and Python give identical bytes here."""
    for corpus in CORPORA:
        assert _contender("rust", corpus)() == _contender("python", corpus)(), corpus
