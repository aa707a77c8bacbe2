"""Writes vectors.json: the codec's shared test vectors (read by pytest and by `cargo test`).

Every expected value here is written by hand from the encoding rules (reference/protocol.md §3,
go-cty's msgpack/marshal.go), NOT captured from our codec: the wire form is spelled as the Python
value go-cty would emit and serialised by msgpack-python (an independent implementation), or
given as literal hex. Regenerate with ``python tests/codec/make_vectors.py``; the file is checked
in so `cargo test` needs no Python.
"""
from __future__ import annotations

import json
import pathlib

import msgpack

OUT = pathlib.Path(__file__).with_name("vectors.json")
vectors: list[dict] = []


def pack(obj: object) -> str:
    return msgpack.packb(obj, use_bin_type=True).hex()


def v(name: str, type_: object, json_in: str, wire: object, canonical: str | None = None, *,
      raw_hex: str | None = None, fixed_point: bool = True) -> None:
    """A round-trip vector: encode(json_in) == wire; decode(wire) == canonical (default json_in).

    ``fixed_point=False`` marks where encode(canonical) differs from the wire bytes: go-cty's one
    lossy case (a float64 decodes to its shortest round-trip digits at 53-bit precision, as
    Terraform writes state, so an exactly-float64 number spelled with more digits canonicalises to
    another decimal), and sets of non-primitives, whose canonical JSON is sorted."""
    vectors.append({
        "fixed_point": fixed_point,
        "name": name,
        "type": type_,
        "json": json_in,
        "msgpack": raw_hex if raw_hex is not None else pack(wire),
        "canonical": json_in if canonical is None else canonical,
    })


def dec(name: str, type_: object, wire_hex: str, canonical: str) -> None:
    """A decode-only vector: wire forms our encoder never writes but providers may send."""
    vectors.append({"name": name, "type": type_, "msgpack": wire_hex, "canonical": canonical})


def enc_err(name: str, type_: object, json_in: str, error: str) -> None:
    vectors.append({"name": name, "type": type_, "json": json_in, "error": error})


def dec_err(name: str, type_: object, wire_hex: str, error: str) -> None:
    vectors.append({"name": name, "type": type_, "msgpack": wire_hex, "error": error})


def type_err(name: str, type_text: str, error: str) -> None:
    vectors.append({"name": name, "type_text": type_text, "error": error})


def bin_type(spec: object) -> bytes:
    return json.dumps(spec, separators=(",", ":"), sort_keys=True).encode()


# --- primitives -----------------------------------------------------------------------------------
v("string", "string", '"hello"', "hello")
v("string empty", "string", '""', "")
v("string utf8 kept", "string", '"h\u00e9llo \u2713"', "h\u00e9llo \u2713")
v("string escapes decoded", "string", '"a\\u00e9\\n\\"\\/"', "a\u00e9\n\"/", '"a\u00e9\\n\\"/"')
v("string control chars canonical", "string", '"\\u0001\\b\\f\\t\\r\\u001f\\u007f"', "\x01\b\f\t\r\x1f\x7f",
  '"\\u0001\\b\\f\\t\\r\\u001f\x7f"')
v("string surrogate pair escape", "string", '"\\ud83d\\ude00"', "\U0001F600", '"\U0001F600"')
v("string 31 bytes fixstr", "string", '"' + "a" * 31 + '"', "a" * 31, raw_hex="bf" + "61" * 31)
v("string 32 bytes str8", "string", '"' + "a" * 32 + '"', "a" * 32, raw_hex="d920" + "61" * 32)
v("string 256 bytes str16", "string", '"' + "b" * 256 + '"', "b" * 256, raw_hex="da0100" + "62" * 256)
v("string null", "string", "null", None, raw_hex="c0")
v("bool true", "bool", "true", True, raw_hex="c3")
v("bool false", "bool", "false", False, raw_hex="c2")
v("bool null", "bool", "null", None)

