"""The native extension, kilolock._native: one submodule per job, each importable on its own and
holding only that job's names, so a layer can be allowed one job without the others
(tests/test_architecture.py)."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from kit.codec import BUILD_HINT
from kit.paths import REPO

JOBS = {
    "codec": {"CodecType", "MAX_DEPTH", "compile_type"},
    "transport": {"H2Channel", "H2Stream"},
    "p256": {"generate", "sign"},
}


def _public(module: object) -> set[str]:
    return {name for name in dir(module) if not name.startswith("_")}


@pytest.fixture(scope="module")
def native() -> object:
    try:
        return importlib.import_module("kilolock._native")
    except ImportError as exc:
        pytest.fail(f"{BUILD_HINT} ({exc})")


def test_each_job_is_a_submodule_with_only_its_names(native: object) -> None:
    assert _public(native) == set(JOBS)
    for job, names in JOBS.items():
        sub = getattr(native, job)
        assert sub.__name__ == f"kilolock._native.{job}"
        assert _public(sub) == names, job
        for name in names:
            module = getattr(getattr(sub, name), "__module__", sub.__name__)
            assert module == sub.__name__, f"{job}.{name} says it is from {module}"


@pytest.mark.parametrize("job", sorted(JOBS))
def test_a_submodule_imports_alone_in_a_fresh_interpreter(native: object, job: str) -> None:
    # Both spellings, as the first import of the extension: an extension module is no package,
    # so `import kilolock._native.JOB` works only if the extension put JOB in sys.modules itself.
    code = (f"import kilolock._native.{job} as a\n"
            f"from kilolock._native import {job} as b\n"
            "assert a is b, (a, b)\n"
            "print(a.__name__)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"kilolock._native.{job}"
