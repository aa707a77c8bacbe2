"""msgpack primitives (twin of codec_rs/src/mp.rs): the writer (most compact forms, as
vmihailenco/msgpack's Encode* that go-cty calls) and a bounds-checked reader that never trusts a
declared length."""
from __future__ import annotations

import codecs
import struct

from kilolock.codec.errors import PathError
from kilolock.codec.pure.jsontext import nfc


def _replace_per_byte(exc: UnicodeError) -> tuple[str, int]:
    # Python reports each maximal ill-formed subsequence at once; Go (whose encoding/json writes
    # the state) replaces every byte of it on its own, so "\xe2\x82A" has two U+FFFD, not one.
    assert isinstance(exc, UnicodeDecodeError)
    return "\ufffd" * (exc.end - exc.start), exc.end


codecs.register_error("kilolock-go-replace", _replace_per_byte)


def decode_text(data: bytes) -> str:
    """A msgpack string as go-cty and Terraform store it: each byte that is not part of valid
    UTF-8 becomes U+FFFD (as Go's encoding/json writes it into state), and the text is NFC
    (``cty.StringVal``)."""
    return nfc(data.decode("utf-8", "kilolock-go-replace"))

_pack_f64 = struct.Struct(">d").pack
_unpack_f32 = struct.Struct(">f").unpack
_unpack_f64 = struct.Struct(">d").unpack


def _write_len(out: bytearray, n: int, fix: int, fix_max: int, m8: int | None, m16: int, m32: int) -> None:
    if n <= fix_max:
        out.append(fix | n)
    elif m8 is not None and n < 0x100:
        out.append(m8)
        out.append(n)
    elif n < 0x10000:
        out.append(m16)
        out += n.to_bytes(2, "big")
    else:
        out.append(m32)
        out += n.to_bytes(4, "big")


def write_str(out: bytearray, data: bytes) -> None:
    _write_len(out, len(data), 0xA0, 31, 0xD9, 0xDA, 0xDB)
    out += data


def write_bin(out: bytearray, data: bytes) -> None:
    n = len(data)
    if n < 0x100:
        out.append(0xC4)
        out.append(n)
    elif n < 0x10000:
        out.append(0xC5)
        out += n.to_bytes(2, "big")
    else:
        out.append(0xC6)
        out += n.to_bytes(4, "big")
    out += data


def write_array_header(out: bytearray, n: int) -> None:
    _write_len(out, n, 0x90, 15, None, 0xDC, 0xDD)


def write_map_header(out: bytearray, n: int) -> None:
    _write_len(out, n, 0x80, 15, None, 0xDE, 0xDF)


def write_int(out: bytearray, v: int) -> None:
    """The most compact form, as vmihailenco/msgpack's EncodeInt (unsigned markers for v >= 0)."""
    if v >= 0:
        if v < 0x80:
            out.append(v)
        elif v < 0x100:
            out += b"\xcc" + v.to_bytes(1, "big")
        elif v < 0x10000:
            out += b"\xcd" + v.to_bytes(2, "big")
        elif v < 0x100000000:
            out += b"\xce" + v.to_bytes(4, "big")
        else:
            out += b"\xcf" + v.to_bytes(8, "big")
    elif v >= -32:
        out.append(v & 0xFF)
    elif v >= -0x80:
        out += b"\xd0" + v.to_bytes(1, "big", signed=True)
    elif v >= -0x8000:
        out += b"\xd1" + v.to_bytes(2, "big", signed=True)
    elif v >= -0x80000000:
        out += b"\xd2" + v.to_bytes(4, "big", signed=True)
    else:
        out += b"\xd3" + v.to_bytes(8, "big", signed=True)


def write_f64(out: bytearray, f: float) -> None:
    out.append(0xCB)
    out += _pack_f64(f)


# The family of an item (Rust's ``Head`` variants); ``Reader.head`` returns it with the item's
# scalar value or declared length.
NIL, FALSE, TRUE, INT, FLOAT, STR, BIN, ARRAY, MAP, EXT = range(10)
FAMILY_NAMES = ("nil", "bool", "bool", "int", "float", "str", "bin", "array", "map", "ext")

# Headers followed by a big-endian unsigned value of the given width: the value itself (uint8..64)
# or the length of what follows (str8..32, bin8..32, array16/32, map16/32).
_SIZED_HEADERS = {
    0xCC: (INT, 1), 0xCD: (INT, 2), 0xCE: (INT, 4), 0xCF: (INT, 8),
    0xD9: (STR, 1), 0xDA: (STR, 2), 0xDB: (STR, 4),
    0xC4: (BIN, 1), 0xC5: (BIN, 2), 0xC6: (BIN, 4),
    0xDC: (ARRAY, 2), 0xDD: (ARRAY, 4),
    0xDE: (MAP, 2), 0xDF: (MAP, 4),
}


def _truncated(pos: int) -> PathError:
    return PathError(f"truncated msgpack at offset {pos}")


class Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        pos = self.pos
        end = pos + n
        if end > len(self.data):
            raise _truncated(pos)
        self.pos = end
        return self.data[pos:end]

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def head(self) -> tuple[int, object]:
        """The next item's family and its value (scalars) or length (str/bin/array/map)."""
        data = self.data
        pos = self.pos
        if pos >= len(data):
            raise _truncated(pos)
        b = data[pos]
        self.pos = pos + 1
        if b <= 0x7F:
            return INT, b
        if b >= 0xE0:
            return INT, b - 0x100
        if 0xA0 <= b <= 0xBF:
            return STR, b & 0x1F
        if 0x90 <= b <= 0x9F:
            return ARRAY, b & 0x0F
        if 0x80 <= b <= 0x8F:
            return MAP, b & 0x0F
        if b == 0xC0:
            return NIL, None
        if b == 0xC2:
            return FALSE, False
        if b == 0xC3:
            return TRUE, True
        sized = _SIZED_HEADERS.get(b)
        if sized is not None:
            return sized[0], self.uint(sized[1])
        if b in (0xD0, 0xD1, 0xD2, 0xD3):
            return INT, int.from_bytes(self.take(1 << (b - 0xD0)), "big", signed=True)
        if b == 0xCA:
            return FLOAT, _unpack_f32(self.take(4))[0]
        if b == 0xCB:
            return FLOAT, _unpack_f64(self.take(8))[0]
        if 0xD4 <= b <= 0xD8 or 0xC7 <= b <= 0xC9:
            return EXT, None  # unknown value (ext 0, refined ext 12, or any other code)
        raise PathError(f"invalid msgpack byte 0x{b:02x} at offset {pos}")

    def text(self, n: int) -> str:
        return decode_text(self.take(n))
