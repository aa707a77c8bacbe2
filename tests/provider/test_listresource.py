"""ListResource (protocol 5.10/6.10) through the provider client, against real providers: our
framework test provider (testfw, terraform-plugin-framework v1.19, which lists the JSON files of its
directory), our SDKv2 build (protocol 5, which answers every listing with an error diagnostic), and
null 2.1.2 (protocol 5.0, which has no ListResource at all)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kilolock import codec
from kilolock.provider import ProviderDiagnosticsError, launch_provider
from kilolock.provider.errors import ListingUnsupported
from kit.providers import BY_TYPE, our_provider, require


def _configured(client, remote: Path):
    schema = client.get_schema()
    wire = codec.compile_block(schema.provider.block).encode(json.dumps({"dir": str(remote)}).encode())
    client.configure(wire)
    return schema


def _remote(tmp_path: Path, *ids: str) -> Path:
    remote = tmp_path / "remote"
    remote.mkdir()
    for id_ in ids:
        (remote / f"{id_}.json").write_text(json.dumps({"id": id_}))
    return remote


@pytest.fixture(params=["native", "grpcio"])
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("KL_PROVIDER_TRANSPORT", request.param)
    return str(request.param)


def test_the_framework_provider_streams_every_object_with_its_identity(tmp_path: Path, transport: str) -> None:
    remote = _remote(tmp_path, "a-1", "a-2", "b-1")
    with launch_provider(our_provider("testfw")) as client:
        assert client.transport == transport
        schema = _configured(client, remote)
        assert list(schema.list_resource_schemas or {}) == ["testfw_thing"]
        identity = codec.compile_block(client.get_identity_schemas()["testfw_thing"].block)
        list_schema = codec.compile_block(schema.list_resource_schemas["testfw_thing"].block)

        def listed(config: dict[str, str], limit: int) -> list[tuple[str, bytes]]:
            wire = list_schema.encode(json.dumps(config).encode())
            assert client.validate_list_config("testfw_thing", wire, limit) == ()
            return [(e.display_name, identity.decode(e.identity or b"")) for e in client.list_resource("testfw_thing", wire, limit)]

        assert listed({}, 0) == [(f"thing {i}", b'{"id":"%s","region":"local"}' % i.encode()) for i in ("a-1", "a-2", "b-1")]
        assert [name for name, _ in listed({"prefix": "a-"}, 0)] == ["thing a-1", "thing a-2"]
        assert [name for name, _ in listed({}, 2)] == ["thing a-1", "thing a-2"]


def test_a_listing_stopped_early_is_cancelled_and_the_provider_still_answers(tmp_path: Path, transport: str) -> None:
    remote = _remote(tmp_path, *(f"obj-{i:04d}" for i in range(300)))
    with launch_provider(our_provider("testfw")) as client:
        schema = _configured(client, remote)
        wire = codec.compile_block(schema.list_resource_schemas["testfw_thing"].block).encode(b"{}")
        events = client.list_resource("testfw_thing", wire, 0)
        assert next(events).display_name == "thing obj-0000"
        events.close()
        assert sum(1 for _ in client.list_resource("testfw_thing", wire, 0)) == 300


def test_an_error_diagnostic_in_the_stream_ends_the_listing_over_protocol_5(tmp_path: Path) -> None:
    with launch_provider(our_provider("testsdk")) as client:
        schema = _configured(client, tmp_path)
        assert schema.list_resource_schemas == {}
        with pytest.raises(ProviderDiagnosticsError, match="ListResource testsdk_thing: Unknown List Resource Type"):
            list(client.list_resource("testsdk_thing", b"\x80", 0))


def test_a_protocol_5_0_provider_says_in_one_line_that_it_cannot_list() -> None:
    with launch_provider(require(BY_TYPE["null"])) as client:
        assert client.get_schema().list_resource_schemas == {}
        with pytest.raises(ListingUnsupported) as caught:
            list(client.list_resource("null_resource", b"\x80", 0))
    assert str(caught.value) == ("provider null does not implement ListResource (plugin protocol 5.10/6.10, "
                                 "Terraform 1.14): it cannot list objects")