# numbers: int64 range -> most compact int; float64-exact -> 0xcb; else the decimal text
v("number 0", "number", "0", 0, raw_hex="00")
v("number 127 fixint", "number", "127", 127, raw_hex="7f")
v("number 128 uint8", "number", "128", 128, raw_hex="cc80")
v("number 255 uint8", "number", "255", 255, raw_hex="ccff")
v("number 256 uint16", "number", "256", 256, raw_hex="cd0100")
v("number 65535 uint16", "number", "65535", 65535, raw_hex="cdffff")
v("number 65536 uint32", "number", "65536", 65536, raw_hex="ce00010000")
v("number 2^32 uint64", "number", "4294967296", 4294967296, raw_hex="cf0000000100000000")
v("number int64 max", "number", "9223372036854775807", 9223372036854775807, raw_hex="cf7fffffffffffffff")
v("number -1 negfixint", "number", "-1", -1, raw_hex="ff")
v("number -32 negfixint", "number", "-32", -32, raw_hex="e0")
v("number -33 int8", "number", "-33", -33, raw_hex="d0df")
v("number -128 int8", "number", "-128", -128, raw_hex="d080")
v("number -129 int16", "number", "-129", -129, raw_hex="d1ff7f")
v("number -32769 int32", "number", "-32769", -32769, raw_hex="d2ffff7fff")
v("number -2^31-1 int64", "number", "-2147483649", -2147483649, raw_hex="d3ffffffff7fffffff")
v("number int64 min", "number", "-9223372036854775808", -9223372036854775808, raw_hex="d38000000000000000")
v("number 1e2 is int 100", "number", "1e2", 100, "100")
v("number 1.0 is int 1", "number", "1.0", 1, "1")
v("number 1E+3 is int", "number", "1E+3", 1000, "1000")
v("number 0.1e1 is int", "number", "0.1e1", 1, "1")
v("number -0 is 0", "number", "-0", 0, "0")
v("number -0.0 is 0", "number", "-0.0", 0, "0")
v("number 0.5 float64", "number", "0.5", 0.5, raw_hex="cb3fe0000000000000")
v("number 1.50 float64", "number", "1.50", 1.5, "1.5")
v("number -0.25 float64", "number", "-0.25", -0.25)
v("number 2.5e-1 float64", "number", "2.5e-1", 0.25, "0.25")
v("number 0.8 is a string", "number", "0.8", "0.8", raw_hex="a3302e38")
v("number 0.1 is a string", "number", "0.1", "0.1")
v("number 1e-7 string fixed notation", "number", "1e-7", "0.0000001", "0.0000001")
v("number 30 digits string", "number", "123456789012345678901234567890", "123456789012345678901234567890")
v("number negative big string", "number", "-123456789012345678901234567890", "-123456789012345678901234567890")
# go-cty v1.16 (Terraform 1.12) sends an integer beyond int64 as text even where float64 holds it
# exactly (v1.14, Terraform 1.8, sent a float64).
v("number int64 max + 1 is a string", "number", "9223372036854775808", "9223372036854775808")
v("number 1e20 is a string", "number", "1e20", "100000000000000000000", "100000000000000000000")
v("number 2^64 is a string", "number", "18446744073709551616", "18446744073709551616")
v("number 1e23 not exact: string", "number", "1e23", "100000000000000000000000", "100000000000000000000000")
v("number 2^64+1 string", "number", "18446744073709551617", "18446744073709551617")
v("number long fraction string", "number", "3.14159265358979323846264338327950288", "3.14159265358979323846264338327950288")
v("number 2^53+0.5 string", "number", "9007199254740992.5", "9007199254740992.5")
v("number exact subnormal float", "number",
  "4.940656458412465441765687928682213723650598026143247644255856825006755072702087518652998363616359923797965646954457177309266567103559397963987747960107818781263007131903114045278458171678489821036887186360569987307230500063874091535649843873124733972731696151400317153853980741262385655911710266585566867681870395603106249319452715914924553293054565444011274801297099995419319894090804165633245247571478690147267801593552386115501348035264934720193790268107107491703332226844753335720832431936092382893458368060106011506169809753078342277318329247904982524730776375927247874656084778203734469699533647017972677717585125660551199131504891101451037862738167250955837389733598993664809941164205702637090279242767544565229087538682506419718265533447265625e-324",
  5e-324, "0." + "0" * 323 + "4940656458412465", fixed_point=False)
