"""kl.pyz under test: built once per session by build_zipapp.py, run by Debian's python3 in isolated
mode (no site-packages of ours), with a fresh HOME per run unless a test shares one on purpose.

KL_TEST_PYZ=path reuses a kl.pyz built earlier in the same CI run instead of building here.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kit.paths import LOCAL_V, PLUGIN_CACHE, TERRAFORM
from kit.pyz import build, clean_env, codec_wheel_dir
from kit.tfworkspace import terraform

HOST_PYTHON = Path("/usr/bin/python3")
OUR_DEPS = ("grpc", "psycopg", "psycopg_binary", "google.protobuf", "kilolock")

Run = Callable[..., subprocess.CompletedProcess]


@pytest.fixture(scope="session")
def pyz_build_dir() -> Iterator[Path]:
    # World-readable: a read-only-HOME test runs kl.pyz as an unprivileged user.
    d = Path(tempfile.mkdtemp(prefix="kl-pyz-test-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def pyz(pyz_build_dir: Path) -> Path:
    prebuilt = os.environ.get("KL_TEST_PYZ")
    if prebuilt:
        if not Path(prebuilt).is_file():
            pytest.fail(f"KL_TEST_PYZ={prebuilt} is not a file: build it with `python build_zipapp.py`", pytrace=False)
        out = pyz_build_dir / "kl.pyz"
        shutil.copyfile(prebuilt, out)
        return out
    return build(pyz_build_dir / "kl.pyz")


@pytest.fixture(scope="session")
def codec_args(pyz: Path) -> list[str]:
    """Reuse the codec wheel the default build made, so extra builds need no second maturin run:
    the one of this checkout's sources, not another checkout's built meanwhile."""
    wheels = sorted(codec_wheel_dir().glob("kilolock-*-abi3-*.whl"), key=lambda p: p.stat().st_mtime)
    return ["--codec-wheel", str(wheels[-1])] if wheels else []


@pytest.fixture(scope="session")
def lean_pyz(pyz_build_dir: Path, codec_args: list[str]) -> Path:
    """A leaner target: CPython 3.12 only (the host python is 3.11, so its natives do not match)."""
    return build(pyz_build_dir / "kl-312.pyz", "--python", "3.12", *codec_args)


@pytest.fixture(scope="session")
def host_python() -> Path:
    if not HOST_PYTHON.exists():
        pytest.fail(f"{HOST_PYTHON} is missing: install Debian's python3 (apt-get install python3)", pytrace=False)
    probe = ("import importlib.util, sys\n"
             "def has(m):\n"
             "    try: return importlib.util.find_spec(m) is not None\n"
             "    except ImportError: return False\n"
             f"print(','.join(m for m in {OUR_DEPS!r} if has(m)))")
    r = subprocess.run([str(HOST_PYTHON), "-I", "-c", probe], capture_output=True, text=True, check=True)
    if r.stdout.strip():
        pytest.fail(f"{HOST_PYTHON} -I can import {r.stdout.strip()}: the pyz tests need a python without "
                    "kilolock's dependencies (remove them from its dist-packages)", pytrace=False)
    return HOST_PYTHON


@pytest.fixture
def home(tmp_path: Path) -> Path:
    h = tmp_path / "home"
    h.mkdir()
    return h


@pytest.fixture
def run_pyz(pyz: Path, host_python: Path, home: Path) -> Run:
    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, pyz_file: Path | None = None,
            python: Path | None = None, py_args: tuple[str, ...] = (), timeout: float = 180,
            **popen) -> subprocess.CompletedProcess:
        full = clean_env(home)
        full.update(env or {})
        return subprocess.run([str(python or host_python), "-I", *py_args, str(pyz_file or pyz), *args], env=full,
                              cwd=str(cwd or home), capture_output=True, text=True, timeout=timeout, **popen)

    return run


SMALL_TF = f"""
terraform {{
  required_providers {{
    null  = {{ source = "hashicorp/null", version = "2.1.2" }}
    local = {{ source = "hashicorp/local", version = "{LOCAL_V}" }}
  }}
}}
resource "null_resource" "n" {{
  count    = 2
  triggers = {{ index = count.index }}
}}
resource "local_file" "f" {{
  for_each = toset(["one", "two"])
  filename = "${{path.module}}/out/${{each.key}}.txt"
  content  = "hello ${{each.key}}"
}}
"""


@pytest.fixture(scope="session")
def small_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    for path, script in ((TERRAFORM, "scripts/test-terraform.sh"),
                         (PLUGIN_CACHE / "registry.terraform.io/hashicorp/local" / LOCAL_V, "scripts/test-providers.sh"),
                         (PLUGIN_CACHE / "registry.terraform.io/hashicorp/null/2.1.2", "scripts/test-providers.sh")):
        if not path.exists():
            pytest.fail(f"{path} is missing: run {script}", pytrace=False)
    ws = tmp_path_factory.mktemp("pyz-tf")
    (ws / "main.tf").write_text(SMALL_TF)
    terraform(ws, "init")
    terraform(ws, "apply", "-auto-approve")
    return ws
