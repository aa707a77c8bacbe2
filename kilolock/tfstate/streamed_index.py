"""A state's index (what ``parse_state(..., keep_objects=False)`` gives) read from its text one
instance at a time, so that the parsed document is never held whole beside its text."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from kilolock.tfstate.checks import StateError
from kilolock.tfstate.parse import (
    MAX_NESTING,
    State,
    _check_resource,
    _check_top,
    _InstanceIndex,
    _nested_deeper_than,
    _reject_constant,
    is_backend_settings,
    is_encrypted_envelope,
)


class _NotStreamable(Exception):
    """The text is not laid out as index_state_text reads it (or has an error): parse it whole."""


_JSON_SPACE = re.compile(r"[ \t\n\r]*")
_STREAM_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def index_state_text(text: str, origin: str = "state") -> State | None:
    """What ``parse_state(text, origin, keep_objects=False)`` gives, for a version-4 state whose
    resources each list their "instances" last (as Terraform and OpenTofu write them), parsed one
    instance at a time: the document is never held whole beside its text (an import's peak was the
    two). None for any other text, including one with an error: the caller parses it whole, which
    reports what is wrong exactly as before."""
    try:
        return _index_streamed(text, origin)
    except (_NotStreamable, StateError, ValueError, RecursionError, IndexError):
        return None


def _index_streamed(text: str, origin: str) -> State:
    scan = _STREAM_DECODER.raw_decode
    index = _InstanceIndex(keep_objects=False)

    def space(text: str, i: int) -> re.Match[str]:
        found = _JSON_SPACE.match(text, i)
        assert found is not None  # the pattern matches the empty string
        return found

    def value(i: int, depth: int) -> tuple[Any, int]:
        v, i = scan(text, i)
        if _nested_deeper_than(v, MAX_NESTING - depth) if isinstance(v, (dict, list)) else False:
            raise _NotStreamable
        return v, i

    def members(i: int, on_key: Callable[[str, int], int]) -> int:
        """An object's members from just after its "{": ON_KEY(key, index of the value) reads
        each value and returns where it ends; returns where the object ends."""
        i = space(text, i).end()
        if text[i] == "}":
            return i + 1
        while True:
            if text[i] != '"':
                raise _NotStreamable
            key, i = scan(text, i)
            i = space(text, i).end()
            if text[i] != ":":
                raise _NotStreamable
            i = on_key(key, space(text, i + 1).end())
            i = space(text, i).end()
            if text[i] == "}":
                return i + 1
            if text[i] != ",":
                raise _NotStreamable
            i = space(text, i + 1).end()

    def elements(i: int, on_item: Callable[[int, int], int]) -> int:
        """An array's elements from just after its "[": ON_ITEM(n, index) reads element n."""
        i = space(text, i).end()
        if text[i] == "]":
            return i + 1
        n = 0
        while True:
            i = space(text, on_item(n, i)).end()
            if text[i] == "]":
                return i + 1
            if text[i] != ",":
                raise _NotStreamable
            i = space(text, i + 1).end()
            n += 1

    def resource(ri: int, i: int) -> int:
        if text[i] != "{":
            raise _NotStreamable
        res: dict[str, Any] = {}
        rpath = f"{origin}.resources[{ri}]"

        def on_key(key: str, j: int) -> int:
            if "instances" in res:  # a field after the instances: they were indexed without it
                raise _NotStreamable
            if key != "instances":
                res[key], j = value(j, 4)
                return j
            if text[j] != "[":
                raise _NotStreamable
            res["instances"] = []
            _check_resource(res, rpath)

            def on_item(ii: int, k: int) -> int:
                obj, k = value(k, 5)
                index.add(res, ri, ii, obj, rpath)
                return k

            return elements(j + 1, on_item)

        i = members(i + 1, on_key)
        if "instances" not in res:
            raise _NotStreamable
        return i

    top: dict[str, Any] = {}
    streamed = [False]

    def on_top_key(key: str, j: int) -> int:
        if key != "resources":
            top[key], j = value(j, 2)
            return j
        if streamed[0] or text[j] != "[":  # a second "resources" replaces the first in a parse
            raise _NotStreamable
        streamed[0] = True
        return elements(j + 1, resource)

    i = space(text, 0).end()
    if text[i] != "{":
        raise _NotStreamable
    i = members(i + 1, on_top_key)
    if space(text, i).end() != len(text) or top.get("version") != 4 or is_encrypted_envelope(top) or is_backend_settings(top):
        raise _NotStreamable
    _check_top(top, origin)
    return State(raw=top, instances=index.instances)
