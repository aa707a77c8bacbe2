"""``kl refresh --lock-timeout``: wait for a lock someone else holds, as Terraform's ``-lock-timeout``.

The lock is tried, and while another holder has it tried again with a growing pause (0.1 s
doubling to 2 s) until the timeout; the wait ends early when the run is cancelled (Ctrl-C,
SIGTERM). Used for the check at the start of a run and for taking the lock at its commit.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from kilolock.durations import format_duration
from kilolock.errors import KlError
from kilolock.store.locks import StateLocked

T = TypeVar("T")
# (the holder's LockInfo, seconds waited so far, the timeout): a progress line on a terminal.
LockWaitFn = Callable[[dict[str, Any], float, float], None]
# Sleeps up to the given seconds; True when the run was cancelled meanwhile (Cancellation.wait).
SleepFn = Callable[[float], bool]

FIRST_PAUSE, MAX_PAUSE = 0.1, 2.0


class LockWaitCancelled(KlError):
    pass


def _sleep(seconds: float) -> bool:
    time.sleep(seconds)
    return False


def wait_for_lock(attempt: Callable[[], T], timeout: float, *, sleep: SleepFn | None = None,
                  on_wait: LockWaitFn | None = None) -> T:
    """ATTEMPT's result once it stops raising StateLocked; StateLocked (saying how long kl waited)
    when TIMEOUT seconds pass first; LockWaitCancelled when the run is cancelled while waiting."""
    sleep = sleep or _sleep
    started = time.monotonic()
    pause = FIRST_PAUSE
    while True:
        try:
            return attempt()
        except StateLocked as exc:
            waited = time.monotonic() - started
            left = timeout - waited
            if left <= 0:
                if timeout > 0:
                    raise type(exc)(exc.name, exc.holder, f"waited {format_duration(timeout)} (--lock-timeout)") from None
                raise
            if on_wait is not None:
                on_wait(exc.holder, waited, timeout)
            if sleep(min(pause, left)):
                raise LockWaitCancelled(f"cancelled while waiting for the lock on state {exc.name!r}") from None
            pause = min(pause * 2, MAX_PAUSE)
