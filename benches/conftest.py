"""Shared bench helpers: quick mode and a summary table printed at the end of the run."""
from __future__ import annotations

import os

import pytest

QUICK = os.environ.get("KL_BENCH_QUICK") == "1"
_summary: list[str] = []


@pytest.fixture(scope="session")
def bench_summary() -> list[str]:
    """Lines appended here are printed after the run (figures for the closing note)."""
    return _summary


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _summary:
        terminalreporter.section("bench figures")
        for line in _summary:
            terminalreporter.write_line(line)
