"""`kl serve` as its own process, from the checkout under test, with its stderr read by a thread (a
server under load logs a line per request: a pipe nobody reads would stall it) so a test can wait
for a line."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from typing_extensions import Self

from kit.paths import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KlServe:
    def __init__(self, db_url: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> None:
        self.port = free_port()
        full_env = dict(os.environ, KL_DATABASE_URL=db_url, PYTHONPATH=str(REPO), **(env or {}))
        self.proc = subprocess.Popen([sys.executable, "-m", "kilolock", "serve", "--listen", f"127.0.0.1:{self.port}", *args],
                                     env=full_env, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_for(lambda line: line.startswith("kl serve: authentication: "), timeout)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def wait_for(self, found: Callable[[str], bool], timeout: float = 60.0, start: int = 0) -> str:
        """The first line from index START on that FOUND accepts, waiting up to TIMEOUT for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[start:]:
                    if found(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError("kl serve never printed the line awaited; its stderr:\n" + "\n".join(self.lines))
                self._cond.wait(min(left, 1.0))

    def signal(self, sig: int = signal.SIGHUP) -> int:
        """Send SIG; the number of lines printed so far (wait_for's START for what follows)."""
        with self._cond:
            mark = len(self.lines)
        self.proc.send_signal(sig)
        return mark

    @property
    def https(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(10)
        return self.proc.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
