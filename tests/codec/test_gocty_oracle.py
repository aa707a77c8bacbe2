"""Both codec backends against go-cty itself (tests/codec/gocty_oracle/, built by the test at the
versions Terraform 1.12.2 and 1.8.5 pin and at the newest go-cty the proxy serves): fixed edge cases and random types and values, each
decoded from msgpack as a provider sends it and encoded from JSON as state holds it. Each case
must give byte-identical results from the two backends, and what go-cty gives (see the oracle's
doc comment for how results are compared). docs/paths-and-values.md ("Values: what Terraform would write") lists
what is deliberately different, and none of it is drawn here.

KL_GOCTY_CASES sets the number of random cases (CI: 2,000; a longer run: 100,000), KL_GOCTY_SEED
the seed (default: fixed, so a failure reproduces).
"""
from __future__ import annotations

import json
import os
import subprocess
import types
from typing import Any

import pytest

from kilolock.codec import CodecError
from kit.codec import load_backend
from kit.gocty import oracle_binary

CASES = int(os.environ.get("KL_GOCTY_CASES", "2000"))
SEED = int(os.environ.get("KL_GOCTY_SEED", "16"))


def _result(fn: Any, arg: bytes) -> dict[str, str]:
    try:
        out: bytes = fn(arg)
    except CodecError as exc:
        return {"err": str(exc)}
    return {"ok": out.hex() if fn.__name__ == "encode" else out.decode()}


def _kl_results(backends: tuple[types.ModuleType, types.ModuleType], case: dict[str, Any]) -> None:
    """Adds kl's "dec" and "enc" to the case, after checking both backends give the same."""
    type_bytes = json.dumps(case["type"], separators=(",", ":"), ensure_ascii=False).encode()
    compiled = [impl.compile_type(type_bytes) for impl in backends]
    directions = []
    if "mp" in case:
        directions.append(("dec", "decode", bytes.fromhex(case["mp"])))
    if "json" in case:
        directions.append(("enc", "encode", case["json"].encode()))
    for key, method, arg in directions:
        py, rs = (_result(getattr(t, method), arg) for t in compiled)
        assert py == rs, f"backends differ on {case['name']} ({method} {arg!r}): python {py} / rust {rs}"
        case[key] = rs


@pytest.mark.parametrize("pins", ["terraform-1.12.2", "terraform-1.8.5", "go-cty-1.20.0"])
def test_both_backends_write_what_gocty_writes(pins: str) -> None:
    oracle = oracle_binary(pins)
    generated = subprocess.run([str(oracle), "gen", "-seed", str(SEED), "-n", str(CASES)],
                               capture_output=True, text=True, timeout=600, check=True)
    backends = (load_backend("python"), load_backend("rust"))
    lines = []
    for line in generated.stdout.splitlines():
        case = json.loads(line)
        _kl_results(backends, case)
        lines.append(json.dumps(case, ensure_ascii=False))
    args = [str(oracle), "check"]
    if pins == "terraform-1.8.5":
        # go-cty v1.14 sends an integer beyond int64 that float64 holds as a float64, v1.16 as
        # text; kl sends what 1.12.2 does, so against 1.8.5 the wire is compared by value.
        args.append("-wire-by-value")
    checked = subprocess.run(args, input="\n".join(lines) + "\n", capture_output=True, text=True,
                             timeout=600, check=True)
    *disagreements, summary_line = checked.stdout.splitlines()
    summary = json.loads(summary_line)["summary"]
    assert sum(summary.values()) == 2 * len(lines) - sum(1 for ln in lines if '"mp":' not in ln or '"json":' not in ln)
    assert summary["decode_agree"] > CASES // 4 and summary["encode_agree"] > CASES // 4, summary
    assert not disagreements, f"{len(disagreements)} disagreements with go-cty ({summary}):\n" + "\n".join(disagreements[:20])


def test_the_oracle_reports_what_kl_used_to_write() -> None:
    """The check itself can fail: kl's old float64 digits (float64's shortest round trip), an
    unnormalized string and a float64 on the wire where go-cty v1.16 sends text are each reported."""
    oracle = oracle_binary("terraform-1.12.2")
    wrong: list[dict[str, Any]] = [
        {"name": "old float digits", "type": "number", "mp": "cb43f0000000000000", "dec": {"ok": "18446744073709552000"}},
        {"name": "not NFC", "type": "string", "mp": "a365cc81", "dec": {"ok": '"e\u0301"'}},
        {"name": "2^64 as float64", "type": "number", "json": "18446744073709551616", "enc": {"ok": "cb43f0000000000000"}},
        {"name": "mixed list accepted", "type": ["list", "dynamic"], "json": '[{"type":"number","value":1},{"type":"string","value":"a"}]',
         "enc": {"ok": "92"}},
    ]
    checked = subprocess.run([str(oracle), "check"], input="".join(json.dumps(c) + "\n" for c in wrong),
                             capture_output=True, text=True, timeout=120, check=True)
    *disagreements, _ = checked.stdout.splitlines()
    assert sorted(json.loads(d)["name"] for d in disagreements) == sorted(c["name"] for c in wrong)
