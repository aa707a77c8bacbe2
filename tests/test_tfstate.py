"""Addresses, provider strings and validation of Terraform state v4."""
from __future__ import annotations

import json

import pytest

from kilolock import tfstate

NULL = 'provider["registry.terraform.io/hashicorp/null"]'


@pytest.mark.parametrize(
    ("module", "mode", "type_", "name", "key", "expected"),
    [
        ("", "managed", "null_resource", "x", None, "null_resource.x"),
        ("", "managed", "null_resource", "many", 0, "null_resource.many[0]"),
        ("", "data", "x", "y", None, "data.x.y"),
        ("module.a", "managed", "null_resource", "x", "k", 'module.a.null_resource.x["k"]'),
        ('module.a["x"].module.b[0]', "data", "t", "n", 3, 'module.a["x"].module.b[0].data.t.n[3]'),
        ("", "managed", "t", "n", 'say "hi"', r'''t.n["say \"hi\""]'''),
        ("", "managed", "t", "n", "back\\slash", r't.n["back\\slash"]'),
        ("", "managed", "t", "n", "tab\there\nnl\rcr", r't.n["tab\there\nnl\rcr"]'),
        ("", "managed", "t", "n", "${var} and %{if}", 't.n["$${var} and %%{if}"]'),
        ("", "managed", "t", "n", "$ alone % too", 't.n["$ alone % too"]'),
        ("", "managed", "t", "n", "héllo wörld ✓", 't.n["héllo wörld ✓"]'),
        ("", "managed", "t", "n", "\x01\u200b\U000e0001", r't.n["\u0001\u200b\U000e0001"]'),
        ("", "managed", "t", "n", "", 't.n[""]'),
    ],
)
def test_instance_address(module, mode, type_, name, key, expected):
    assert tfstate.instance_address(module, mode, type_, name, key) == expected


@pytest.mark.parametrize(
    ("text", "source", "alias", "module"),
    [
        (NULL, "registry.terraform.io/hashicorp/null", "", ""),
        (NULL + ".alt", "registry.terraform.io/hashicorp/null", "alt", ""),
        ("module.child." + NULL, "registry.terraform.io/hashicorp/null", "", "module.child"),
        ('provider["example.com/acme/thing"].a_b', "example.com/acme/thing", "a_b", ""),
    ],
)
def test_parse_provider(text, source, alias, module):
    ref = tfstate.parse_provider(text)
    assert (ref.source, ref.alias, ref.module, ref.legacy) == (source, alias, module, False)
    assert ref.modern == text


@pytest.mark.parametrize(
    ("text", "modern"),
    [
        ("provider.null", NULL),
        ("provider.google.beta", 'provider["registry.terraform.io/hashicorp/google"].beta'),
        ("module.net.provider.aws", 'module.net.provider["registry.terraform.io/hashicorp/aws"]'),
        ("module.a.module.b.provider.aws.west", 'module.a.module.b.provider["registry.terraform.io/hashicorp/aws"].west'),
        ("provider.terraform", 'provider["terraform.io/builtin/terraform"]'),
        ('provider["registry.terraform.io/-/null"]', NULL),
        ('module.m.provider["registry.terraform.io/-/aws"].x', 'module.m.provider["registry.terraform.io/hashicorp/aws"].x'),
        # HCL's traversal parser, which Terraform reads these with, skips whitespace and comments
        # between the parts (Terraform's own state fixtures hold "provider. null").
        ("provider. null", NULL),
        (" provider .\tnull\r\n", NULL),
        ("module. net .provider.\nnull . alt", 'module.net.provider["registry.terraform.io/hashicorp/null"].alt'),
        ("provider./* c */null # to the end", NULL),
        ("provider.null // to the end\n", NULL),
    ],
)
def test_legacy_provider_addresses_resolve_as_terraform_013_did(text, modern):
    ref = tfstate.parse_provider(text)
    assert ref.legacy and ref.modern == modern
    assert tfstate.parse_provider(modern).source == ref.source


def test_modern_provider_addresses_rewrite_only_legacy_resources_and_keep_the_input():
    doc = _state(resources=[
        {"mode": "managed", "type": "null_resource", "name": "a", "provider": "provider.null",
         "instances": [{"attributes": {"id": "1"}}, {"index_key": 1, "attributes": {"id": "2"}}]},
        {"mode": "managed", "type": "null_resource", "name": "b", "provider": NULL, "instances": [{"attributes": {"id": "3"}}]},
    ])
    before = json.dumps(doc)
    out, rewrites, positions = tfstate.modern_provider_addresses(doc)
    assert rewrites == {"provider.null": NULL} and positions == {(0, 0), (0, 1)}
    assert [r["provider"] for r in out["resources"]] == [NULL, NULL]
    assert json.dumps(doc) == before
    assert tfstate.modern_provider_addresses(out) == (out, {}, set())


