"""The requests-in-flight controllers (kilolock.refresh.inflight), driven by a simulated clock and a
simulated provider: the capacity model of issue 18 (latency L0 up to C concurrent reads, rising
linearly above C, throttling above 3C) and variations of it. No threads, no sleeping: each test
runs thousands of simulated reads in milliseconds."""
from __future__ import annotations

import heapq
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from kilolock.refresh import inflight
from kilolock.refresh.inflight import AUTO, AdaptiveLimit, Backoff, FixedLimit, Gate

BASE = 0.05  # seconds per read within capacity
THROTTLE_ANSWER = 0.005  # a throttled answer comes back quickly, as from a real API


def capacity_model(c: int, base: float = BASE) -> Callable[[int, float], tuple[float, bool]]:
    """(reads in flight including this one, now) -> (its latency, throttled?)."""
    def model(n: int, now: float) -> tuple[float, bool]:
        if n > 3 * c:
            return THROTTLE_ANSWER, True
        return base * max(1.0, n / c), False
    return model


@dataclass
class Sim:
    duration: float = 0.0
    throttled: int = 0
    max_in_flight: int = 0
    limits: list[tuple[float, int]] = field(default_factory=list)  # (time, limit) after each change

    def limit_at(self, t: float) -> int:
        current = self.limits[0][1]
        for at, limit in self.limits:
            if at > t:
                break
            current = limit
        return current


def simulate(controller: inflight.FixedLimit | inflight.AdaptiveLimit, instances: int,
             model: Callable[[int, float], tuple[float, bool]], seed: int = 1, noise: float = 0.1,
             at_time: Callable[[float, inflight.FixedLimit | inflight.AdaptiveLimit], None] | None = None) -> Sim:
    """Reads INSTANCES objects through CONTROLLER as the orchestrator does: take a slot, call, give
    it back with the latency (or throttled); a throttled instance waits Backoff and is retried."""
    rng = random.Random(seed)
    backoff = Backoff()
    now = 0.0
    ready: list[tuple[float, int, int]] = [(0.0, i, 0) for i in range(instances)]  # (when, instance, attempt)
    heapq.heapify(ready)
    running: list[tuple[float, int, int, int, float, bool]] = []  # (ends, instance, attempt, epoch, latency, throttled)
    done = 0
    sim = Sim(limits=[(0.0, controller.limit)])
    while done < instances:
        while ready and ready[0][0] <= now and len(running) < controller.limit:
            _, i, attempt = heapq.heappop(ready)
            latency, throttled = model(len(running) + 1, now)
            latency *= 1 + rng.uniform(-noise, noise)
            heapq.heappush(running, (now + latency, i, attempt, controller.epoch, latency, throttled))
            sim.max_in_flight = max(sim.max_in_flight, len(running))
        nxt = [running[0][0]] if running else []
        if ready and len(running) < controller.limit:
            nxt.append(ready[0][0])
        now = max(now, min(nxt))
        if at_time:
            at_time(now, controller)
        while running and running[0][0] <= now:
            _, i, attempt, epoch, latency, throttled = heapq.heappop(running)
            before = controller.limit
            if throttled:
                sim.throttled += 1
                controller.on_throttled(epoch)
                heapq.heappush(ready, (now + backoff.delay(attempt + 1, rng), i, attempt + 1))
            else:
                controller.on_latency(latency, epoch, now)
                done += 1
            if controller.limit != before:
                sim.limits.append((now, controller.limit))
    sim.duration = now
    return sim


def test_auto_finds_a_roomy_provider_and_stays_below_throttling() -> None:
    # Issue 18's C = 50: ideal throughput is C / BASE = 1000 reads/s from 50 in flight on.
    auto = simulate(AdaptiveLimit(), 2000, capacity_model(50))
    fixed = simulate(FixedLimit(10), 2000, capacity_model(50))
    assert fixed.duration == pytest.approx(2000 / 10 * BASE, rel=0.05)
    assert auto.throttled == 0
    assert auto.duration < 2000 / 1000 * 1.25, auto.limits  # within 25% of the ideal, ramp-up included
    assert fixed.duration / auto.duration > 4
    # It settles just above capacity, well below where throttling starts.
    settled = [auto.limit_at(t / 10) for t in range(5, int(auto.duration * 10))]
    assert all(50 <= n <= 100 for n in settled), settled


