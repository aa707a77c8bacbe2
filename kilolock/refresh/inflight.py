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
Growth must also pay, judged by completed reads per second when the gate passes a clock. Latency
alone cannot tell a provider with room from one that kl itself cannot keep busy: a provider on the
same machine answers in well under a millisecond, kl's own CPU sets the pace, and every hold, cut
and re-baselining under a busy machine's noise let latency-only growth climb to AUTO_MAX reader
threads, whose contention made a 20,000-instance refresh take twice as long as a fixed 10. So a
window also lasts at least RATE_WINDOW seconds (short windows of a fast provider are all noise),
and once a run of growth has raised the limit CHECK_GROWTH-fold, its window's rate must beat the
best window before the growth by GROWTH_MUST_PAY of the growth (x1.5 in flight: 1.25x the reads per
second), by more than MARGIN standard deviations of such a comparison (estimated from consecutive windows at
one limit; until it is clear either way, the limit holds and more windows are measured, up to
JUDGE_WINDOWS). "Before" is also what lower limits did in the last few seconds (HISTORY_HALF_LIFE):
a busy spell slows the windows just before a growth, and growth that starts in it would otherwise
seem to pay when the spell ends. If it does not, the limit goes back to the least limit of that growth whose rate came
within KNEE of the best (where throughput stopped improving) and holds there for
HOLD_AFTER_FAILED windows, twice as many after each further failed probe (up to HOLD_MAX), so noise
gets few chances to pass a probe that bought nothing; and from then on growth is by 1/16 only (the
re-baselining above no longer restarts x1.5 growth), until a growth pays again.
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
import time
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
RATE_WINDOW = 0.05  # seconds a window lasts at least, when there is a clock (a cloud window: one latency)
GROWTH_MUST_PAY = 0.5  # after a growth, reads per second must rise by this share of the growth
CHECK_GROWTH = 1.25  # growth is judged once the limit is this many times where it began
HOLD_AFTER_FAILED = 2  # windows without growth after a probe that did not pay; doubles per failure
HOLD_MAX = 64
NOISE_START = 0.05  # a window's rate's relative standard deviation, until measured
NOISE_WEIGHT = 0.2
MARGIN = 1.5  # standard deviations of the comparison a verdict on growth must clear
JUDGE_WINDOWS = 8  # a growth that has not clearly paid after this many windows did not
QUIET = 0.1  # past the knee, a rate noisier than this needs (noise / QUIET)^2 windows to pass a growth
HISTORY = 32
HISTORY_HALF_LIFE = 5.0  # seconds: what a lower limit did counts half as much this much later
KNEE = 0.95  # after a failed probe: the least limit whose reads per second came this close to the best

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

    def on_latency(self, seconds: float, epoch: int, now: float | None = None) -> None: ...

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

    def on_latency(self, seconds: float, epoch: int, now: float | None = None) -> None:
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
        # Reads per second: good answers (of any epoch) since the window began, over its time.
        self._window_began: float | None = None
        self._answers = 0
        self._rates: list[float] = []  # the windows' rates at the current limit
        # A window's rate varies by itself (a relative standard deviation), estimated from consecutive
        # windows at one limit; a verdict on growth must stand out of it.
        self._noise = NOISE_START
        # A run of growth under judgement: (limit, its windows' rates) for each limit it went through.
        self._probe: list[tuple[int, list[float]]] | None = None
        # (limit, mean rate, when) of the last stretches at a limit: a probe must beat what a lower
        # limit did lately too, not only the windows just before it, which a busy spell may have
        # slowed (growth from a dip then "pays" when the spell ends).
        self._history: list[tuple[int, float, float]] = []
        self._now = 0.0
        self._hold = 0  # windows left without growth
        # Once a growth did not pay, the limit is near where throughput stops improving: from then
        # on it grows by 1/16 at a time only (each run judged as above), never x1.5 again.
        self._knee_found = False
        self._next_hold = HOLD_AFTER_FAILED

    def _set(self, limit: int) -> None:
        limit = max(self.minimum, min(limit, self.ceiling))
        if limit != self.limit:
            if self._rates:
                self._history = self._history[-(HISTORY - 1):] + [(self.limit, sum(self._rates) / len(self._rates), self._now)]
            self.limit = limit
            self.max_used = max(self.max_used, limit)
            self._rates = []
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
        self._probe = None
        self._set(math.floor(self.limit * THROTTLE_FACTOR))

    def on_latency(self, seconds: float, epoch: int, now: float | None = None) -> None:
        """A good answer that took SECONDS, sent under EPOCH; NOW: when it came (a monotonic clock),
        which lets growth be judged by reads per second too."""
        if now is not None:
            self._now = now
            if self._window_began is not None:
                self._answers += 1
        if epoch != self.epoch:
            return  # started under another limit: it measures that one
        self._window.append(seconds)
        if len(self._window) < max(self.limit, WINDOW_MIN):
            return
        rate: float | None = None
        # The first window has no rate: its clock would start at its first answer, not its first call.
        if now is not None and self._window_began is not None:
            if now - self._window_began < RATE_WINDOW:
                return
            rate = self._answers / (now - self._window_began)
            if self._rates:
                previous = self._rates[-1]
                # Two windows of one rate differ by 1.13 standard deviations on average.
                spread = abs(rate - previous) / max((rate + previous) / 2, 1e-9) / 1.13
                self._noise += NOISE_WEIGHT * (spread - self._noise)
            self._rates.append(rate)
        self._decide(rate)
        if now is not None:
            self._window_began, self._answers = now, 0

    def _decide(self, rate: float | None) -> None:
        if rate is not None and self._probe is not None and self.limit >= self._probe[0][0] * CHECK_GROWTH:
            verdict = self._judge()
            if verdict is None:
                self._hold_window()  # not clear yet: measure another window at this limit
                return
            probe, self._probe = self._probe, None
            if not verdict:
                # More in flight, not enough more reads done: something else sets the pace. Back to
                # the least of the probe's limits that did (nearly) as well as its best, and wait.
                means = [(n, sum(r) / len(r)) for n, r in probe + [(self.limit, self._rates)] if r]
                best = max(m for _, m in means)
                self.slow_start = False
                self._knee_found = True
                self._hold, self._next_hold = self._next_hold, min(HOLD_MAX, self._next_hold * 2)
                self._set(max(min(self.start, self.limit), min(n for n, m in means if m >= best * KNEE)))
                return
            # It paid: there is room (the provider got faster, a stall ended), so grow quickly again,
            # unless the API has throttled this run: that said where its limit is.
            self._next_hold = HOLD_AFTER_FAILED
            self._knee_found = False
            self.slow_start = self.slow_start or self.throttled == 0
        window = sorted(self._window)
        median = window[len(window) // 2]
        cut_at, self._cut_at = self._cut_at, None
        if cut_at is not None and median > cut_at * CUT_MUST_HELP:
            # Fewer calls in flight and no faster: the latency is not ours (a busy machine, a slower
            # API for everyone). Take it as the new baseline rather than cut on towards nothing.
            self.baseline, self.baseline_limit = median, self.limit
            self.slow_start = not self._knee_found
        if self.baseline is None or median < self.baseline or self.limit <= self.baseline_limit:
            if self.baseline is not None and median > self.baseline * SHRINK_ABOVE:
                # No more load than when the baseline was taken, yet slower: the provider changed on
                # its own. Probe quickly again from here rather than creep back one at a time.
                self.slow_start = not self._knee_found
            self.baseline, self.baseline_limit = median, self.limit
        ratio = median / self.baseline if self.baseline > 0 else 1.0
        if ratio <= GROW_BELOW and self._hold > 0:
            self._hold -= 1
            self._hold_window()
        elif ratio <= GROW_BELOW:
            if rate is not None:
                if self._probe is None:
                    self._probe = []
                self._probe.append((self.limit, self._rates))
            if self.slow_start:
                grown = math.ceil(self.limit * SLOW_START_FACTOR)
            else:
                grown = self.limit + max(1, self.limit // 16)
            self._set(grown)
        elif ratio >= SHRINK_ABOVE:
            self.slow_start = False
            self._probe = None
            # Never below the start for latency: an API that queues serves its capacity at 10 in flight
            # as well as at fewer, and on a busy machine fewer only slowed a local provider (100,000
            # instances: cut to 4 in flight, 54 s against 41 s at a fixed 10). Throttling may go lower.
            cut = math.floor(self.limit * max(LATENCY_CUT, TARGET / ratio))
            self._set(max(min(self.start, self.limit), cut))
            self._cut_at = median
        else:
            self.slow_start = False
            self._hold_window()

    def _judge(self) -> bool | None:
        """Whether the growth under judgement paid (its rate rose by GROWTH_MUST_PAY of the growth,
        beyond the noise), did not, or (None) cannot be told yet."""
        assert self._probe is not None
        began_at, before = self._probe[0]
        after = self._rates
        if not before:
            return True  # nothing to compare with (the first window has no rate): growth as before
        base = sum(before) / len(before)
        for limit, rate, at in self._history:
            if limit <= began_at:
                base = max(base, rate * 0.5 ** ((self._now - at) / HISTORY_HALF_LIFE))
        ratio = (sum(after) / len(after)) / max(base, 1e-9)
        needed = 1 + (self.limit / began_at - 1) * GROWTH_MUST_PAY
        margin = MARGIN * self._noise * math.sqrt(1 / len(before) + 1 / len(after))
        # Once a growth has failed to pay, a noisy rate (a busy machine's spells) needs more windows
        # at the new limit before a pass: a spell that ends just after a growth must not pass for
        # the growth's doing. Before that (the first ramp-up) one clear window is enough.
        enough = math.ceil((self._noise / QUIET) ** 2) if self._knee_found else 1
        if ratio >= needed + margin and len(after) >= min(JUDGE_WINDOWS, enough):
            return True
        if ratio < needed - margin or len(after) >= JUDGE_WINDOWS:
            return False
        return None

    def _hold_window(self) -> None:
        self.epoch += 1  # the same limit, measured by a fresh window
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

    def try_acquire(self) -> int | None:
        """acquire without waiting, for the event loop's readers (only where there are no fleet
        slots, which may have to be waited for): the epoch, or None when no slot is free."""
        assert self.fleet is None
        with self._cond:
            if self.in_flight >= self.controller.limit:
                return None
            self.in_flight += 1
            return self.controller.epoch

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
                self.controller.on_latency(latency, epoch, time.monotonic())
            if self.controller.limit != before and log.isEnabledFor(logging.DEBUG):
                baseline = getattr(self.controller, "baseline", None)
                log.debug("%s: requests in flight %d -> %d (%s%s)", self.label, before, self.controller.limit,
                          "throttled" if throttled else f"latency {latency or 0:.3f}s",
                          f", baseline {baseline:.3f}s" if baseline is not None else "")
            free = self.controller.limit - self.in_flight
            if free > 0:
                # As many waiters as there are free slots (the limit may have grown by more than
                # one), not all: after a cut, threads beyond the limit wait here, and waking every
                # one of them on every answer cost a 20,000-instance refresh seconds of system time.
                self._cond.notify(free)

    def report(self) -> dict[str, object]:
        c = self.controller
        return {"mode": c.mode, "start": c.start, "max": c.max_used, "final": c.limit, "throttled": c.throttled}