def test_flatmap_instances_are_accepted_as_flatmap():
    state = tfstate.parse_state(json.dumps(_state(resources=[
        {"mode": "managed", "type": "null_resource", "name": "a", "provider": "provider.null",
         "instances": [{"schema_version": 0, "attributes_flat": {"id": "1", "triggers.%": "0"}}]}])))
    assert state.instances[0].flatmap == {"id": "1", "triggers.%": "0"}
    assert tfstate.parse_state(json.dumps(_state())).instances[0].flatmap is None


@pytest.mark.parametrize(
    ("value", "dynamic"),
    [
        ({"type": "string", "value": "x"}, True),
        ({"type": ["object", {"a": ["list", "number"]}], "value": {"a": [1, 2.5]}}, True),
        ({"type": ["tuple", ["string", "bool"]], "value": ["x", True]}, True),
        ({"type": ["map", "string"], "value": None}, True),
        ({"type": "dynamic", "value": None}, True),
        ({"type": "string", "value": 1}, False),
        ({"type": "A", "value": "x"}, False),  # a plain object with keys type and value
        ({"type": ["object", {"a": "string"}], "value": {"b": "x"}}, False),
        ({"type": ["tuple", ["string"]], "value": ["x", "y"]}, False),
        ({"type": ["list"], "value": []}, False),
    ],
)
def test_dynamic_wrappers_are_told_by_a_value_that_fits_its_type(value, dynamic):
    assert tfstate.is_dynamic_wrapper(value) is dynamic
    laid_out = json.loads(tfstate.dumps_terraform(_state(resources=[
        {"mode": "managed", "type": "t", "name": "n", "provider": NULL, "instances": [{"attributes": {"v": value}}]}])))
    assert list(laid_out["resources"][0]["instances"][0]["attributes"]["v"]) == (["value", "type"] if dynamic else ["type", "value"])


@pytest.mark.parametrize("text", ["null", 'provider["null"]', 'provider["a/b/c"]x', 'provider["a//c"]', 'module.x provider["a/b/c"]'])
def test_parse_provider_rejects(text):
    with pytest.raises(tfstate.StateError):
        tfstate.parse_provider(text)


def _state(**over):
    doc = {
        "version": 4,
        "terraform_version": "1.0.3",
        "serial": 3,
        "lineage": "l-1",
        "outputs": {},
        "resources": [
            {"mode": "managed", "type": "null_resource", "name": "a", "provider": NULL,
             "instances": [{"schema_version": 0, "attributes": {"id": "1"}}]},
        ],
    }
    doc.update(over)
    return doc


def test_parse_indexes_instances():
    doc = _state(resources=[
        {"mode": "managed", "type": "null_resource", "name": "many", "provider": NULL,
         "instances": [{"index_key": i, "schema_version": 0, "attributes": {"id": str(i)}} for i in range(3)]},
        {"module": "module.m", "mode": "data", "type": "null_data_source", "name": "d", "provider": NULL,
         "instances": [{"schema_version": 0, "attributes": {}}]},
        {"mode": "managed", "type": "null_resource", "name": "b", "provider": NULL,
         "instances": [{"schema_version": 1, "attributes": {"id": "c"}},
                       {"schema_version": 1, "deposed": "0a1b2c3d", "attributes": {"id": "old"}}]},
    ])
    state = tfstate.parse_state(json.dumps(doc))
    assert [(i.address, i.deposed) for i in state.instances] == [
        ("null_resource.many[0]", ""), ("null_resource.many[1]", ""), ("null_resource.many[2]", ""),
        ("module.m.data.null_data_source.d", ""), ("null_resource.b", ""), ("null_resource.b", "0a1b2c3d"),
    ]
    assert [i.address for i in state.managed()][-1] == "null_resource.b"
    assert state.instances[-1].schema_version == 1
    assert (state.serial, state.lineage) == (3, "l-1")


