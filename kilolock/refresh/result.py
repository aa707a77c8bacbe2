"""What a refresh run did, as every report of it reads it (kl refresh, the worker, the audit row):
the Result the orchestrator returns and the Failures in it. Below the orchestrator and whyfailed,
which both read them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Failure:
    """One instance that failed, or (address None) a whole provider group that could not start:
    a missing provider is one failure naming its instances, not one per instance."""

    address: str | None
    message: str
    provider: str | None = None  # set for a group failure
    addresses: list[str] = field(default_factory=list)  # a group failure's instances


@dataclass
class Result:
    """What a refresh run did: its outcome, counts, drift and failures, as the CLI reports it."""

    state: str
    run_id: str | None = None
    status: str = "running"
    dry_run: bool = False
    from_serial: int | None = None
    to_serial: int | None = None  # the Terraform version written (kl refresh --commit)
    observation: str | None = None  # the observation recorded (v7.3: the third based on v7)
    base_moved: bool = False  # Terraform wrote a newer version during the run: the observation opened no drift
    # A lock other than a plan's was taken during the run (an apply) and still held when the
    # observation was recorded: what was read may be its work, so the observation opened no drift.
    base_locked: bool = False
    checked: int = 0
    changed: int = 0
    failed: int = 0
    changed_addresses: list[str] = field(default_factory=list)
    # What changed, per instance, as kl drift shows it: {"address", "deposed", "kind": "changed" |
    # "deleted", "changes": [{"path", "before", "after"}], "status", "ignored_by"}, sensitive values
    # masked. status, as the drift records have (or would have, for a dry run) it once committed:
    # "open", "ignored" (ignored_by: the rules, as in kl drift) or "resolved" (read back to what
    # the last apply or import wrote).
    drift: list[dict[str, Any]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    # Legacy provider addresses (Terraform 0.12's provider.null) and the modern form the commit
    # writes instead, as Terraform 0.13+ does: metadata, not drift.
    provider_addresses: dict[str, str] = field(default_factory=dict)
    # Objects stored as legacy flatmap attributes that the provider upgraded (UpgradeResourceState
    # with RawState.flatmap): the commit writes them as objects; that first form is not drift.
    reshaped: list[str] = field(default_factory=list)
    error: str | None = None  # the run-level reason when status is not succeeded
    guarded: bool = False  # the mass-removal guard refused the commit (a refresh.guarded event)
    duration_s: float = 0.0
    providers: list[str] = field(default_factory=list)  # "source version (binary)" per opened group
    # Requests in flight per opened group: {"provider", "alias", "mode", "start", "max", "final",
    # "throttled"} (inflight.Gate.report), in the order the groups finished.
    concurrency: list[dict[str, Any]] = field(default_factory=list)
