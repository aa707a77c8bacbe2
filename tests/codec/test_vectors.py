"""The shared vector file (also read by `cargo test`), run against both backends."""
from __future__ import annotations

import json
import pathlib
import types
import unicodedata
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kilolock import schema as sch
from kilolock.codec import CodecError
from kit.codec import load_backend

VECTORS = json.loads(pathlib.Path(__file__).with_name("vectors.json").read_text(encoding="utf-8"))


def _type_bytes(vector: dict) -> bytes:
    if "type_text" in vector:
        return vector["type_text"].encode()
    return json.dumps(vector["type"], separators=(",", ":"), ensure_ascii=False).encode()


def _json_input(vector: dict) -> bytes:
    if "json_hex" in vector:
        return bytes.fromhex(vector["json_hex"])
    return vector["json"].encode()


def _ids(kind: str) -> tuple[list[dict], list[str]]:
    chosen = [v for v in VECTORS if _kind(v) == kind]
    return chosen, [v["name"] for v in chosen]


def _kind(vector: dict) -> str:
    if "error" in vector:
        if "type_text" in vector:
            return "type_error"
        return "encode_error" if ("json" in vector or "json_hex" in vector) else "decode_error"
    return "roundtrip" if "json" in vector else "decode"


ROUNDTRIP, ROUNDTRIP_IDS = _ids("roundtrip")
DECODE, DECODE_IDS = _ids("decode")
ENCODE_ERR, ENCODE_ERR_IDS = _ids("encode_error")
DECODE_ERR, DECODE_ERR_IDS = _ids("decode_error")
TYPE_ERR, TYPE_ERR_IDS = _ids("type_error")


def test_vector_file_covers_every_kind() -> None:
    assert len(ROUNDTRIP) > 80 and DECODE and ENCODE_ERR and DECODE_ERR and TYPE_ERR


def _assert_message(message: str, expected_start: str) -> None:
    """A vector's "error" is the start of the message: the path exactly as Terraform writes it (a
    leading dot or a "(root)" would not match), then what is wrong."""
    assert message.startswith(expected_start), (message, expected_start)


@pytest.mark.parametrize("vector", ROUNDTRIP, ids=ROUNDTRIP_IDS)
def test_roundtrip(impl: types.ModuleType, vector: dict) -> None:
    t = impl.compile_type(_type_bytes(vector))
    wire = t.encode(_json_input(vector))
    assert wire.hex() == vector["msgpack"]
    assert t.decode(bytes.fromhex(vector["msgpack"])).decode() == vector["canonical"]
    # The canonical form is a fixed point: it encodes to the same wire bytes (except go-cty's
    # lossy float64 case, marked in the file).
    if vector["fixed_point"]:
        assert t.encode(vector["canonical"].encode()).hex() == vector["msgpack"]


@pytest.mark.parametrize("vector", DECODE, ids=DECODE_IDS)
def test_decode(impl: types.ModuleType, vector: dict) -> None:
    t = impl.compile_type(_type_bytes(vector))
    assert t.decode(bytes.fromhex(vector["msgpack"])).decode() == vector["canonical"]


@pytest.mark.parametrize("vector", ENCODE_ERR, ids=ENCODE_ERR_IDS)
def test_encode_error(impl: types.ModuleType, vector: dict) -> None:
    t = impl.compile_type(_type_bytes(vector))
    with pytest.raises(CodecError) as info:
        t.encode(_json_input(vector))
    _assert_message(str(info.value), vector["error"])


@pytest.mark.parametrize("vector", DECODE_ERR, ids=DECODE_ERR_IDS)
def test_decode_error(impl: types.ModuleType, vector: dict) -> None:
    t = impl.compile_type(_type_bytes(vector))
    with pytest.raises(CodecError) as info:
        t.decode(bytes.fromhex(vector["msgpack"]))
    _assert_message(str(info.value), vector["error"])


@pytest.mark.parametrize("vector", TYPE_ERR, ids=TYPE_ERR_IDS)
def test_type_error(impl: types.ModuleType, vector: dict) -> None:
    with pytest.raises(CodecError) as info:
        impl.compile_type(_type_bytes(vector))
    _assert_message(str(info.value), vector["error"])


def _message(fn: Callable[..., Any], *args: Any) -> str:
    with pytest.raises(CodecError) as info:
        fn(*args)
    return str(info.value)


@pytest.mark.parametrize("vector", ENCODE_ERR + DECODE_ERR, ids=ENCODE_ERR_IDS + DECODE_ERR_IDS)
def test_error_messages_identical_across_backends(both: tuple[types.ModuleType, types.ModuleType], vector: dict) -> None:
    """Same path, same words; only the wording of malformed-JSON-text errors may differ."""
    messages = []
    for impl in both:
        t = impl.compile_type(_type_bytes(vector))
        if "msgpack" in vector:
            messages.append(_message(t.decode, bytes.fromhex(vector["msgpack"])))
        else:
            messages.append(_message(t.encode, _json_input(vector)))
    if vector["error"].startswith("invalid JSON"):
        assert all(m.startswith("invalid JSON") for m in messages), messages
    else:
        assert messages[0] == messages[1]


_KEYS = st.text(st.characters(exclude_categories=["Cs"]), max_size=6)  # any text a JSON key can hold
_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,6}", fullmatch=True)


@settings(max_examples=150, deadline=None)
@given(attr=_NAMES, key=_KEYS, index=st.integers(0, 3))
def test_error_paths_are_written_by_path_display(attr: str, key: str, index: int) -> None:
    """Both backends write an error's path exactly as kilolock.schema.path_display, the one printed
    form of a path in kl (Terraform's: no leading dot, keys as JSON strings that keep UTF-8)."""
    type_json = json.dumps(["object", {attr: ["map", ["list", ["object", {"n": "number"}]]]}], ensure_ascii=False).encode()
    value = {attr: {key: [{"n": 1}] * index + [{"n": "x"}]}}
    # a map key is NFC in go-cty (cty.MapVal), so in the path too
    key_nfc = unicodedata.normalize("NFC", key)
    expected = sch.path_display((sch.GetAttr(attr), sch.Index(key_nfc), sch.Index(index), sch.GetAttr("n")))
    for impl in (load_backend("python"), load_backend("rust")):
        message = _message(impl.compile_type(type_json).encode, json.dumps(value, ensure_ascii=False).encode())
        assert message == f"{expected}: expected number, got string"


def test_an_error_about_the_whole_value_is_the_message_alone(impl: types.ModuleType) -> None:
    """No path to name (not "(root)", not a lone dot): the message reads on its own after the
    caller's context, e.g. "ReadResource returned an invalid object: expected object, got array"."""
    assert _message(impl.compile_type(b'["object",{"a":"string"}]').encode, b"[]") == "expected object, got array"
    assert _message(impl.compile_type(b'"string"').decode, b"\x05") == "expected string, got msgpack int"
