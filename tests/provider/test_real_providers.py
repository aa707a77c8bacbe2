"""Every real provider binary, over its own protocol: launch, handshake, schema, configure, upgrade,
read, stop, close — with and without AutoMTLS. Values are hand-built cty msgpack (msgpack package)."""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from kilolock.provider import ProviderCallError, launch_provider
from kilolock.provider.client import GrpcProviderClient
from kilolock.schema import Block, NestingMode, provider_schema_from_json
from kit.paths import CACHE
from kit.paths import REPO as ROOT
from kit.procs import survivors
from kit.providers import BY_TYPE, REAL_PROVIDERS, RealProvider, launched_pids, require

# One resource per provider, with the values set in its state object (all others null).
READ_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "null": ("null_resource", {"id": "4711", "triggers": {"a": "b"}}),
    "time": ("time_static", {"id": "2024-01-02T03:04:05Z", "rfc3339": "2024-01-02T03:04:05Z"}),
    "simple": ("simple_resource", {"id": "abc", "value": "v"}),
    "random": ("random_string", {"id": "xyz", "result": "xyz", "length": 3}),
    "local": ("local_file", {"id": "aaf4c61ddcc5e8a2dabede0f3b482cd9aea9434d", "filename": "__FILE__", "content": "hello"}),  # id = sha1(content)
}


def null_object(block: Block) -> dict[str, Any]:
    """Every attribute present and null, as the cty msgpack decoder requires."""
    out: dict[str, Any] = {a.name: None for a in block.attributes}
    for nb in block.block_types:
        if nb.nesting == NestingMode.GROUP:
            out[nb.type_name] = null_object(nb.block)
        else:
            out[nb.type_name] = {NestingMode.SINGLE: None, NestingMode.LIST: [], NestingMode.SET: [], NestingMode.MAP: {}}[nb.nesting]
    return out


@pytest.fixture(scope="module")
def terraform_schemas() -> dict[str, Any]:
    """``terraform providers schema -json`` (Terraform 1.0.3, offline mirror) for every real provider."""
    for p in REAL_PROVIDERS:
        require(p)
    script = ROOT / "scripts" / "test-terraform.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"Terraform 1.0.3 is missing and could not be installed: run scripts/test-terraform.sh ({done.stderr.strip()[-300:]})")
    terraform = done.stdout.strip().splitlines()[-1]
    env = {**os.environ, "TF_CLI_CONFIG_FILE": str(CACHE / "terraformrc"), "TF_IN_AUTOMATION": "1"}
    with tempfile.TemporaryDirectory() as work:
        lines = [f'    {p.type} = {{ source = "hashicorp/{p.type}", version = "{p.version}" }}' for p in REAL_PROVIDERS]
        Path(work, "main.tf").write_text("terraform {\n  required_providers {\n" + "\n".join(lines) + "\n  }\n}\n")
        init = subprocess.run([terraform, "init", "-input=false", "-no-color"], cwd=work, env=env, capture_output=True, text=True)
        assert init.returncode == 0, init.stderr
        out = subprocess.run([terraform, "providers", "schema", "-json"], cwd=work, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["provider_schemas"]


@pytest.mark.parametrize("transport", ["native", "grpcio"])
@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "automtls"])
def test_handshake_schema_matches_terraform(real_provider: RealProvider, tls: bool, transport: str, terraform_schemas: dict[str, Any],
                                            caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO, logger="kilolock.provider.connection")
    monkeypatch.setenv("KL_PROVIDER_TRANSPORT", transport)
    with launch_provider(str(real_provider.path), tls=tls) as client:
        assert isinstance(client, GrpcProviderClient)
        assert client.protocol_version == real_provider.protocol
        assert client.connection.process.pid in launched_pids()
        assert client.transport == transport
        if tls and transport == "native":
            # rustls with aws-lc verifies go-plugin's P-521 certificate under TLS 1.2 and 1.3.
            assert client.connection.tls, caplog.text
        elif tls:
            # grpcio's BoringSSL verifies the server's P-521 signature only under TLS 1.2, as the
            # old null 2.1.2 build negotiates; against TLS 1.3 Go servers kl falls back to
            # plaintext on a private socket directory and says so.
            assert client.connection.tls or "falling back to plaintext" in caplog.text
            if real_provider.type == "null":
                assert client.connection.tls
        else:
            assert not client.connection.tls
        ours = client.get_schema()
    theirs = provider_schema_from_json({"protocol_version": real_provider.protocol, **terraform_schemas[real_provider.source]})
    assert ours.resource_schemas.keys() == theirs.resource_schemas.keys()
    for name in theirs.resource_schemas:
        assert ours.resource_schemas[name] == theirs.resource_schemas[name], name
    # The Terraform that wrote the reference JSON predates list resources (1.14), and so do these
    # providers: kl knows they list nothing ({}), the JSON does not say (None).
    assert ours.list_resource_schemas == {}
    assert dataclasses.replace(ours, list_resource_schemas=None) == theirs


