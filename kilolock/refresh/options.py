"""What a refresh run is asked to do: the command line's flags (RefreshOverrides) over the state's
stored settings (kl state set) over kl's defaults, resolved into one value (RefreshOptions)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from kilolock.errors import UsageError
from kilolock.refresh.inflight import AUTO, FleetSlots, Parallelism, parse_parallelism

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs 3.11

    from kilolock.store.settings import StateSettings


class FleetSlotSource(Protocol):
    def for_provider(self, source: str, alias: str) -> FleetSlots | None: ...


@dataclass(frozen=True)
class RefreshOverrides:
    """What one run is told on top of the state's stored settings: the flags of ``kl refresh`` (a
    worker's runs give none but the lock timeout). None, or empty, where nothing was said."""

    dry_run: bool = False
    commit: bool = False
    fail_fast: bool = False
    concurrency: int | None = None
    provider_parallelism: int | str | None = None  # "auto" or a number, as typed or stored
    actor: str | None = None
    search_paths: tuple[str, ...] = ()  # absolute: a relative path means the directory kl was started in
    workdir: str | None = None  # absolute, as search_paths
    lock_timeout: float = 0.0
    timeout: float | None = None
    rpc_timeout: float = 600.0
    always_upgrade: bool = False
    allow_mass_removal: bool = False
    # Who runs it when neither the flag nor the stored settings say: the caller knows ($USER@cli).
    default_actor: str = "unknown@cli"


@dataclass(frozen=True)
class RefreshOptions:
    """A refresh run's options, from its flags, the state's stored settings and kl's defaults."""

    dry_run: bool = False
    # Write what was read as Terraform's next version (serial+1, under the state lock), as
    # `kl drift accept` would, instead of recording it as an observation only.
    commit: bool = False
    fail_fast: bool = False
    concurrency: int = field(default_factory=lambda: os.cpu_count() or 1)
    # Requests in flight per provider process: "auto" adapts to the provider's latency and
    # throttling, starting at Terraform's -parallelism default (10); N fixes it (1: the ADR's serial mode).
    provider_parallelism: Parallelism = AUTO
    # Provider source -> the most requests in flight this run may send it, whatever the setting
    # above says. The hook for a fleet-wide per-provider limit: whoever enforces one fills this in.
    provider_caps: Mapping[str, int] = field(default_factory=dict)
    # Fleet-wide limits (kl provider limit), enforced in this process by kilolock.refresh.slots:
    # (source, alias) -> that provider's slots, or None when the fleet does not limit it.
    provider_slots: FleetSlotSource | None = field(default=None, compare=False)
    actor: str = "unknown@cli"
    search_paths: tuple[str, ...] = ()
    timeout: float | None = None  # seconds, for the whole run
    # Seconds one provider call may take. Generous: a read that retries a throttled cloud API can
    # take minutes, and Terraform itself sets no deadline.
    rpc_timeout: float = 600.0
    always_upgrade: bool = False
    # Where providers run (an absolute path on this host); relative paths in resources resolve
    # against it. None: nobody said where the Terraform configuration is, so providers run in kl's
    # own directory and no deletion is committed (a relative path read from elsewhere looks gone).
    workdir: str | None = None
    # Seconds to wait for a lock someone else holds, at the start and at the commit (0: refuse at once).
    lock_timeout: float = 0.0
    allow_mass_removal: bool = False
    # A provider group in which more than this share of instances comes back gone (and at least
    # mass_removal_min of them) is treated as a credentials problem, not as reality.
    mass_removal_share: float = 0.5
    mass_removal_min: int = 2
    # An OpenTofu-encrypted state's encryption block (kl state set --encryption-config), its
    # passphrases still references: the run decrypts the state with it and commits it encrypted.
    encryption: Mapping[str, Any] | None = field(default=None, compare=False)
    store_decrypted_attributes: bool = False  # index its sensitive values unmasked: the state's opt-in

    @classmethod
    def resolve(cls, overrides: RefreshOverrides, stored: StateSettings | None) -> Self:
        """The run's options: each override given, else the state's stored setting, else kl's default."""
        return cls(
            dry_run=overrides.dry_run,
            commit=overrides.commit,
            fail_fast=overrides.fail_fast,
            concurrency=overrides.concurrency or os.cpu_count() or 1,
            provider_parallelism=parse_parallelism(str(overrides.provider_parallelism
                                                       or (stored and stored.provider_parallelism) or AUTO)),
            actor=overrides.actor or (stored and stored.actor) or overrides.default_actor,
            search_paths=overrides.search_paths or (stored and stored.provider_search_paths) or (),
            workdir=overrides.workdir or (stored.workdir if stored else None),
            lock_timeout=overrides.lock_timeout,
            timeout=overrides.timeout,
            rpc_timeout=overrides.rpc_timeout,
            always_upgrade=overrides.always_upgrade,
            allow_mass_removal=overrides.allow_mass_removal,
            encryption=stored.encryption if stored else None,
            store_decrypted_attributes=bool(stored and stored.store_decrypted_attributes),
        )

    def __post_init__(self) -> None:
        if self.commit and self.dry_run:
            raise UsageError("--commit and --dry-run contradict each other: a dry run writes nothing")
        if self.concurrency < 1:
            raise UsageError("--concurrency must be at least 1")
        if self.provider_parallelism != AUTO and (not isinstance(self.provider_parallelism, int)
                                                  or self.provider_parallelism < 1):
            raise UsageError("--provider-parallelism must be auto or at least 1")
        if any(cap < 1 for cap in self.provider_caps.values()):
            raise UsageError("a provider's requests-in-flight cap must be at least 1")
