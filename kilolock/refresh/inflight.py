"""Requests in flight per provider process: a fixed number, or adapted to the provider ('auto').

Cloud APIs answer in 50-300 ms and throttle callers that push too hard, so the number of reads in
flight sets a refresh's speed. ``AdaptiveLimit`` starts where Terraform sits (10 in flight), grows
while the provider's latency holds, and shrinks when latency climbs or an answer says the caller is
throttled. ``FixedLimit`` is ``--provider-parallelism N``. Both are pure logic (no clock, no
threads): ``Gate`` is the thin thread-safe adapter the orchestrator's reader threads go through,
and the unit tests drive the controllers with a simulated clock and provider.

How AdaptiveLimit decides, once per window (as many completed reads as the limit, at least
WINDOW_MIN, all started under the current limit):
  - the window's median latency ``m`` is compared with the baseline, the lowest window median seen.
    The baseline is re-measured whenever the limit is no higher than when it was taken: at the same
    load a slower provider is slower for reasons of its own, and shrinking would not help (when it
    is much slower, growth starts over at x1.5).
  - m <= GROW_BELOW x baseline: grow (x1.5 until latency first climbs, then +1/16 per window);
  - m >= SHRINK_ABOVE x baseline: shrink towards TARGET x baseline (at most by a quarter); when
    the next window is not at least 8% faster, the cut did not help (the latency is not ours): its
    median becomes the baseline and growth starts over at x1.5;
  - in between: hold.
A throttled answer halves the limit at once, at most once per window of reads started after the
previous decrease (those started before it were sent at the old limit and say nothing new).

The limit never exceeds ``ceiling``: AUTO_MAX, or lower when a cap is given. That cap is the hook
for a fleet-wide per-provider limit (RefreshOptions.provider_caps): whoever enforces one passes
this run's share, and ``set_ceiling`` lowers or raises it while the run goes on.
"""
from __future__ import annotations

import logging
import math
import random
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

log = logging.getLogger("kilolock.refresh.inflight")

AUTO: Literal["auto"] = "auto"
Parallelism = int | Literal["auto"]

START = 10  # Terraform's -parallelism default: auto never starts below what Terraform would do
AUTO_MAX = 256  # auto's own ceiling: beyond this a single provider process is rarely the bottleneck
WINDOW_MIN = 8
# Latency bands, as multiples of the baseline. Wide enough that a busy machine's noise (kl and the
# provider share CPUs) moves nothing; a provider that queues shows 1.5x at 1.5x its capacity.
GROW_BELOW = 1.2
SHRINK_ABOVE = 1.5
TARGET = 1.3
SLOW_START_FACTOR = 1.5
LATENCY_CUT = 0.75  # at most a quarter off per window for latency: it is the noisier signal
CUT_MUST_HELP = 0.92  # after a latency cut, the next window's median must be this much lower
THROTTLE_FACTOR = 0.5  # throttling is the API saying so: halve

# What providers put in a diagnostic when the API they call throttles them: AWS (Throttling,
# ThrottlingException, RequestLimitExceeded, "Rate exceeded"), Azure and HTTP APIs (429 Too Many
# Requests, 503), Google (rateLimitExceeded, "Error 429"). The status codes count only next to a
# word saying they are one, so an ID or a port that happens to contain 429 is not throttling.
_THROTTLING = re.compile(
    r"throttl|requestlimitexceeded|ratelimitexceeded|toomanyrequests|too many requests|rate exceeded"
    r"|\b(?:http|status|statuscode|status code|error|code|response)\b\W{0,3}(?:429|503)\b"
    r"|\b(?:429|503)\b\W{0,3}(?:too many requests|service unavailable|slow down)",
    re.IGNORECASE,
)


def is_throttling(text: str) -> bool:
    """Whether a provider's error text says its API throttled the call (worth a retry, later)."""
    return _THROTTLING.search(text) is not None


