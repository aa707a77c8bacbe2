"""The go-cty oracle (tests/codec/gocty_oracle/): built from source with go at the go-cty version
a Terraform release pins, and at the newest go-cty the module proxy serves, once per source hash,
into the test cache like the other binaries."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kit.paths import CACHE, REPO

SOURCE = REPO / "tests" / "codec" / "gocty_oracle"
# What the oracle is built against -> the go.mod that pins its go-cty, x/text and msgpack: what
# Terraform 1.12.2 pins (go-cty v1.16.2), what 1.8.5 pins (v1.14.3), and go-cty v1.20.0, the newest
# the proxy serves, with 1.12.2's x/text and msgpack. Each go.mod has its go.sum beside it.
MODFILES = {"terraform-1.12.2": "go.mod", "terraform-1.8.5": "go.tf1.8.mod", "go-cty-1.20.0": "go.cty1.20.mod"}


def oracle_binary(pins: str) -> Path:
    """The oracle built against MODFILES[pins]; fails the test naming what is missing."""
    modfile = MODFILES[pins]
    # The Go sources and this build's own go.mod and go.sum: another build's files changing (or
    # one added) leaves this binary cached.
    digest = hashlib.sha256()
    for name in sorted(p.name for p in SOURCE.iterdir() if p.suffix == ".go") + [modfile, modfile.removesuffix(".mod") + ".sum"]:
        digest.update(name.encode() + b"\0" + (SOURCE / name).read_bytes())
    target = CACHE / "gocty-oracle" / f"oracle-{pins}-{digest.hexdigest()[:16]}"
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        pytest.fail("the go-cty oracle needs Go >= 1.25 on PATH to build tests/codec/gocty_oracle "
                    "(the module proxy serves its modules); install Go, or run scripts/setup-dev.sh's prerequisites")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    env = {**os.environ, "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"}
    result = subprocess.run([go, "build", f"-modfile={modfile}", "-o", str(partial), "."], cwd=SOURCE, env=env,
                            capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        pytest.fail(f"building the go-cty oracle ({modfile}) failed:\n{result.stderr[-3000:]}")
    partial.replace(target)
    for stale in target.parent.glob(f"oracle-{pins}-*"):
        if stale != target and not stale.name.endswith(".partial"):  # built from sources since changed
            stale.unlink(missing_ok=True)
    return target