v("number null", "number", "null", None)

# --- collections ----------------------------------------------------------------------------------
v("list of strings", ["list", "string"], '["b","a"]', ["b", "a"])
v("list empty", ["list", "string"], "[]", [])
v("list null", ["list", "string"], "null", None)
v("list with null element", ["list", "number"], "[1,null]", [1, None])
v("list 16 elements array16", ["list", "bool"], "[" + ",".join(["true"] * 16) + "]", [True] * 16,
  raw_hex="dc0010" + "c3" * 16)
v("set of strings sorted by bytes", ["set", "string"], '["b","a","B","\u00e9","aa"]', ["B", "a", "aa", "b", "\u00e9"],
  '["B","a","aa","b","\u00e9"]')
v("set of strings deduplicated", ["set", "string"], '["x","x","y"]', ["x", "y"], '["x","y"]')
v("string NFC on encode", "string", '"e\u0301"', "\u00e9", '"\u00e9"')
v("string NFC keeps a singleton's canonical form", "string", '"\u212b"', "\u00c5", '"\u00c5"')
v("set of strings NFC before dedup and order", ["set", "string"], '["\u00e9","e\u0301","f"]', ["f", "\u00e9"],
  '["f","\u00e9"]')
v("map key NFC on encode", ["map", "number"], '{"e\u0301":1,"f":2}', {"f": 2, "\u00e9": 1}, '{"f":2,"\u00e9":1}')
v("set of numbers numeric order", ["set", "number"], "[10,2,-1,0.5,1e2,100]", [-1, 0.5, 2, 10, 100],
  "[-1,0.5,2,10,100]")
v("set of numbers big and string forms", ["set", "number"], "[0.8,123456789012345678901234567890,-5]",
  [-5, "0.8", "123456789012345678901234567890"], "[-5,0.8,123456789012345678901234567890]")
v("set of bools false first", ["set", "bool"], "[true,false]", [False, True], "[false,true]")
v("set nulls last", ["set", "string"], '[null,"z","a"]', ["a", "z", None], '["a","z",null]')
# Sets of non-primitives: the wire keeps the given order (cty's own is hash-based); the canonical
# JSON sorts the elements by their canonical text, so it is not the wire order (fixed_point=False).
v("set of objects keeps given order on the wire", ["set", ["object", {"n": "number"}]], '[{"n":2},{"n":1}]',
  [{"n": 2}, {"n": 1}], '[{"n":1},{"n":2}]', fixed_point=False)
v("set of objects deduplicated", ["set", ["object", {"n": "number"}]], '[{"n":1},{"n":2},{"n":1.0}]',
  [{"n": 1}, {"n": 2}], '[{"n":1},{"n":2}]')
dec("decode set of objects sorted by canonical text", ["set", ["object", {"s": "string"}]],
    pack([{"s": "b"}, {"s": "a"}, {"s": "b"}]), '[{"s":"a"},{"s":"b"}]')
v("tuple", ["tuple", ["string", "number", "bool"]], '["a",1,true]', ["a", 1, True])
v("tuple empty", ["tuple", []], "[]", [])
v("map sorted keys", ["map", "number"], '{"b":2,"a":1,"B":3}', {"B": 3, "a": 1, "b": 2}, '{"B":3,"a":1,"b":2}')
v("map keys sorted by utf8 bytes", ["map", "bool"], '{"\u00e9":true,"z":false}', {"z": False, "\u00e9": True},
  '{"z":false,"\u00e9":true}')
v("map empty", ["map", "string"], "{}", {})
v("map null value", ["map", "string"], '{"k":null}', {"k": None})
v("object all attributes sorted, absent as nil", ["object", {"b": "string", "a": "number", "c": "bool"}],
  '{"b":"x"}', {"a": None, "b": "x", "c": None}, '{"a":null,"b":"x","c":null}')
