"""A provider never outlives kl: whichever way the kl process ends, its providers end too (and the
socket directory a killed kl leaves goes when a worker starts)."""
from __future__ import annotations

import os
import signal
import socket
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


def test_a_killed_kls_socket_directory_is_swept_by_the_next_worker_and_a_live_ones_kept(tmp_path, run_kl, db_url):
    """A kl killed outright (SIGKILL) cannot remove its plugin socket directory; `kl worker` removes
    such leftovers when it starts, and never a directory whose kl is alive."""
    from kilolock.provider.process import sweep_orphaned_socket_dirs

    script = CHILD.format(binary=require(BY_TYPE["null"]), mode="wait")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=kl_env(TMPDIR=str(tmp_path)), preexec_fn=default_signals)  # noqa: PLW1509 - signal() only
    try:
        line = child.stdout.readline()  # type: ignore[union-attr]
        assert line.strip().isdigit(), f"child failed: {line!r}"
        [left] = [p for p in tmp_path.iterdir() if p.name.startswith("kl-plugin-")]
        assert left.name.startswith(f"kl-plugin-{child.pid}-")
        assert sweep_orphaned_socket_dirs(str(tmp_path)) == 0 and left.exists()  # its kl is alive
        child.kill()
        child.wait(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    deadline = time.monotonic() + 10  # its provider follows it (PDEATHSIG); until then its socket answers
    while running(int(line)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(int(line)) and left.exists()  # nobody removed it: the kl that made it was killed outright
    # Left a while ago (an empty directory less than a minute old may be a starting plugin's; this
    # null provider's go-plugin puts its socket in $TMPDIR itself, so the directory stays empty).
    os.utime(left, (time.time() - 120, time.time() - 120))
    alive = tmp_path / f"kl-plugin-{os.getpid()}-x"
    alive.mkdir()
    unnamed = tmp_path / "kl-plugin-abc123"  # an older kl's, whose process cannot be told
    unnamed.mkdir()
    # A kl this process cannot see (another PID namespace sharing the directory) whose plugin serves.
    elsewhere = tmp_path / f"kl-plugin-{child.pid}-z"
    elsewhere.mkdir()
    starting = tmp_path / f"kl-plugin-{child.pid}-y"  # the same, its plugin not listening yet
    starting.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as serving:
        serving.bind(str(elsewhere / "plugin"))
        serving.listen(1)
        r = run_kl("worker", "--once", env={"TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "removed 1 plugin socket directory left by kl processes that are gone" in r.stdout.decode()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("kl-plugin-")) == \
        sorted([alive.name, unnamed.name, elsewhere.name, starting.name])
