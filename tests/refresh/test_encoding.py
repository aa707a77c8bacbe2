"""EncodingClient: the one place values cross the codec on the refresh path."""
from __future__ import annotations

import json
from typing import Any

from kilolock import codec
from kilolock import schema as sch
from kilolock.provider.client import ReadResult
from kilolock.refresh.client import OpenedProvider
from kilolock.refresh.encoding import EncodingClient

BLOCK = sch.Block(attributes=(sch.Attribute("id", b'"string"', computed=True),
                              sch.Attribute("tags", b'["map","string"]', optional=True)))
SCHEMA = sch.ProviderSchema(5, sch.Schema(0, sch.Block()), {"thing": sch.Schema(0, BLOCK)})


class EchoProvider:
    """A raw provider client that answers every read with the prior it was sent."""

    name = "echo"

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def read_resource(self, type_name: str, current_state: bytes, private: bytes = b"", **_: Any) -> ReadResult:
        self.sent.append(current_state)
        return ReadResult(current_state, private, (), None, ())


class CountingType:
    def __init__(self, inner: Any, counts: dict[str, int]) -> None:
        self._inner, self._counts = inner, counts

    def encode(self, value: bytes) -> bytes:
        self._counts["encode"] += 1
        return self._inner.encode(value)

    def decode(self, wire: bytes) -> bytes:
        self._counts["decode"] += 1
        return self._inner.decode(wire)


def make_client(monkeypatch) -> tuple[EncodingClient, EchoProvider, dict[str, int]]:
    counts = {"encode": 0, "decode": 0}
    real_compile = codec.compile_block
    monkeypatch.setattr(codec, "compile_block", lambda block: CountingType(real_compile(block), counts))
    raw = EchoProvider()
    client = EncodingClient(raw, SCHEMA, OpenedProvider("registry.terraform.io/x/echo", "", "1.0.0", "/bin/echo", 5, False, "native"))  # type: ignore[arg-type]
    return client, raw, counts


def test_a_canonicalized_prior_is_encoded_once_per_read(monkeypatch):
    client, raw, counts = make_client(monkeypatch)
    prior = client.canonicalize("thing", b'{"tags":{"b":"2","a":"1"},"id":"x"}')
    assert prior is not None
    out = client.read_resource("thing", prior, b"", None)
    assert counts == {"encode": 1, "decode": 2}  # canonicalize: encode + decode; the read: decode only
    assert out.new_state is not None and json.loads(out.new_state) == {"id": "x", "tags": {"a": "1", "b": "2"}} and out.new_state == prior
    assert raw.sent == [codec.compile_block(BLOCK).encode(prior)]


def test_a_prior_that_was_not_just_canonicalized_is_encoded_itself(monkeypatch):
    client, raw, counts = make_client(monkeypatch)
    client.canonicalize("thing", b'{"id":"stale","tags":null}')
    upgraded = b'{"id":"upgraded","tags":null}'  # e.g. what UpgradeResourceState returned
    out = client.read_resource("thing", upgraded, b"", None)
    assert out.new_state is not None and json.loads(out.new_state)["id"] == "upgraded" and counts["encode"] == 2
    # The remembered wire form is used once: a second read of the same object encodes again.
    prior = client.canonicalize("thing", b'{"id":"y","tags":null}')
    assert prior is not None
    client.read_resource("thing", prior, b"", None)
    client.read_resource("thing", prior, b"", None)
    assert counts["encode"] == 4 and raw.sent[-1] == raw.sent[-2]
