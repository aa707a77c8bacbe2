"""Small JSON documents from users (a provider config, a LockInfo), parsed as jsonb will store them.

Python's parser accepts NaN, infinities (also 1e999) and ``\\u0000``, which jsonb refuses at the
INSERT, after the input was accepted; and it recurses out on deep nesting. Each is a reason here.
"""
from __future__ import annotations

import json
import re
from typing import Any

_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class NotStorable(ValueError):
    """Why the bytes are not a JSON object jsonb will take: one line, without the input."""


def _not_json_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} does not fit a float64")
    return value


def load(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text, parse_constant=_not_json_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise NotStorable(f"not valid JSON: {exc}") from None
    except UnicodeDecodeError as exc:
        raise NotStorable(f"not valid JSON: not UTF-8 (byte {exc.start})") from None
    except ValueError as exc:
        raise NotStorable(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise NotStorable("not valid JSON: nested too deeply") from None
    if _NUL_ESCAPE.search(text):
        raise NotStorable("contains a NUL character (\\u0000), which cannot be stored")
    return doc
