"""The process table, as the leak checks see it, and the signal dispositions of the children tests signal.

Every process a test session starts (kl, and through it the providers) carries the session's mark
(KL_TEST_SESSION, set by tests/conftest.py) in its environment, so the checks count our own
processes only, not a neighbour's on the machine. This is the one /proc scan for leftovers.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot; None if it is gone): with the pid, it names one
    process, where a pid alone may name a later one (pids wrap at 32768 here, fast while Go builds)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def survivors(pids: list[int]) -> list[int]:
    return [pid for pid in pids if running(pid)]


def marked_pids(mark: str, names: Iterable[bytes] = (b"terraform-provider-", b"fake_provider.py")) -> set[int]:
    """Live (not zombie) processes whose environment holds MARK ("KEY=VALUE") and whose command
    line names a provider (or any of NAMES)."""
    want = mark.encode()
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            if not any(n in cmdline for n in names):
                continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if want not in fh.read().split(b"\0"):
                    continue
        except OSError:
            continue
        pids.add(int(entry))
    return pids


def session_mark() -> str:
    """The test session's mark (tests/conftest.py puts KL_TEST_SESSION into the environment)."""
    return f"KL_TEST_SESSION={os.environ.get('KL_TEST_SESSION', '')}"


def settle_orphans(before: set[int], mark: str, timeout: float = 5.0, names: Iterable[bytes] | None = None) -> set[int]:
    """Marked provider processes that are still alive TIMEOUT seconds later, minus BEFORE."""
    deadline = time.monotonic() + timeout
    kw = {} if names is None else {"names": tuple(names)}
    while (left := marked_pids(mark, **kw) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def provider_pids() -> set[int]:
    """Live provider processes (real ones, and the fake) started by this test session (SESSION_MARK)."""
    return marked_pids(session_mark())


def assert_no_new_providers(before: set[int], grace: float = 5.0) -> None:
    """Fail if provider processes beyond BEFORE are still alive after GRACE seconds."""
    left = settle_orphans(before, session_mark(), grace)
    assert not left, f"provider processes outlived the test: {sorted(left)}"


# What a test signals its children with. A shell starting a job in the background (`cmd &`, so
# `nohup bash .ci/run &`) runs it with SIGINT and SIGQUIT ignored, and an ignored disposition is
# inherited across exec: a child would then never see the signal the test sends it (a Python child
# does not even install its KeyboardInterrupt handler). Not subprocess's restore_signals: that
# covers SIGPIPE, SIGXFZ and SIGXFSZ only. SIGHUP stays as inherited: nohup ignores it on purpose.
SIGNALS_TESTS_SEND = (signal.SIGINT, signal.SIGTERM)


def default_signals() -> None:
    """preexec_fn for a child a test will signal: the default disposition of every signal the
    test may send, whatever the test process itself inherited."""
    for sig in SIGNALS_TESTS_SEND:
        signal.signal(sig, signal.SIG_DFL)


def stderr_line(proc: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The next line PROC prints on its (text) stderr pipe; the process is killed and the test fails
    when none comes within TIMEOUT, rather than the test hanging on a line that never comes."""
    assert proc.stderr is not None
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stderr.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        proc.kill()
        reader.join()
        raise AssertionError(f"no line on stderr within {timeout:g}s (the process is killed): {got}")
    return got[0]