v("object empty type", ["object", {}], "{}", {})
v("object null", ["object", {"a": "string"}], "null", None)
v("object with optional attrs in type", ["object", {"a": "string", "b": "number"}, ["b"]], '{"a":"x"}',
  {"a": "x", "b": None}, '{"a":"x","b":null}')
v("null provider example (protocol.md 3.2)", ["object", {"id": "string", "triggers": ["map", "string"]}],
  '{"id":"123","triggers":null}', None,
  raw_hex="82a26964a3313233a87472696767657273c0")
v("object 16 attributes map16", ["object", {f"a{i:02d}": "bool" for i in range(16)}],
  "{" + ",".join(f'"a{i:02d}":true' for i in range(16)) + "}", {f"a{i:02d}": True for i in range(16)})
v("nested object in list", ["list", ["object", {"cidr": "string", "port": "number"}]],
  '[{"port":443,"cidr":"10.0.0.0/8"}]', [{"cidr": "10.0.0.0/8", "port": 443}],
  '[{"cidr":"10.0.0.0/8","port":443}]')

# --- dynamic --------------------------------------------------------------------------------------
v("dynamic wrapper string", "dynamic", '{"value":"hi","type":"string"}', [bin_type("string"), "hi"],
  '{"type":"string","value":"hi"}')
v("dynamic wrapper typed null", "dynamic", '{"type":"string","value":null}', [bin_type("string"), None])
v("dynamic untyped null", "dynamic", "null", None, raw_hex="c0")
v("dynamic wrapper list", "dynamic", '{"type":["list","number"],"value":[1,0.5]}', [bin_type(["list", "number"]), [1, 0.5]])
v("dynamic wrapper object type canonicalised", "dynamic", '{"type":["object",{"z":"bool","a":"string"}],"value":{"z":true}}',
  [b'["object",{"a":"string","z":"bool"}]', {"a": None, "z": True}],
  '{"type":["object",{"a":"string","z":"bool"}],"value":{"a":null,"z":true}}')
v("dynamic plain string inferred", "dynamic", '"x"', [bin_type("string"), "x"], '{"type":"string","value":"x"}')
v("dynamic plain number inferred", "dynamic", "0.8", [bin_type("number"), "0.8"], '{"type":"number","value":0.8}')
v("dynamic plain bool inferred", "dynamic", "true", [bin_type("bool"), True], '{"type":"bool","value":true}')
v("dynamic plain array is a tuple", "dynamic", '[1,"a",null]', [b'["tuple",["number","string","dynamic"]]', [1, "a", None]],
  '{"type":["tuple",["number","string","dynamic"]],"value":[1,"a",null]}')
v("dynamic plain object inferred recursively", "dynamic", '{"b":{"c":[true]},"a":1}',
  [b'["object",{"a":"number","b":["object",{"c":["tuple",["bool"]]}]}]', {"a": 1, "b": {"c": [True]}}],
  '{"type":["object",{"a":"number","b":["object",{"c":["tuple",["bool"]]}]}],"value":{"a":1,"b":{"c":[true]}}}')
v("dynamic object with only a type key is plain", "dynamic", '{"type":"x"}',
  [b'["object",{"type":"string"}]', {"type": "x"}], '{"type":["object",{"type":"string"}],"value":{"type":"x"}}')
v("dynamic attribute inside object", ["object", {"d": "dynamic", "s": "string"}], '{"s":"a","d":{"type":"number","value":5}}',
  {"d": [bin_type("number"), 5], "s": "a"}, '{"d":{"type":"number","value":5},"s":"a"}')
# go-cty gives a value the type of its parts (cty.ListVal of bools is a list of bool) and writes a
# dynamic value with that type, not the one it came tagged with; a null dynamic element takes its
# collection's element type.
v("dynamic nested in wrapper type is sent with the value's type", "dynamic",
  '{"type":["list","dynamic"],"value":[{"type":"bool","value":false},null]}',
  [b'["list","bool"]', [False, None]], '{"type":["list","bool"],"value":[false,null]}')