def test_auto_on_a_small_provider_fails_nothing_and_is_no_slower_than_ten() -> None:
    # C = 5: Terraform's 10 in flight already wait 2x; 16 would be throttled.
    auto = simulate(AdaptiveLimit(), 2000, capacity_model(5))
    fixed = simulate(FixedLimit(10), 2000, capacity_model(5))
    assert auto.duration <= fixed.duration * 1.02
    assert auto.max_in_flight <= 15 and auto.throttled == 0


def test_auto_backs_off_from_throttling_that_latency_does_not_announce() -> None:
    # Many real APIs answer at full speed right up to a rate limit, then throttle.
    def flat_then_throttle(n: int, now: float) -> tuple[float, bool]:
        return (THROTTLE_ANSWER, True) if n > 40 else (BASE, False)

    sim = simulate(AdaptiveLimit(), 5000, flat_then_throttle)
    ideal = 5000 / (40 / BASE)
    assert sim.duration < ideal * 1.5
    assert sim.throttled < 5000 * 0.05  # a few per probe, then a halving
    assert max(limit for _, limit in sim.limits) < 80


def test_fixed_limit_never_adapts_and_counts_throttling() -> None:
    fixed = FixedLimit(40)
    sim = simulate(fixed, 500, capacity_model(5))
    assert {limit for _, limit in sim.limits} == {40}
    assert sim.throttled > 0 and fixed.throttled == sim.throttled
    assert sim.max_in_flight == 40


def test_a_provider_that_slows_by_itself_is_not_starved() -> None:
    # At t = 1 s the API gets 3x slower for everyone. Shrinking cannot fix that; once auto sees
    # latency stay high at low load it re-baselines and grows back to the provider's capacity.
    c = 50

    def model(n: int, now: float) -> tuple[float, bool]:
        base = BASE * (3 if now > 1.0 else 1)
        return base * max(1.0, n / c), False

    sim = simulate(AdaptiveLimit(), 6000, model)
    late = [sim.limit_at(t / 10) for t in range(int(sim.duration * 10) - 20, int(sim.duration * 10))]
    assert min(late) >= c * 0.8, sim.limits


def test_the_ceiling_is_never_exceeded_and_can_move_during_a_run() -> None:
    capped = AdaptiveLimit(ceiling=20)
    sim = simulate(capped, 2000, capacity_model(50))
    assert sim.max_in_flight <= 20 and capped.max_used == 20

    def lower_at_one_second(now: float, ctl: inflight.FixedLimit | inflight.AdaptiveLimit) -> None:
        if now > 1.0:
            ctl.set_ceiling(6)

    sim = simulate(AdaptiveLimit(), 3000, capacity_model(50), at_time=lower_at_one_second)
    assert sim.limit_at(0.9) > 6 and all(limit <= 6 for t, limit in sim.limits if t > 1.0)
    fixed = FixedLimit(10, ceiling=4)
    assert fixed.limit == 4
    assert AdaptiveLimit(ceiling=3).limit == 3  # the start respects the cap too
    assert AdaptiveLimit(ceiling=10_000).ceiling == inflight.AUTO_MAX


def test_one_burst_of_throttling_halves_the_limit_once() -> None:
    ctl = AdaptiveLimit(start=40)
    epoch = ctl.epoch
    for _ in range(30):  # thirty answers to reads sent at 40 in flight
        ctl.on_throttled(epoch)
    assert ctl.limit == 20 and ctl.throttled == 30
    ctl.on_throttled(ctl.epoch)  # sent after the cut: it says 20 is still too many
    assert ctl.limit == 10


def test_samples_from_before_a_change_are_not_counted() -> None:
    ctl = AdaptiveLimit(start=10)
    old = ctl.epoch
    for _ in range(10):
        ctl.on_latency(BASE, old)
    assert ctl.limit == 15 and ctl.epoch != old
    for _ in range(100):
        ctl.on_latency(BASE * 5, old)  # stale: sent at 10
    assert ctl.limit == 15


@pytest.mark.parametrize("text", [
    ("provider registry.terraform.io/hashicorp/aws: ReadResource aws_instance: reading EC2 Instance (i-0abc): operation error "
     "EC2: DescribeInstances, https response error StatusCode: 400, RequestID: 5f1d, api error RequestLimitExceeded: "
     "Request limit exceeded."),
    "api error Throttling: Rate exceeded",
    "ThrottlingException: rate exceeded",
    "googleapi: Error 429: Quota exceeded for quota metric 'Read requests', rateLimitExceeded",
    "unexpected status 429 Too Many Requests",
    "GET https://api.github.com/repos/x: 503 Service Unavailable",
    "StatusCode=429 -- Original Error: autorest/azure: Service returned an error. Status=429 Code=\"TooManyRequests\"",
    "HTTP 503: upstream overloaded",
])
def test_throttling_diagnostics_are_recognised(text: str) -> None:
    assert inflight.is_throttling(text)