BAD_INPUTS = [
    (b"", "empty input"),
    (b"not json", "not valid JSON"),
    (b'{"version": 4, "serial": 1, "lin', "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[1,2]", "expected a JSON object at the top level, got array"),
    (json.dumps({"serial": 1, "lineage": "x"}).encode(), "state.version: missing"),
    (json.dumps(_state(version=3)).encode(), "state format version 3 (stamped Terraform 1.0.3) is not supported"),
    (json.dumps({**_state(version=3), "terraform_version": "0.12.31"}).encode(), "version 3 (stamped Terraform 0.12.31)"),
    (json.dumps({k: v for k, v in _state(version=2).items() if k != "terraform_version"}).encode(),
     "version 2 (from Terraform 0.11 or older)"),
    (json.dumps({"version": 3, "serial": 1, "lineage": "l", "backend": {"type": "s3", "config": {}, "hash": 1}}).encode(),
     'backend settings file (.terraform/terraform.tfstate, for the "s3" backend), not a state'),
    (json.dumps(_state(version="4")).encode(), "state.version: expected a number, got string"),
    (json.dumps({k: v for k, v in _state().items() if k != "lineage"}).encode(), "state.lineage: missing"),
    (json.dumps({k: v for k, v in _state().items() if k != "serial"}).encode(), "state.serial: missing"),
    (json.dumps(_state(serial="3")).encode(), "state.serial: expected a number, got string"),
    (json.dumps(_state(serial=-1)).encode(), "state.serial: must not be negative"),
    (json.dumps(_state(serial=2**63)).encode(), "state.serial: must be at most 9223372036854775807"),
    (json.dumps(_state(lineage=7)).encode(), "state.lineage: expected a string, got number"),
    (json.dumps(_state(resources={})).encode(), "state.resources: expected an array, got object"),
    (json.dumps(_state(resources=[{"mode": "managed"}])).encode(), "state.resources[0].type: missing"),
    (json.dumps(_state(resources=[{"mode": "weird", "type": "t", "name": "n", "provider": NULL, "instances": []}])).encode(),
     "state.resources[0].mode: must be"),
    (json.dumps(_state(resources=[{"mode": "managed", "type": "t", "name": "n", "provider": "aws", "instances": []}])).encode(),
     "state.resources[0].provider: provider address 'aws'"),
    (json.dumps(_state(resources=[{"mode": "managed", "type": "t", "name": "n", "provider": NULL,
                                   "instances": [{"schema_version": 0, "attributes_flat": {"id": 1}}]}])).encode(),
     "state.resources[0].instances[0].attributes_flat.id: expected a string, got number"),
    (json.dumps(_state(resources=[{"mode": "managed", "type": "t", "name": "n", "provider": "provider.a.b.c",
                                   "instances": []}])).encode(),
     "state.resources[0].provider: provider address 'provider.a.b.c' is not of the form"),
    # Whitespace between the parts, not inside a name; a comment ends at its line's end or its "*/".
    (json.dumps(_state(resources=[{"mode": "managed", "type": "t", "name": "n", "provider": "provider.nu ll",
                                   "instances": []}])).encode(),
     "state.resources[0].provider: provider address 'provider.nu ll' is not of the form"),
    (json.dumps(_state(resources=[{"mode": "managed", "type": "t", "name": "n", "provider": "provider.null # c\nx",
                                   "instances": []}])).encode(),
     "state.resources[0].provider: provider address 'provider.null # c\\nx' is not of the form"),
    (json.dumps(_state(resources=[{"mode": "managed", "type": "t", "name": "n", "provider": NULL,
                                   "instances": [{"schema_version": 0, "attributes": []}]}])).encode(),
     "state.resources[0].instances[0].attributes: expected an object, got array"),
    (json.dumps(_state(resources=[{"mode": "managed", "type": "t", "name": "n", "provider": NULL,
                                   "instances": [{"index_key": [1], "attributes": {}}]}])).encode(),
     "index_key: expected a number or a string, got array"),
    (json.dumps(_state(resources=[{"mode": "managed", "type": "t", "name": "n", "provider": NULL,
                                   "instances": [{"attributes": {}}, {"attributes": {}}]}])).encode(),
     "duplicate instance t.n"),
    (json.dumps({"meta": {}, "encrypted_data": "AAAA", "encryption_version": "v0"}).encode(), "OpenTofu-encrypted state"),
    (b'{"version": 4, "serial": NaN, "lineage": "x"}', "not valid JSON"),
    (b"[" * 100000 + b"]" * 100000, "not valid JSON"),
]