v("list of dynamic: a null element takes the element type", ["list", "dynamic"],
  '[null,{"type":"number","value":1}]', [[bin_type("number"), None], [bin_type("number"), 1]],
  '[{"type":"number","value":null},{"type":"number","value":1}]')
v("list of dynamic all null stays untyped", ["list", "dynamic"], "[null,null]", [None, None])
v("object attribute list of dynamic retyped", ["object", {"xs": ["list", "dynamic"]}], '{"xs":["a"]}',
  {"xs": [[bin_type("string"), "a"]]}, '{"xs":[{"type":"string","value":"a"}]}')

# --- decode-only: forms providers may send --------------------------------------------------------
dec("decode uint8 small int", "number", "cc05", "5")
dec("decode int64 form of small int", "number", "d30000000000000007", "7")
dec("decode uint64 max", "number", "cfffffffffffffffff", "18446744073709551615")
dec("decode float32", "number", "ca3f000000", "0.5")
dec("decode float32 inexact shortest digits of the float64", "number", "ca3dcccccd", "0.10000000149011612")
dec("decode float64 0.1 shortest digits", "number", "cb3fb999999999999a", "0.1")
dec("decode float64 integral", "number", "cb4008000000000000", "3")
dec("decode float64 1e21 fixed notation", "number", "cb444b1ae4d6e2ef50", "1000000000000000000000")
dec("decode float64 -0 keeps its sign, as go-cty writes it", "number", "cb8000000000000000", "-0")
dec("decode number string -0.0 keeps its sign", "number", pack("-0.0"), "-0")
# A float64 from a provider becomes go-cty's NumberFloatVal, a big.Float of 53-bit precision, and
# Terraform writes its Text('f', -1): the shortest digits within half an ulp of that precision,
# found digit by digit as math/big's roundShortest does. Not float64's shortest round trip: the
# interval below a power of two is not halved, a subnormal keeps 53 bits, and at a tie between
# two shortest candidates math/big may round down.
dec("decode float64 2^64 big.Float digits", "number", "cb43f0000000000000", "18446744073709550000")
dec("decode float64 2^63 big.Float digits", "number", "cb43e0000000000000", "9223372036854776000")
dec("decode float64 smallest subnormal has 16 digits", "number", "cb0000000000000001",
    "0." + "0" * 323 + "4940656458412465")