@pytest.mark.parametrize("text", [
    "Invalid thing: at rule[1].cidr: the rule is wrong",
    "reading EC2 Instance (i-0429abc): couldn't find resource",
    "provider registry.terraform.io/hashicorp/fake: ReadResource did not answer within 600s",
    "listening on port 4290, instance id 503",
    "AccessDenied: User is not authorized",
])
def test_other_errors_are_not_throttling(text: str) -> None:
    assert not inflight.is_throttling(text)


def test_backoff_grows_with_jitter_up_to_its_cap() -> None:
    rng = random.Random(3)
    b = Backoff(first=0.2, cap=10.0)
    for attempt, top in ((1, 0.2), (2, 0.4), (3, 0.8), (10, 10.0), (40, 10.0)):
        delays = [b.delay(attempt, rng) for _ in range(200)]
        assert all(top / 2 <= d <= top for d in delays)
        assert max(delays) - min(delays) > top / 4  # jittered, so a burst does not come back together


def test_parse_parallelism() -> None:
    assert inflight.parse_parallelism("auto") == AUTO and inflight.parse_parallelism("AUTO") == AUTO
    assert inflight.parse_parallelism("7") == 7
    for bad in ("0", "-1", "x", ""):
        with pytest.raises(ValueError):
            inflight.parse_parallelism(bad)
    assert isinstance(inflight.controller_for(AUTO), AdaptiveLimit)
    assert inflight.controller_for(3).limit == 3


def test_the_gate_keeps_threads_within_the_limit_as_it_moves() -> None:
    ctl = AdaptiveLimit(start=4)
    gate = Gate(ctl)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(30):
            epoch = gate.acquire()
            assert epoch is not None
            with lock:
                seen.append((gate.in_flight, ctl.limit))
            time.sleep(0.001)
            gate.release(epoch, latency=0.001)

    threads = [threading.Thread(target=worker) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gate.in_flight == 0
    assert ctl.max_used > 4  # it grew while the threads ran
    assert all(n <= ctl.max_used for n, _ in seen)
    assert max(n for n, _ in seen) > 4
    stopped = Gate(FixedLimit(1))
    assert stopped.acquire() is not None
    assert stopped.acquire(lambda: True) is None  # full, and told to stop: gives up instead of waiting
    assert stopped.report() == {"mode": "fixed", "start": 1, "max": 1, "final": 1, "throttled": 0}


def test_a_stall_that_is_not_the_providers_load_does_not_cut_to_nothing() -> None:
    # For two seconds every call takes twice as long whatever the load (kl's machine is busy): once
    # a cut does not help, auto stops cutting, and after the stall it is back at capacity.
    c = 50

    def model(n: int, now: float) -> tuple[float, bool]:
        stall = 2.0 if 1.0 < now < 3.0 else 1.0
        return BASE * stall * max(1.0, n / c), False

    sim = simulate(AdaptiveLimit(), 8000, model)
    during = [sim.limit_at(1.0 + t / 10) for t in range(20)]
    assert min(during) >= c * 0.6, sim.limits  # without the rule it cuts on to 15
    assert min(sim.limit_at(3.5 + t / 10) for t in range(10)) >= c, sim.limits
    assert sim.duration < 8000 / (c / BASE) + 1.0 + 0.6  # the ideal, the stall at half speed, the ramp-up


def test_latency_alone_never_cuts_below_the_start() -> None:
    # An API that queues (or kl's own busy CPU, against a local provider) answers as many reads per
    # second at 10 in flight as at fewer: cutting below Terraform's 10 for latency only lost time
    # (100,000 null instances on a busy machine: cut to 4, 54 s against 41 s at a fixed 10).
    # Throttling may still go lower.
    def noisy_queue(n: int, now: float) -> tuple[float, bool]:
        return BASE * max(1.0, n / 5) * (3.0 if int(now * 2) % 3 == 0 else 1.0), False

    sim = simulate(AdaptiveLimit(), 3000, noisy_queue, noise=0.3)
    assert min(limit for _, limit in sim.limits) >= inflight.START, sim.limits
    ctl = AdaptiveLimit()
    ctl.on_throttled(ctl.epoch)
    assert ctl.limit == 5