def parse_parallelism(text: str) -> Parallelism:
    """``auto`` or a whole number >= 1; ValueError otherwise."""
    if text.strip().lower() == AUTO:
        return AUTO
    n = int(text)
    if n < 1:
        raise ValueError(f"{text!r} must be at least 1")
    return n


class Limit(Protocol):
    """What the Gate asks: how many calls may be in flight now, and what it learnt from each."""

    limit: int
    max_used: int
    throttled: int
    epoch: int  # bumped whenever the limit changes; samples from older epochs are stale

    def on_latency(self, seconds: float, epoch: int) -> None: ...

    def on_throttled(self, epoch: int) -> None: ...

    def set_ceiling(self, ceiling: int | None) -> None: ...


class FixedLimit:
    """``--provider-parallelism N``: N in flight, whatever the provider says (a cap still applies)."""

    mode = "fixed"

    def __init__(self, n: int, ceiling: int | None = None) -> None:
        self.requested = n
        self.start = self.limit = min(n, ceiling) if ceiling else n
        self.max_used = self.limit
        self.throttled = 0
        self.epoch = 0

    def on_latency(self, seconds: float, epoch: int) -> None:
        pass

    def on_throttled(self, epoch: int) -> None:
        self.throttled += 1

    def set_ceiling(self, ceiling: int | None) -> None:
        self.limit = min(self.requested, ceiling) if ceiling else self.requested
        self.max_used = max(self.max_used, self.limit)
        self.epoch += 1