def test_configure_upgrade_read_stop_close(real_provider: RealProvider, tmp_path: Path) -> None:
    type_name, values = READ_CASES[real_provider.type]
    if real_provider.type == "local":
        target = tmp_path / "file.txt"
        target.write_text("hello")
        values = {**values, "filename": str(target)}
    client = launch_provider(str(real_provider.path))
    try:
        schema = client.get_schema()
        config = msgpack.packb(null_object(schema.provider.block))
        assert client.validate_config(config) == ()
        assert client.configure(config) == ()
        resource = schema.resource_schemas[type_name]
        state = {**null_object(resource.block), **values}
        upgraded = client.upgrade_resource_state(type_name, resource.version, json.dumps(state).encode())
        assert upgraded is not None and msgpack.unpackb(upgraded) == state
        result = client.read_resource(type_name, upgraded, b"")
        assert result.new_state is not None
        assert msgpack.unpackb(result.new_state) == state
        assert result.diagnostics == () and result.sensitive_paths == ()
        assert client.get_identity_schemas() == {}  # none of these providers has identities
        client.stop()
    finally:
        client.close()
    proc = client.connection.process  # type: ignore[attr-defined]
    # Shutdown made it exit by itself (status 0), not the SIGKILL fallback.
    assert proc.popen.returncode == 0, proc.exit_description()
    assert not os.path.exists(proc.socket_dir)


def test_local_file_gone_reads_as_null_state(tmp_path: Path) -> None:
    provider = BY_TYPE["local"]
    with launch_provider(require(provider)) as client:
        schema = client.get_schema()
        client.configure(b"\x80")
        state = {**null_object(schema.resource_schemas["local_file"].block), "id": "0", "filename": str(tmp_path / "missing.txt"), "content": "x"}
        result = client.read_resource("local_file", msgpack.packb(state))
    assert result.new_state is None


def test_random_string_upgrades_from_schema_version_1() -> None:
    provider = BY_TYPE["random"]
    with launch_provider(require(provider)) as client:
        schema = client.get_schema().resource_schemas["random_string"]
        assert schema.version == 2
        v1 = {
            "id": "abc", "keepers": None, "length": 3, "lower": True, "min_lower": 0, "min_numeric": 0,
            "min_special": 0, "min_upper": 0, "number": False, "override_special": None, "result": "abc",
            "special": False, "upper": False,
        }
        upgraded = client.upgrade_resource_state("random_string", 1, json.dumps(v1).encode())
    assert upgraded is not None
    value = msgpack.unpackb(upgraded)
    # Version 2 introduced "numeric", taking over the deprecated "number".
    assert value["numeric"] is False and value["result"] == "abc"
    assert set(value) == {a.name for a in schema.block.attributes}


def test_concurrent_reads_on_one_client() -> None:
    provider = BY_TYPE["null"]
    with launch_provider(require(provider)) as client:
        client.configure(b"\x80")
        errors: list[BaseException] = []
        results: dict[int, Any] = {}

        def work(i: int) -> None:
            try:
                for j in range(20):
                    state = {"id": f"{i}-{j}", "triggers": {"n": str(j)}}
                    r = client.read_resource("null_resource", msgpack.packb(state))
                    assert r.new_state is not None and msgpack.unpackb(r.new_state) == state
                results[i] = True
            except BaseException as exc:  # noqa: BLE001 - collected and re-raised in the main thread
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(results) == 10


def test_killed_mid_call_gives_clear_error_and_no_zombie() -> None:
    provider = BY_TYPE["time"]
    client = launch_provider(require(provider), tls=False)
    proc = client.connection.process  # type: ignore[attr-defined]
    outcomes: list[BaseException | None] = []
    started = threading.Barrier(5)
    type_name, values = READ_CASES["time"]
    state = msgpack.packb({**null_object(client.get_schema().resource_schemas[type_name].block), **values})

    def reader() -> None:
        started.wait()
        try:
            while True:  # reads in flight continuously until the provider dies under them
                assert client.read_resource(type_name, state).new_state == state
        except BaseException as exc:  # noqa: BLE001 - the test inspects how the reads ended
            outcomes.append(exc)

    try:
        client.configure(b"\x80")
        threads = [threading.Thread(target=reader) for _ in range(4)]
        for t in threads:
            t.start()
        started.wait()
        time.sleep(0.3)
        os.kill(proc.pid, 9)
        for t in threads:
            t.join(timeout=10)
        assert len(outcomes) == 4
        for exc in outcomes:
            assert isinstance(exc, ProviderCallError), repr(exc)
            assert "provider time: the plugin exited during ReadResource (killed by SIGKILL)" in str(exc)
    finally:
        client.close()
    assert survivors([proc.pid]) == []


def test_provider_logs_reach_python_logging(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    provider = BY_TYPE["time"]
    monkeypatch.setenv("TF_LOG", "trace")  # otherwise kl asks the provider for warnings only
    caplog.set_level(1, logger="kilolock.provider.time")
    with launch_provider(require(provider), tls=False) as client:
        client.get_schema()
    records = [r for r in caplog.records if r.name == "kilolock.provider.time"]
    assert records, "no provider log line was bridged"
    # terraform-plugin-go logs every RPC at TRACE/DEBUG as hclog JSON; its message text comes through.
    assert any("GetProviderSchema" in r.getMessage() or "tf_rpc" in r.getMessage() for r in records)


def test_killed_old_go_plugin_leaves_no_socket_behind() -> None:
    # null 2.1.2's go-plugin predates PLUGIN_UNIX_SOCKET_DIR and listens in $TMPDIR.
    client = launch_provider(require(BY_TYPE["null"]), tls=False)
    proc = client.connection.process  # type: ignore[attr-defined]
    address = proc.handshake.address
    assert not address.startswith(proc.socket_dir) and os.path.exists(address)
    os.kill(proc.pid, 9)
    client.close()
    assert not os.path.exists(address)