dec("decode float64 smallest normal", "number", "cb0010000000000000", "0." + "0" * 307 + "22250738585072014")
dec("decode float64 largest", "number", "cb7fefffffffffffff", "17976931348623157" + "0" * 292)
dec("decode float64 near 5e17 rounds down", "number", "cb439c4e35371d4e3d", "509906548019138360")
dec("decode float64 negative near 4e19", "number", "cbc401629ee4e0a4ad", "-40087627271073275000")
dec("decode float64 2^53 integer", "number", "cb4340000000000000", "9007199254740992")
dec("decode float32 2^64", "number", "ca5f800000", "18446744073709550000")
dec("decode number string exponent", "number", pack("1.5e3"), "1500")
dec("decode number string long", "number", pack("0.10"), "0.1")
dec("decode set unsorted from wire", ["set", "string"], pack(["b", "a", "b"]), '["a","b"]')
# Strings from a provider as Terraform stores them: every byte that is not part of valid UTF-8 is
# one U+FFFD (Go's encoding/json, per byte, where Python and Rust's lossy decoders put one per
# ill-formed run), and the text is NFC (cty.StringVal), map keys too.
dec("decode invalid utf8 byte replaced", "string", "a3c32861", '"\ufffd(a"')
dec("decode truncated sequence one U+FFFD per byte", "string", "a3e28241", '"\ufffd\ufffdA"')
dec("decode surrogate bytes one U+FFFD each", "string", "a3eda080", '"\ufffd\ufffd\ufffd"')
dec("decode overlong nul", "string", "a2c080", '"\ufffd\ufffd"')
dec("decode truncated at the end", "string", "a361f09f", '"a\ufffd\ufffd"')
dec("decode string NFC", "string", pack("e\u0301 A\u030a \u1100\u1161"), '"\u00e9 \u00c5 \uac00"')
dec("decode string combining marks reordered", "string", pack("a\u0301\u0323"), '"\u1ea1\u0301"')
dec("decode map key NFC", ["map", "bool"], pack({"e\u0301": True, "f": False}), '{"f":false,"\u00e9":true}')
dec("decode set of strings NFC deduplicated", ["set", "string"], pack(["\u00e9", "e\u0301", "z"]), '["z","\u00e9"]')
dec("decode invalid utf8 map key", ["map", "bool"], "81a1ffc3", '{"\ufffd":true}')
dec("decode set numbers unsorted", ["set", "number"], pack([3, "0.8", 1.5, None, 1]), "[0.8,1,1.5,3,null]")
dec("decode map keys unsorted", ["map", "number"], pack({"b": 1, "a": 2}), '{"a":2,"b":1}')
dec("decode object keys unsorted", ["object", {"a": "number", "b": "number"}], pack({"b": 1, "a": 2}), '{"a":2,"b":1}')
dec("decode object missing attribute is null", ["object", {"a": "number", "b": "string"}], pack({"a": 1}), '{"a":1,"b":null}')
dec("decode object empty map", ["object", {"a": "number"}], "80", '{"a":null}')
dec("decode str8 short string", "string", "d90161", '"a"')
dec("decode dynamic type as str", "dynamic", pack(['"string"', "x"]), '{"type":"string","value":"x"}')
dec("decode dynamic written with its value's type", "dynamic",
    pack([b'["map","dynamic"]', {"k": [b'["map","bool"]', {"a": True}]}]),
    '{"type":["map",["map","bool"]],"value":{"k":{"a":true}}}')
dec("decode set of dynamic null takes the element type", ["set", "dynamic"],
    pack([None, [b'"string"', "b"], [b'"string"', "a"]]),
    '[{"type":"string","value":"a"},{"type":"string","value":"b"},{"type":"string","value":null}]')
dec("decode dynamic optional attrs kept sorted", "dynamic",
  pack([b'["object",{"b":"string","a":"number"},["b","a"]]', {"a": 1, "b": "x"}]),
  '{"type":["object",{"a":"number","b":"string"},["a","b"]],"value":{"a":1,"b":"x"}}')
dec("decode array32 list", ["list", "bool"], "dd00000001c3", "[true]")
dec("decode map32", ["map", "bool"], "df00000001a161c2", '{"a":false}')

# --- encode errors ---------------------------------------------------------------------------------
# A message is the path in Terraform's form (no leading dot: `rules[3].cidr`, `tags["env"]`), then
# what is wrong; an error about the whole value is the message alone. "error" is the message's
# start: the rest (a parser's detail, an offset) may differ between backends.
enc_err("wrong kind nested", ["object", {"rules": ["list", ["object", {"cidr": "string"}]]}],
        '{"rules":[{"cidr":"a"},{"cidr":"b"},{"cidr":"c"},{"cidr":5}]}', "rules[3].cidr: expected string, got number")
enc_err("unknown attribute", ["object", {"a": "string"}], '{"a":"x","zz":1}', 'unknown attribute "zz"')
enc_err("duplicate key object", ["object", {"a": "string"}], '{"a":"x","a":"y"}', 'duplicate key "a"')
enc_err("duplicate key map", ["map", "string"], '{"a":"x","a":"y"}', 'duplicate key "a"')
enc_err("map value path", ["map", "number"], '{"k":"v"}', '["k"]: expected number, got string')
enc_err("bool is not a number", "number", "true", "expected number, got bool")
enc_err("string is not a bool", "bool", '"true"', "expected bool, got string")
enc_err("number is not a string", "string", "1", "expected string, got number")
enc_err("object is not a list", ["list", "string"], "{}", "expected list, got object")
enc_err("array is not an object", ["object", {}], "[]", "expected object, got array")
enc_err("tuple length", ["tuple", ["string"]], '["a","b"]', "expected tuple of 1 elements, got 2")
enc_err("set element path", ["set", "number"], '[1,"x"]', "[1]: expected number, got string")
enc_err("map in object path", ["object", {"tags": ["map", "string"]}], '{"tags":{"env":1}}',
        'tags["env"]: expected string, got number')
