"""A provider never outlives kl: whichever way the kl process ends, its providers end too."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from kit.kl import kl_env
from kit.procs import default_signals, running
from kit.providers import BY_TYPE, require

# Launches a real provider from a short-lived worker thread (PDEATHSIG must not fire when that
# thread ends), checks the provider still answers after the thread is gone, prints its pid, waits.
CHILD = textwrap.dedent(
    """
    import sys, threading, time
    from kilolock.provider import launch_provider
    holder = []
    t = threading.Thread(target=lambda: holder.append(launch_provider({binary!r}, tls=False)))
    t.start(); t.join()
    time.sleep(0.3)
    holder[0].get_schema()
    print(holder[0].connection.process.pid, flush=True)
    if {mode!r} == "exit":
        sys.stdin.readline()
        sys.exit(0)  # no close(): the atexit hook must reap it
    time.sleep(60)
    """
)


def _provider_pid_after(mode: str, sig: int | None) -> int:
    script = CHILD.format(binary=require(BY_TYPE["null"]), mode=mode)
    # kl_env: the child imports kilolock from this checkout. default_signals: the SIGINT/SIGTERM
    # sent below must act even when this test process inherited them ignored (`cmd &`).
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=kl_env(), preexec_fn=default_signals)  # noqa: PLW1509 - signal() only
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
        assert line.strip().isdigit(), f"child failed: {line!r} {child.stderr.read() if child.poll() is not None else ''}"  # type: ignore[union-attr]
        pid = int(line)
        assert running(pid)
        if sig is not None:
            child.send_signal(sig)
        else:
            child.stdin.write("\n")  # type: ignore[union-attr]
            child.stdin.flush()  # type: ignore[union-attr]
        child.wait(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    deadline = time.monotonic() + 5
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pid


@pytest.mark.parametrize(
    "mode, sig",
    [("exit", None), ("wait", signal.SIGINT), ("wait", signal.SIGTERM), ("wait", signal.SIGKILL)],
    ids=["normal-exit-without-close", "SIGINT", "SIGTERM", "SIGKILL"],
)
def test_provider_dies_with_kl(mode: str, sig: int | None) -> None:
    pid = _provider_pid_after(mode, sig)
    assert not running(pid), f"provider pid {pid} outlived its kl process"