@pytest.mark.parametrize(("data", "message"), BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_state_is_one_clear_error(data, message):
    with pytest.raises(tfstate.StateError) as info:
        tfstate.parse_state(data)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_pretty_state_keeps_numbers_exact_and_terraform_key_order():
    text = '{"lineage": "l", "serial": 2, "version": 4, "resources": [], "outputs": {"x": {"value": 0.10000000000000000001, "type": "number"}}, "terraform_version": "1.0.3", "big": 123456789012345678901234567890}'
    out = tfstate.pretty_state(text)
    assert list(json.loads(out)) == ["version", "terraform_version", "serial", "lineage", "outputs", "resources", "big"]
    assert '"value": 0.10000000000000000001' in out
    assert "123456789012345678901234567890" in out
    assert out.endswith("}\n")


@pytest.mark.parametrize("text", [
    '{"a":1.5,"b":[0.1,-0.0,100,2e-7]}',
    '{"a":0.10000000000000000001}',
    '{"a":1.50,"b":1e2,"c":123456789012345678901234567890}',
    '{"s":"<&> \\u2028 ünï","n":null,"t":true}',
])
def test_exact_json_round_trips_every_number_exactly(text):
    parser = tfstate.ExactJSON()
    doc = parser.loads(text)
    out = parser.dumps_compact(doc)
    assert json.loads(out) == json.loads(text)
    for token in ("0.10000000000000000001", "1.50", "1e2", "123456789012345678901234567890", "2e-7"):
        if token in text:
            assert token in out or (token == "2e-7" and "2e-07" in out), out


def test_an_opentofu_envelope_gives_its_serial_and_lineage_and_its_bytes_back():
    import hashlib

    written = ('{"serial":7,"lineage":"l-1","meta":{"key_provider.pbkdf2.a":"PD4=","key_provider.pbkdf2.b":"e30="},'
               '"encrypted_data":"QUJD\\u003c","encryption_version":"v0"}')
    doc = json.loads(written)
    assert tfstate.envelope_ids(doc) == tfstate.EnvelopeIds(7, "l-1")
    # As PostgreSQL gives jsonb back: other key order, other spacing, "<" unescaped.
    stored = json.dumps(dict(sorted(doc.items(), key=lambda kv: (len(kv[0]), kv[0]))))
    assert tfstate.envelope_as_written(stored, hashlib.sha256(written.encode()).hexdigest()) == written
    assert tfstate.envelope_as_written(stored, hashlib.sha256((written + "\n").encode()).hexdigest()) == written + "\n"
    assert tfstate.envelope_as_written(stored, hashlib.sha256(stored.encode()).hexdigest()) is None  # not OpenTofu's layout
    assert tfstate.envelope_ids({"meta": {}, "encrypted_data": "", "encryption_version": "v0"}) is None
    for bad, message in (({"serial": True, "lineage": "l"}, '"serial" must be a whole number'),
                         ({"serial": -1, "lineage": "l"}, '"serial" must be a whole number'),
                         ({"serial": 2**63, "lineage": "l"}, '"serial" must be a whole number from 0 to 9223372036854775807, not 9223372036854775808'),
                         ({"serial": 1}, '"lineage" must be a non-empty string'),
                         ({"serial": 1, "lineage": ""}, '"lineage" must be a non-empty string')):
        with pytest.raises(tfstate.StateError, match=message):
            tfstate.envelope_ids({**bad, "encrypted_data": "", "encryption_version": "v0"}, "f.tfstate")


def test_private_bytes_decodes_each_text_the_same_every_time_and_refuses_what_is_not_base64():
    # A refresh decodes one `private` per read, so decoded texts are remembered: the second
    # decode of a text must give what the first did, and a bad text must fail every time.
    texts = {"bnVsbA==": b"null", "eyJzY2hlbWFfdmVyc2lvbiI6IjEifQ==": b'{"schema_version":"1"}', "": b""}
    for _ in range(2):
        for text, expected in texts.items():
            assert tfstate.private_bytes({"private": text}) == expected
        assert tfstate.private_bytes({}) == b""
        for bad in ("bnVsbA=", "!!!!", "bnVs bA==", 5, ["bnVsbA=="]):
            with pytest.raises(tfstate.StateError, match="not valid base64"):
                tfstate.private_bytes({"private": bad})
    long_text = "QUJD" * 200  # longer than what is remembered: decoded each time
    assert tfstate.private_bytes({"private": long_text}) == b"ABC" * 200
