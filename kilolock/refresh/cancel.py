"""Cancelling a refresh run: one reason to stop, and how long calls in flight get after StopProvider."""
from __future__ import annotations

import logging
import threading

from kilolock.durations import from_env
from kilolock.refresh.result import Failure as Failure  # noqa: PLC0414 - run() returns them: its callers know them from here
from kilolock.refresh.result import Result as Result  # noqa: PLC0414

log = logging.getLogger("kilolock.refresh")

# After StopProvider, how long calls in flight get to end on their own before their providers are
# shut down (go-plugin's Shutdown, then SIGKILL), which fails the calls still waiting. Stop cannot
# reach every call (a provider blocked reading a FIFO, an API client that ignores its context),
# and such a call must not hold a cancelled run until --rpc-timeout. KL_STOP_GRACE overrides it:
# the tests' way to show that a second signal does not wait for it.
STOP_GRACE_S = 3.0


def stop_grace() -> float:
    return from_env("KL_STOP_GRACE", STOP_GRACE_S)


class Cancellation:
    """One reason to stop, set once by whoever notices first (signal, timeout, fail-fast).
    ``at_once``: the providers are killed without waiting out the grace (a second Ctrl-C)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None
        self.at_once = False
        self._lock = threading.Lock()

    def cancel(self, reason: str, *, at_once: bool = False) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            self.at_once = self.at_once or at_once
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)


