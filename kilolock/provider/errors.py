"""Errors of the provider protocol stack; all are KlError, so the CLI prints them as one line."""
from __future__ import annotations

from typing import TYPE_CHECKING

from kilolock.errors import KlError

if TYPE_CHECKING:
    from kilolock.provider.diagnostics import Diagnostic


class ProviderError(KlError):
    """Base of everything that goes wrong while talking to a provider plugin."""


class PluginStartError(ProviderError):
    """The binary could not be started, or its go-plugin handshake was unusable."""


class ProviderCallError(ProviderError):
    """An RPC failed at the transport level: the plugin crashed, hung or went away."""


class ListingUnsupported(ProviderCallError):
    """The provider does not implement ListResource (protocol 5.10/6.10): it cannot list objects."""


class ProviderNotFoundError(ProviderError):
    """Discovery found no binary for a provider source address."""


# How a ProviderNotFoundError for a missing binary begins: a run's failure keeps only the message,
# and the run-level error recognises the cause by it to say how to fix it.
NO_BINARY = "no binary for provider"


class ProviderDiagnosticsError(ProviderError):
    """The provider answered with error diagnostics; they are kept for callers to inspect."""

    def __init__(self, message: str, diagnostics: tuple[Diagnostic, ...]) -> None:
        super().__init__(message)
        self.diagnostics = diagnostics
