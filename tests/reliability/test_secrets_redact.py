"""The redactor on its own: what it masks, what it leaves, and the escaped spellings of a secret."""
from __future__ import annotations

import json
import logging

import pytest

from kilolock import schema as sch
from kilolock.provider.logbridge import StderrLogBridge
from kilolock.redact import MASK, Redactor
from kilolock.sensitive import marked_paths, values_at


def test_masks_every_occurrence_longest_first_and_leaves_the_rest():
    r = Redactor()
    r.add("s3cr3t")
    r.add("s3cr3t-and-more")
    r.add("abc")  # too short to track: masking it would mangle ordinary text
    assert r.redact("a s3cr3t-and-more b s3cr3t c abc") == f"a {MASK} b {MASK} c abc"
    assert r.redact("nothing here") == "nothing here"
    assert Redactor().redact("s3cr3t") == "s3cr3t"


def test_escaped_spellings_are_the_same_secret():
    r = Redactor()
    secret = 'pa"ss\\wörd\n'
    r.add(secret)
    assert MASK in r.redact(json.dumps({"token": secret}))
    assert MASK in r.redact(json.dumps({"token": secret}, ensure_ascii=False))
    assert MASK in r.redact(repr(secret)) and secret not in r.redact(f"x {secret} y")


def test_many_secrets_share_prefixes():
    r = Redactor()
    values = [f"pass-{n:05d}" for n in range(5000)]
    for v in values:
        r.add(v)
    line = " ".join(values[::500])
    assert r.redact(line) == " ".join([MASK] * 10)


def test_values_at_marked_and_schema_paths():
    doc = {"a": {"k": "v1"}, "l": [{"x": "v2"}], "n": 3}
    marks = marked_paths([[{"type": "get_attr", "value": "a"}, {"type": "index", "value": {"value": "k", "type": "string"}}],
                          [{"type": "get_attr", "value": "l"}, {"type": "index", "value": {"value": 0, "type": "number"}}],
                          [{"type": "get_attr", "value": "missing"}], "malformed"])
    assert list(values_at(doc, marks)) == ["v1", {"x": "v2"}]
    r = Redactor()
    for v in values_at(doc, marks + [(sch.GetAttr("n"),)]):
        r.add_value(v)
    assert r.redact("v1 v2") == "v1 v2"  # shorter than MIN_LENGTH: not tracked
    r.add_value({"deep": ["value-in-a-list"]})
    assert r.redact("got value-in-a-list") == f"got {MASK}"


def test_log_bridge_masks_json_fields_messages_and_panics(caplog: pytest.LogCaptureFixture):
    r = Redactor()
    r.add("tok-123456")
    logger = logging.getLogger("kilolock.provider.redacttest")
    caplog.set_level(logging.DEBUG, logger=logger.name)
    bridge = StderrLogBridge(logger, r)
    bridge.line('{"@level":"debug","@message":"using tok-123456","token":"tok-123456"}\n')
    bridge.line("[DEBUG] token tok-123456\n")
    bridge.line("panic: bad token tok-123456\n")
    got = [rec.getMessage() for rec in caplog.records]
    assert got == [f"using {MASK} token='{MASK}'", f"[DEBUG] token {MASK}", f"panic: bad token {MASK}"]
