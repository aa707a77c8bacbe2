"""kilolock.lazyimports: a deferred module runs its code at its first use, once, and is then the
module an import would have given. Each case runs in a fresh interpreter (the placeholders live in
sys.modules), with a module of the test's own that counts how often its code ran."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from kit.paths import REPO

# A leaf module that records each run of its code in a list the test can read.
_COUNTED = """
import builtins
builtins.kl_runs = getattr(builtins, "kl_runs", 0) + 1
import time
time.sleep(0.05)  # long enough for the other threads to ask while it runs
VALUE = 42
def double(x):
    return 2 * x
"""


def _run(tmp_path: Path, body: str) -> str:
    (tmp_path / "counted.py").write_text(_COUNTED)
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "leaf.py").write_text(_COUNTED)
    script = f"import sys\nsys.path[:0] = [{str(tmp_path)!r}, {str(REPO)!r}]\nimport builtins\n" + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_deferred_module_runs_at_its_first_use_and_is_the_same_module_after(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        from kilolock import lazyimports
        lazyimports.install(["counted"])
        import counted
        assert lazyimports.deferred("counted")
        from counted import VALUE  # the first use: the module's code runs now
        assert getattr(builtins, "kl_runs", 0) == 1 and VALUE == 42
        import counted as again
        assert again is counted and sys.modules["counted"] is counted and type(counted).__name__ == "module"
        assert counted.double(2) == 4 and not lazyimports.deferred("counted")
        print(builtins.kl_runs)
    """)
    assert out == "1"


def test_importing_a_deferred_module_runs_nothing(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        from kilolock import lazyimports
        lazyimports.install(["counted", "pkg.leaf"])
        import counted, pkg.leaf
        from pkg import leaf
        print(getattr(builtins, "kl_runs", 0), lazyimports.deferred("counted"), lazyimports.deferred("pkg.leaf"),
              pkg.leaf is leaf is sys.modules["pkg.leaf"])
        print(leaf.double(3), builtins.kl_runs)
    """)
    assert out.splitlines() == ["0 True True True", "6 1"]


def test_threads_asking_at_once_run_its_code_once(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        import threading
        from kilolock import lazyimports
        lazyimports.install(["counted"])
        import counted
        got = []
        threads = [threading.Thread(target=lambda: got.append(counted.VALUE)) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(builtins.kl_runs, got)
    """)
    assert out == "1 [42, 42, 42, 42, 42, 42, 42, 42]"


def test_a_module_already_imported_a_package_or_a_missing_one_is_left_alone(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        from kilolock import lazyimports
        import counted
        lazyimports.install(["counted", "pkg", "no_such_module"])
        import pkg
        try:
            import no_such_module
        except ModuleNotFoundError as exc:
            print(exc)
        print(lazyimports.deferred("counted"), lazyimports.deferred("pkg"), counted.VALUE, builtins.kl_runs)
    """)
    assert out.splitlines() == ["No module named 'no_such_module'", "False False 42 1"]


def test_installing_imports_nothing(tmp_path: Path) -> None:
    # `kl version` must not import protobuf because a module of it is deferred.
    out = _run(tmp_path, """
        from kilolock import lazyimports
        before = set(sys.modules)
        lazyimports.own_process()
        print(sorted(set(sys.modules) - before))
    """)
    assert out == "[]"


def test_a_module_whose_code_fails_fails_its_use_and_is_imported_again_next_time(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import builtins\nbuiltins.kl_runs = getattr(builtins, 'kl_runs', 0) + 1\n"
                                        "if builtins.kl_runs == 1:\n    raise RuntimeError('first time')\nVALUE = 7\n")
    out = _run(tmp_path, """
        from kilolock import lazyimports
        lazyimports.install(["broken"])
        import broken
        try:
            broken.VALUE
        except RuntimeError as exc:
            print("failed:", exc, "broken" in sys.modules)
        import broken
        print(broken.VALUE, builtins.kl_runs)
    """)
    assert out.splitlines() == ["failed: first time False", "7 2"]


def test_kls_own_list_is_deferred_and_each_still_works_when_used(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        from kilolock import lazyimports
        lazyimports.own_process()
        import copy, tokenize
        from google.protobuf.internal import python_message
        print(all(lazyimports.deferred(n) for n in lazyimports.UNUSED))
        print(copy.deepcopy([[1]]), "x", tokenize.NAME > 0, callable(python_message._AttachFieldHelpers))
        print(any(lazyimports.deferred(n) for n in lazyimports.UNUSED))
    """)
    assert out.splitlines() == ["True", "[[1]] x True True", "False"]
