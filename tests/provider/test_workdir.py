"""A provider runs in the working directory it is launched with (a state's workdir), and a missing
one is reported as such, not as a missing binary."""
from __future__ import annotations

import os

import pytest

from kilolock.provider import launch_provider
from kilolock.provider.client import GrpcProviderClient
from kilolock.provider.errors import PluginStartError
from kit.providers import BY_TYPE, require


def test_the_plugin_runs_in_the_given_directory(tmp_path):
    client = launch_provider(require(BY_TYPE["null"]), tls=False, cwd=str(tmp_path))
    try:
        assert isinstance(client, GrpcProviderClient)
        pid = client.connection.process.pid
        assert os.readlink(f"/proc/{pid}/cwd") == str(tmp_path)
    finally:
        client.close()


def test_a_missing_directory_is_named_before_anything_starts(tmp_path):
    with pytest.raises(PluginStartError, match=f"^working directory {tmp_path / 'nope'} does not exist on this host$"):
        launch_provider(require(BY_TYPE["null"]), tls=False, cwd=str(tmp_path / "nope"))
