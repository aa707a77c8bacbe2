"""Shared pieces of the fuzz targets (tests/reliability/test_fuzz_*.py): one hypothesis profile,
a case counter each target asserts on, and the one-line-message check.

Cases are derandomized by default, so CI runs the same ≥ 1,000 cases per target every time and a
failure reproduces. KL_FUZZ_RANDOM=1 draws fresh cases (a local hunt for new bugs); KL_FUZZ_EXAMPLES=N
runs N cases per target instead of 1,000 (never fewer: the count is part of what the suite proves).
"""
from __future__ import annotations

import faulthandler
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

MIN_CASES = 1000
EXAMPLES = max(MIN_CASES, int(os.environ.get("KL_FUZZ_EXAMPLES", MIN_CASES)))
RANDOM = os.environ.get("KL_FUZZ_RANDOM") == "1"

# pytest's record_property fixture: adds a name/value pair to the test's JUnit XML entry.
RecordProperty = Callable[[str, object], None]

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # wall time is bounded per call by Tally.timed instead (hypothesis deadlines flake on a busy box)
    derandomize=not RANDOM,
    database=None,  # no example replay from a local directory: the same cases on every machine
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)


@dataclass
class Tally:
    """Cases run by one target, and the slowest single call (a hang shows up as a huge maximum)."""

    target: str
    cases: int = 0
    slowest: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def count(self, outcome: str) -> None:
        self.cases += 1
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def timed(self, seconds: float) -> None:
        self.slowest = max(self.slowest, seconds)

    def report(self) -> str:
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items()))
        return (f"FUZZ {self.target}: {self.cases} cases in {time.monotonic() - self.started:.1f}s "
                f"(slowest call {self.slowest * 1000:.0f} ms; {kinds})")

    def finish(self, record_property: RecordProperty | None = None) -> None:
        """Print the count for the lead to quote and fail when fewer than MIN_CASES ran."""
        line = self.report()
        print(line)
        if record_property is not None:
            record_property("fuzz_cases", self.cases)
        assert self.cases >= MIN_CASES, f"only {self.cases} cases ran for {self.target}; the target needs {MIN_CASES}"


def assert_one_line(message: str, what: str) -> None:
    assert message.strip(), f"{what}: empty error message"
    assert "\n" not in message and "\r" not in message, f"{what}: message is not one line: {message!r}"
    assert "Traceback" not in message, f"{what}: message carries a traceback: {message!r}"


def one_in(draw: st.DrawFn, n: int) -> bool:
    """True about once in N draws. (st.integers(0, N) == 0 is far likelier than 1/N: hypothesis
    favours boundary values, which would flood a target with its rarest branch.)"""
    return draw(st.sampled_from(range(n))) == n // 2


@contextmanager
def hang_guard(seconds: float = 600.0) -> Iterator[None]:
    """A hang in native code (the Rust codec holding the GIL, a blocked socket) never returns to
    Python, so no in-Python timeout can end it: faulthandler's own thread then prints every
    thread's stack and exits, turning a silent CI hang into a failure that shows where."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
