"""ReadResource.Response field 6 (dynamic sensitive paths, undeclared in the public protos): raw
protobuf bytes, hand-assembled from the wire format, through the generated messages and the
converter into kilolock's own paths, as GrpcProviderClient.read_resource does it."""
from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError

from kilolock.provider import convert, wire
from kilolock.provider._pb import tfplugin5_pb2, tfplugin6_pb2
from kilolock.schema import AttributePath, GetAttr, Index


def decode(raw: bytes, pb: object = tfplugin6_pb2) -> tuple[AttributePath, ...]:
    resp = pb.ReadResource.Response.FromString(raw)  # type: ignore[attr-defined]
    return convert.undeclared_attribute_paths(wire.undeclared_field_payloads(resp, 6), pb.AttributePath)  # type: ignore[attr-defined]


# tag = field << 3 | wire type

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _step_attr(name: str) -> bytes:
    return _len_field(1, _len_field(1, name.encode()))


def _step_key(key: str) -> bytes:
    return _len_field(1, _len_field(2, key.encode()))


def _step_int(i: int) -> bytes:
    return _len_field(1, _varint(3 << 3 | 0) + _varint(i))


@pytest.mark.parametrize("pb", [tfplugin5_pb2, tfplugin6_pb2], ids=["v5", "v6"])
def test_decodes_repeated_paths_at_field_6_next_to_declared_and_unknown_fields(pb: object) -> None:
    path1 = _step_attr("password")
    path2 = _step_attr("tags") + _step_key("secret")
    path3 = _step_attr("rule") + _step_int(3) + _step_attr("token")
    raw = (
        _len_field(3, b"private")                    # declared: private
        + _len_field(6, path1)
        + _varint(7 << 3 | 5) + b"\x00\x00\x80\x3f"  # fixed32 field 7
        + _len_field(6, path2)
        + _varint(8 << 3 | 1) + b"\x00" * 8          # fixed64 field 8
        + _varint(9 << 3 | 0) + _varint(150)         # an unrelated varint field 9
        + _len_field(6, path3)
    )
    assert decode(raw, pb) == (
        (GetAttr("password"),),
        (GetAttr("tags"), Index("secret")),
        (GetAttr("rule"), Index(3), GetAttr("token")),
    )


def test_negative_int64_index_and_no_field_6() -> None:
    assert decode(_len_field(6, _step_int(-2))) == ((Index(-2),),)
    assert decode(b"") == ()
    # A field 6 that is not length-delimited is not a message: protobuf skips it, and so does kl.
    assert decode(b"\x30\x01") == ()


@pytest.mark.parametrize(("raw", "message"), [
    (b"\x32\x05\x0a", "Error parsing message"),                  # truncated length-delimited
    (b"\x32", "Error parsing message"),                          # field 6, no length
    (b"\x33", "Error parsing message"),                          # group start, never ended
    (b"\x08" + b"\xff" * 11, "Error parsing message"),           # varint longer than 10 bytes
    (b"\x00", "Error parsing message"),                          # field number 0
])
def test_a_malformed_message_does_not_parse(raw: bytes, message: str) -> None:
    # The whole ReadResource answer is then unreadable: the client reports the call as failed.
    with pytest.raises(DecodeError, match=message):
        decode(raw)


@pytest.mark.parametrize(("raw", "message"), [
    (b"\x32\x02\x0a\x00", "Step without a selector"),                                      # empty step
    (_len_field(6, _len_field(1, _varint(3 << 3 | 2) + b"\x00")), "Step without a selector"),  # int key as bytes
    (_len_field(6, _len_field(1, _len_field(1, b"\xff"))), "AttributePath': String field had bad UTF-8"),
    (_len_field(6, b"\x0a\x05\x0a"), "AttributePath': Wire format was corrupt"),  # truncated step
])
def test_garbage_in_field_6_is_a_value_error(raw: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode(raw)
