"""Helpers shared by the kl.pyz tests and the start-up bench (the fixtures live in tests/pyz/conftest.py)."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.paths import CACHE, REPO

WHEEL_CACHE = CACHE / "pyz-wheels"


def build(out: Path, *extra: str) -> Path:
    """Run build_zipapp.py; a build that cannot run fails the session with its own message."""
    cmd = [sys.executable, str(REPO / "build_zipapp.py"), "-o", str(out), "--wheel-cache", str(WHEEL_CACHE), *extra]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        pytest.fail(f"cannot build kl.pyz ({' '.join(cmd[1:])}):\n{r.stderr.strip()}\n"
                    "it needs network access to PyPI on the first run (wheels are cached in "
                    f"{WHEEL_CACHE}), maturin and a Rust toolchain (scripts/setup-dev.sh)", pytrace=False)
    assert out.is_file() and "sha256" in r.stdout, r.stdout
    return out


def codec_wheel_dir(cache: Path = WHEEL_CACHE, repo: Path = REPO) -> Path:
    """Where build_zipapp.py puts the codec wheel of REPO's sources (its own function, loaded from the file)."""
    spec = importlib.util.spec_from_file_location("build_zipapp", REPO / "build_zipapp.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return Path(module.codec_wheel_dir(cache, repo))


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """What a CI runner would have: PATH and HOME, no PYTHONPATH, plus the test database if any."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    for key in ("KL_DATABASE_URL", "KL_TEST_SESSION"):
        if key in os.environ:
            env[key] = os.environ[key]
    env.update(extra)
    return env


def version_fields(stdout: str) -> dict[str, str]:
    fields = {}
    for line in stdout.splitlines():
        key, _, value = line.partition("  ")
        fields[key.strip()] = value.strip()
    return fields


def unit_dir(cache_root: Path) -> Path:
    """The one extraction dir under a cache root (fails if there is not exactly one)."""
    units = [p for p in cache_root.iterdir() if not p.name.startswith(".")]
    assert len(units) == 1, f"expected one extraction in {cache_root}: {sorted(p.name for p in cache_root.iterdir())}"
    return units[0]


def extracted_files(unit: Path) -> dict[str, list[int]]:
    return json.loads((unit / ".kl-extracted.json").read_text())["files"]


def find_python(minor: str) -> Path:
    """A CPython 3.<minor> interpreter: $KL_TEST_PYTHON3<minor>, the system's, or pyenv's (under
    $PYENV_ROOT, where pyenv keeps them when that is set, else ~/.pyenv)."""
    env = os.environ.get(f"KL_TEST_PYTHON3{minor}", "")
    candidates = [Path(p) for p in (env, f"/usr/bin/python3.{minor}", f"/usr/local/bin/python3.{minor}") if p]
    for root in dict.fromkeys(Path(p) for p in (os.environ.get("PYENV_ROOT", ""), Path.home() / ".pyenv") if str(p)):
        candidates += sorted(root.glob(f"versions/3.{minor}.*/bin/python3.{minor}"))
    found = next((p for p in candidates if p.exists()), None)
    if found is None:
        pytest.fail(f"no CPython 3.{minor} found (set KL_TEST_PYTHON3{minor}, or install one: apt-get install "
                    f"python3.{minor}, pyenv install 3.{minor}, or uv python install 3.{minor})", pytrace=False)
    return found