enc_err("attribute after index path", ["list", ["object", {"cidr": "string"}]], '[{"cidr":"a"},{"cidr":true}]',
        "[1].cidr: expected string, got bool")
# A key is a JSON string that keeps UTF-8 and escapes quote, backslash and controls, as
# kilolock.schema.path_display writes it.
enc_err("map key path escapes", ["object", {"m": ["map", ["object", {"x": "number"}]]}],
        '{"m":{"café \\"q\\"\\n":{"x":"1"}}}', 'm["café \\"q\\"\\n"].x: expected number, got string')
enc_err("invalid json", "string", '"abc', "invalid JSON")
enc_err("trailing data", "string", '"a" "b"', "invalid JSON")
enc_err("empty input", "string", "", "invalid JSON")
enc_err("NaN literal", "number", "NaN", "invalid JSON")
enc_err("leading zero", "number", "01", "invalid JSON")
enc_err("number out of range", "number", "1e999999999", "invalid JSON")
enc_err("lone surrogate", "string", '"\\ud800"', "invalid")
enc_err("dynamic wrapper bad type", "dynamic", '{"type":"strin","value":"x"}', "invalid type")
enc_err("dynamic wrapper type dynamic", "dynamic", '{"type":"dynamic","value":null}', "a dynamic value needs a concrete type")
enc_err("dynamic wrapper value mismatch", ["object", {"d": "dynamic"}], '{"d":{"type":"number","value":"x"}}',
        "d: expected number, got string")
# go-cty builds a collection only from elements of one type (cty.ListVal panics otherwise): with
# dynamic in the element type, elements whose values have different types are refused, at the
# first element that differs; a null dynamic fits any.
enc_err("list of dynamic mixed types", ["object", {"xs": ["list", "dynamic"]}], '{"xs":[null,1,"a"]}',
        'xs[2]: element type "string" differs from "number" of the earlier elements')
enc_err("set of dynamic mixed types", ["set", "dynamic"], '[{"type":"bool","value":true},2]',
        '[1]: element type "number" differs from "bool"')
enc_err("map of dynamic mixed types in key order", ["map", "dynamic"], '{"b":1,"a":"x"}',
        '["b"]: element type "number" differs from "string"')
enc_err("list of dynamic inferred tuples differ", ["list", "dynamic"], '[[1],[1,2]]',
        '[1]: element type ["tuple",["number","number"]] differs from ["tuple",["number"]]')
enc_err("list of list of dynamic", ["list", ["list", "dynamic"]], '[["a"],[1]]',
        '[1]: element type ["list","number"] differs from ["list","string"]')
enc_err("list of objects with a dynamic attribute", ["list", ["object", {"d": "dynamic"}]], '[{"d":1},{"d":true}]',
        '[1]: element type ["object",{"d":"bool"}] differs from ["object",{"d":"number"}]')
enc_err("map keys equal once NFC", ["map", "string"], '{"\u00e9":"a","e\u0301":"b"}', 'duplicate key "\u00e9"')
enc_err("depth bomb in dynamic", "dynamic", "[" * 70 + "]" * 70, "nested deeper than 64 levels")
enc_err("depth bomb json", "dynamic", "[" * 5000 + "]" * 5000, "invalid JSON")
vectors.append({"name": "invalid utf8 json", "type": "string", "json_hex": "22ff22", "error": "invalid JSON"})

