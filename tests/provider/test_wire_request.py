"""ReadResource requests are built as bytes (wire.read_resource_request), not as messages: they must
be exactly what the generated message serialises to, for every combination of fields a read sends."""
from __future__ import annotations

import itertools

import pytest

from kilolock.provider._pb import tfplugin5_pb2, tfplugin6_pb2
from kilolock.provider.wire import message_field, read_resource_request, string_field

# Lengths on both sides of a one-byte varint (127/128) and a two-byte one (16383/16384).
_VALUES = [b"", b"\x80", b"\x81\xa2id\xa3abc", b"x" * 127, b"y" * 128, b"z" * 16384]


@pytest.mark.parametrize("pb", [tfplugin5_pb2, tfplugin6_pb2], ids=["tfplugin5", "tfplugin6"])
@pytest.mark.parametrize("type_name", ["null_resource", "", "t" * 200, "ünïcode_type"])
def test_read_request_bytes_are_what_the_generated_message_serialises(pb, type_name):
    caps_variants = [pb.ClientCapabilities(deferral_allowed=False, write_only_attributes_allowed=True), pb.ClientCapabilities()]
    optional = [None, *_VALUES]
    for state, private, meta, identity, caps in itertools.product(_VALUES, _VALUES, optional, optional, caps_variants):
        req = pb.ReadResource.Request(type_name=type_name, current_state=pb.DynamicValue(msgpack=state), private=private,
                                      client_capabilities=caps)
        if meta is not None:
            req.provider_meta.msgpack = meta
        if identity is not None:
            req.current_identity.identity_data.msgpack = identity
        built = read_resource_request(string_field(1, type_name), state, private, message_field(5, caps), meta, identity)
        assert built == req.SerializeToString(), (state[:4], private[:4], meta, identity, caps)
        assert pb.ReadResource.Request.FromString(built) == req
