"""Where the factory gets a provider process: launched for the open (``Launch``), started early
while the state was read (``Prelaunch``, over kilolock.refresh.prelaunch), or kept warm between
runs by a fleet worker (kilolock.fleet.warm, which implements ``ProcessSource`` above this layer).

A source hands the factory a ``Lease``: the process, whether it is configured already (a warm one
is, with this very config), and what becomes of the client the factory wraps around it. The
factory does the rest once, whatever the source: schema, configure, the codec's client.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Protocol

from kilolock import redact
from kilolock.errors import KlError
from kilolock.provider import launch_provider
from kilolock.redact import Redactor

if TYPE_CHECKING:
    from kilolock.provider import ProviderClient
    from kilolock.provider.discovery import FoundProvider
    from kilolock.refresh.client import ResourceClient
    from kilolock.refresh.encoding import EncodingClient
    from kilolock.refresh.prelaunch import Prelaunched
    from kilolock.schema import ProviderSchema

# The sources speak for the factory: one logger for everything an open says, whichever source served it.
log = logging.getLogger("kilolock.refresh.factory")


class ProviderConfigError(KlError):
    pass


def resolve_env_refs(value: Any, secrets: Redactor, where: str = "config") -> Any:
    """Replace every {"env": "NAME"} with the variable's value; the stored config keeps the reference."""
    return redact.resolve_env_refs(value, secrets, where, ProviderConfigError)


@dataclasses.dataclass
class Wanted:
    """One provider a run opens, as discovery found it, with the run's secrets and settings."""

    source: str
    alias: str
    found: FoundProvider
    stored_config: Any  # as stored: env references not yet resolved
    secrets: Redactor  # the run's
    workdir: str | None
    rpc_timeout: float | None
    _config: dict[str, Any] | None = dataclasses.field(default=None, init=False, repr=False)  # may hold secrets

    @property
    def where(self) -> str:
        return f"provider {self.source}" + (f".{self.alias}" if self.alias else "") + " config"

    def config(self) -> dict[str, Any]:
        """The config with its env references resolved (the run learns their values), once. Resolved
        on first use: a warm pool needs it to pick a process, a launch only once it configures, so a
        launch that fails is reported as such even when the config would not resolve either."""
        if self._config is None:
            self._config = resolve_env_refs(self.stored_config, self.secrets, self.where)
        return self._config


class Lease(Protocol):
    """A process a source hands the factory for one open."""

    raw: ProviderClient
    # The schema of a process configured already with this config (a warm one): the factory then
    # neither fetches a schema nor configures. None: a new process, for the factory to configure.
    schema: ProviderSchema | None
    # Redactors besides the run's that must learn the config's sensitive values before the provider
    # sees them (a warm process's own, which masks them while it is idle too).
    keepers: tuple[Redactor, ...]

    def wrap(self, client: EncodingClient, schema: ProviderSchema) -> ResourceClient:
        """The client the run gets, once the process is configured."""


class ProcessSource(Protocol):
    def lease(self, want: Wanted) -> Lease:
        """A process for WANT; raises what launching it raised (ImportError: the protocol stack
        cannot load in this process at all)."""


@dataclasses.dataclass
class NewProcess:
    """A process started for this open: the factory configures it and the run owns it."""

    raw: ProviderClient
    schema: ProviderSchema | None = None
    keepers: tuple[Redactor, ...] = ()

    def wrap(self, client: EncodingClient, schema: ProviderSchema) -> ResourceClient:
        return client


def launch(want: Wanted, secrets: Redactor | None = None) -> ProviderClient:
    """Launch WANT's binary in the run's directory; its log lines pass through SECRETS (the run's by default)."""
    return launch_provider(want.found.binary, rpc_timeout=want.rpc_timeout,
                           secrets=want.secrets if secrets is None else secrets, cwd=want.workdir)


class Launch:
    """Every open launches its own process (``kl refresh`` without an early start)."""

    def lease(self, want: Wanted) -> Lease:
        log.info("provider %s: using %s", want.source, want.found.describe())
        return NewProcess(launch(want))


class Prelaunch:
    """The process started early for this binary in this directory, when there is one and it
    connected; otherwise a launch, as ``Launch``."""

    def __init__(self, early: Prelaunched) -> None:
        self._early = early

    def lease(self, want: Wanted) -> Lease:
        log.info("provider %s: using %s", want.source, want.found.describe())
        return NewProcess(self._taken(want) or launch(want))

    def _taken(self, want: Wanted) -> ProviderClient | None:
        binary = want.found.binary
        early = self._early.take(binary, want.workdir)
        if early is None:
            return None
        try:
            client = early.client(want.rpc_timeout)
        except KlError as exc:
            log.info("provider %s: the early start failed (%s); starting it again", binary, exc)
            return None
        log.info("provider %s: started early, while the state was read", binary)
        return client
