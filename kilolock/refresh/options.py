"""What a refresh run is asked to do (the CLI flags, as one value)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from kilolock.errors import UsageError

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")


def parse_duration(text: str) -> float:
    """Seconds from a duration as Terraform writes them (30s, 5m, 1h, 1m30s, 500ms), and days: 1d."""
    s = text.strip()
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise UsageError(f"invalid duration {text!r}: use forms like 30s, 5m, 1h, 1d or 1m30s")
    if total <= 0:
        raise UsageError(f"invalid duration {text!r}: must be greater than zero")
    return total


@dataclass(frozen=True)
class RefreshOptions:
    dry_run: bool = False
    fail_fast: bool = False
    concurrency: int = field(default_factory=lambda: os.cpu_count() or 1)
    provider_parallelism: int = 10  # Terraform's -parallelism default; 1 is the ADR's serial mode
    actor: str = "unknown@cli"
    search_paths: tuple[str, ...] = ()
    timeout: float | None = None  # seconds, for the whole run
    # Seconds one provider call may take. Generous: a read that retries a throttled cloud API can
    # take minutes, and Terraform itself sets no deadline.
    rpc_timeout: float = 600.0
    always_upgrade: bool = False
    allow_mass_removal: bool = False
    # A provider group in which more than this share of instances comes back gone (and at least
    # mass_removal_min of them) is treated as a credentials problem, not as reality.
    mass_removal_share: float = 0.5
    mass_removal_min: int = 2

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if self.provider_parallelism < 1:
            raise UsageError("--provider-parallelism must be at least 1")