# --- decode errors --------------------------------------------------------------------------------
dec_err("unknown value ext0", "string", "d40000", "unknown value")
# ext8, 3-byte payload, type 12: refinements map {1: false} ("definitely not null")
dec_err("unknown refined ext12", ["object", {"a": "string"}], "81a161" + "c7030c8101c2", "a: unknown value")
dec_err("unknown dynamic", "dynamic", "d40000", "unknown value")
dec_err("truncated str", "string", "a3616263"[:6], "truncated msgpack")
dec_err("truncated array", ["list", "string"], "92a161", "[1]: truncated msgpack")
dec_err("trailing bytes", "string", "a161c0", "trailing bytes")
dec_err("empty input", "string", "", "truncated msgpack")
dec_err("list of dynamic mixed types", ["list", "dynamic"], pack([[b'"number"', 1], None, [b'"string"', "a"]]),
        '[2]: element type "string" differs from "number"')
dec_err("map of dynamic mixed types", ["map", "dynamic"], pack({"b": [b'"bool"', True], "a": [b'"number"', 1]}),
        '["b"]: element type "bool" differs from "number"')
dec_err("set of dynamic mixed types", ["set", "dynamic"], pack([[b'"bool"', True], [b'"number"', 1]]),
        '[1]: element type "number" differs from "bool"')
dec_err("map keys equal once NFC", ["map", "bool"], pack({"\u00e9": True, "e\u0301": False}), 'duplicate key "\u00e9"')
dec_err("wrong kind", "string", "05", "expected string, got msgpack int")
dec_err("wrong kind nested", ["list", "bool"], "92c3a178", "[1]: expected bool, got msgpack str")
dec_err("map in object path", ["object", {"tags": ["map", "bool"]}], pack({"tags": {"env": 1}}),
        'tags["env"]: expected bool, got msgpack int')
dec_err("map key path escapes", ["map", ["object", {"x": "bool"}]], pack({'é"\n': {"x": 1}}),
        '["é\\"\\n"].x: expected bool, got msgpack int')
dec_err("object unknown attribute", ["object", {"a": "bool"}], pack({"b": True}), 'unknown attribute "b"')
dec_err("object duplicate key", ["object", {"a": "bool"}], "82a161c3a161c2", 'duplicate key "a"')
dec_err("map non-string key", ["map", "bool"], "8101c3", "expected string map key, got msgpack int")
dec_err("tuple length", ["tuple", ["bool"]], "92c3c3", "expected tuple of 1 elements, got 2")
dec_err("number string invalid", "number", pack("12abc"), "invalid number string")
dec_err("float NaN", "number", "cb7ff8000000000000", "number is not finite")
dec_err("float inf", "number", "cb7ff0000000000000", "number is not finite")
dec_err("reserved byte c1", "bool", "c1", "invalid msgpack byte 0xc1")
dec_err("dynamic not a pair", "dynamic", "93c0c0c0", "expected a [type, value] pair")
dec_err("dynamic bad type json", "dynamic", pack([b'"nope"', 1]), "invalid type")
dec_err("huge array claim", ["list", "bool"], "ddffffffff", "[0]: truncated msgpack")
# 70 nested dynamic values, each a list(dynamic) holding the next: deeper than the limit of 64.
bomb = b""
for _ in range(70):
    bomb += b"\x92" + msgpack.packb(b'["list","dynamic"]', use_bin_type=True) + b"\x91"
bomb += b"\xc0"
dec_err("depth bomb nested dynamic lists", "dynamic", bomb.hex(), "[0]" * 64 + ": nested deeper than 64 levels")

# --- type specifications --------------------------------------------------------------------------
type_err("unknown type name", '"strings"', "invalid type")
type_err("bad collection arity", '["list"]', "invalid type")
type_err("unknown kind", '["array","string"]', "invalid type")
type_err("object attrs not an object", '["object",["a"]]', "invalid type")
type_err("optional not an attribute", '["object",{"a":"string"},["b"]]', "invalid type")
type_err("type json invalid", '["list",', "invalid JSON")
type_err("type depth bomb", '["list",' * 70 + '"string"' + "]" * 70, "invalid type: nested deeper than 64 levels")

OUT.write_text(json.dumps(vectors, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
print(f"wrote {len(vectors)} vectors to {OUT}")
