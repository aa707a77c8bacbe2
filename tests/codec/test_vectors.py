"""The shared vector file (also read by `cargo test`), run against both backends."""
from __future__ import annotations

import json
import pathlib
import types
from collections.abc import Callable
from typing import Any

import pytest

from kilolock.codec import CodecError

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
    assert vector["error"] in str(info.value)


@pytest.mark.parametrize("vector", DECODE_ERR, ids=DECODE_ERR_IDS)
def test_decode_error(impl: types.ModuleType, vector: dict) -> None:
    t = impl.compile_type(_type_bytes(vector))
    with pytest.raises(CodecError) as info:
        t.decode(bytes.fromhex(vector["msgpack"]))
    assert vector["error"] in str(info.value)


@pytest.mark.parametrize("vector", TYPE_ERR, ids=TYPE_ERR_IDS)
def test_type_error(impl: types.ModuleType, vector: dict) -> None:
    with pytest.raises(CodecError) as info:
        impl.compile_type(_type_bytes(vector))
    assert vector["error"] in str(info.value)


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
    if "invalid JSON" in vector["error"]:
        assert all(m.startswith("(root): invalid JSON") for m in messages), messages
    else:
        assert messages[0] == messages[1]