class AdaptiveLimit:
    """``--provider-parallelism auto`` (see the module docstring for the rules)."""

    mode = "auto"

    def __init__(self, start: int = START, ceiling: int | None = None, minimum: int = 1) -> None:
        self.minimum = minimum
        self.ceiling = min(ceiling, AUTO_MAX) if ceiling else AUTO_MAX
        self.start = self.limit = max(minimum, min(start, self.ceiling))
        self.max_used = self.limit
        self.throttled = 0
        self.epoch = 0
        self.slow_start = True
        self.baseline: float | None = None
        self.baseline_limit = 0
        self._window: list[float] = []
        self._last_cut_epoch = -1
        self._cut_at: float | None = None  # the median that made the last latency cut, until the next window

    def _set(self, limit: int) -> None:
        limit = max(self.minimum, min(limit, self.ceiling))
        if limit != self.limit:
            self.limit = limit
            self.max_used = max(self.max_used, limit)
        # A new epoch even when the value stayed: the next window starts clean either way.
        self.epoch += 1
        self._window = []

    def set_ceiling(self, ceiling: int | None) -> None:
        self.ceiling = min(ceiling, AUTO_MAX) if ceiling else AUTO_MAX
        if self.limit > self.ceiling:
            self._set(self.ceiling)

    def on_throttled(self, epoch: int) -> None:
        self.throttled += 1
        if epoch < self._last_cut_epoch:
            return  # sent before the last cut: already answered for
        self.slow_start = False
        self._last_cut_epoch = self.epoch + 1
        self._set(math.floor(self.limit * THROTTLE_FACTOR))

    def on_latency(self, seconds: float, epoch: int) -> None:
        if epoch != self.epoch:
            return  # started under another limit: it measures that one
        self._window.append(seconds)
        if len(self._window) < max(self.limit, WINDOW_MIN):
            return
        window = sorted(self._window)
        median = window[len(window) // 2]
        cut_at, self._cut_at = self._cut_at, None
        if cut_at is not None and median > cut_at * CUT_MUST_HELP:
            # Fewer calls in flight and no faster: the latency is not ours (a busy machine, a slower
            # API for everyone). Take it as the new baseline rather than cut on towards nothing.
            self.baseline, self.baseline_limit = median, self.limit
            self.slow_start = True
        if self.baseline is None or median < self.baseline or self.limit <= self.baseline_limit:
            if self.baseline is not None and median > self.baseline * SHRINK_ABOVE:
                # No more load than when the baseline was taken, yet slower: the provider changed on
                # its own. Probe quickly again from here rather than creep back one at a time.
                self.slow_start = True
            self.baseline, self.baseline_limit = median, self.limit
        ratio = median / self.baseline if self.baseline > 0 else 1.0
        if ratio <= GROW_BELOW:
            if self.slow_start:
                grown = math.ceil(self.limit * SLOW_START_FACTOR)
            else:
                grown = self.limit + max(1, self.limit // 16)
            self._set(grown)
        elif ratio >= SHRINK_ABOVE:
            self.slow_start = False
            self._set(math.floor(self.limit * max(LATENCY_CUT, TARGET / ratio)))
            self._cut_at = median
        else:
            self.slow_start = False
            self.epoch += 1  # hold, and measure a fresh window
            self._window = []


def controller_for(parallelism: Parallelism, ceiling: int | None = None) -> FixedLimit | AdaptiveLimit:
    return AdaptiveLimit(ceiling=ceiling) if parallelism == AUTO else FixedLimit(int(parallelism), ceiling)


@dataclass(frozen=True)
class Backoff:
    """Pauses between retries of a throttled call: exponential with jitter (so the throttled calls
    of one burst do not come back together), never past the instance's deadline."""

    first: float = 0.2
    cap: float = 10.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The pause before retry number ``attempt`` (1 = the first retry)."""
        top = min(self.cap, self.first * 2.0 ** (attempt - 1))
        return top / 2 + rng.uniform(0, top / 2)


class FleetSlots(Protocol):
    """A provider's share of a fleet-wide limit in this process (kilolock.refresh.slots): a call
    holds one of its slots as well as the gate's own."""

    limit: int

    def acquire(self, should_stop: Callable[[], bool] | None = None) -> bool: ...

    def release(self) -> None: ...


class Gate:
    """Reader threads take a slot before each provider call and give it back with what they saw.

    Thread-safe; ``acquire`` returns the epoch to hand back to ``release``, or None once
    ``should_stop`` says so (cancellation). With ``fleet`` slots, a call also waits for one of
    them (after the gate's own, so the process never asks the fleet for more than it could send)."""

    POLL = 0.05

    def __init__(self, controller: FixedLimit | AdaptiveLimit, label: str = "provider",
                 fleet: FleetSlots | None = None) -> None:
        self.controller = controller
        self.label = label
        self.fleet = fleet
        self.in_flight = 0
        self._cond = threading.Condition()

    @property
    def limit(self) -> int:
        return self.controller.limit

    def acquire(self, should_stop: Callable[[], bool] | None = None) -> int | None:
        with self._cond:
            while self.in_flight >= self.controller.limit:
                if should_stop is not None and should_stop():
                    return None
                self._cond.wait(self.POLL)
            self.in_flight += 1
            if self.fleet is None:
                return self.controller.epoch
        if not self.fleet.acquire(should_stop):
            with self._cond:
                self.in_flight -= 1
                self._cond.notify_all()
            return None
        with self._cond:
            return self.controller.epoch  # the limit may have moved while it waited: measure under the new one

    def release(self, epoch: int, latency: float | None = None, throttled: bool = False) -> None:
        """latency: seconds of a good answer; None for a failure, which says nothing about load."""
        if self.fleet is not None:
            self.fleet.release()
        with self._cond:
            self.in_flight -= 1
            before = self.controller.limit
            if throttled:
                self.controller.on_throttled(epoch)
            elif latency is not None:
                self.controller.on_latency(latency, epoch)
            if self.controller.limit != before and log.isEnabledFor(logging.DEBUG):
                baseline = getattr(self.controller, "baseline", None)
                log.debug("%s: requests in flight %d -> %d (%s%s)", self.label, before, self.controller.limit,
                          "throttled" if throttled else f"latency {latency or 0:.3f}s",
                          f", baseline {baseline:.3f}s" if baseline is not None else "")
            if self.in_flight < self.controller.limit:
                self._cond.notify_all()  # the limit may have grown by more than one

    def report(self) -> dict[str, object]:
        c = self.controller
        return {"mode": c.mode, "start": c.start, "max": c.max_used, "final": c.limit, "throttled": c.throttled}
