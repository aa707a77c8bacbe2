"""Talking to Terraform provider plugins: launch, handshake, AutoMTLS, protocol 5/6 clients, discovery."""
from __future__ import annotations

import os

# grpc core reads these once, when grpc is first imported, and every module below imports it:
# INFO lines from its TLS and fork handlers would otherwise reach the user's terminal.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

from kilolock.provider.client import DEFAULT_TERRAFORM_VERSION, ProviderClient, ReadResult
from kilolock.provider.diagnostics import Diagnostic, Severity
from kilolock.provider.errors import (
    PluginStartError,
    ProviderCallError,
    ProviderDiagnosticsError,
    ProviderError,
    ProviderNotFoundError,
)
from kilolock.provider.launch import launch_provider
from kilolock.provider.process import kill_all

__all__ = [
    "DEFAULT_TERRAFORM_VERSION",
    "Diagnostic",
    "PluginStartError",
    "ProviderCallError",
    "ProviderClient",
    "ProviderDiagnosticsError",
    "ProviderError",
    "ProviderNotFoundError",
    "ReadResult",
    "Severity",
    "kill_all",
    "launch_provider",
]
