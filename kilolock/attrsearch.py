"""What a search by attribute value needs to know beyond the path (the UI's search and
`kl resources --where`): ``PATH = VALUE`` read, the path as jsonb steps, where each type's cached
schemas store the value (a dynamic attribute holds it under its wrapper), and which types'
schemas call it secret, so that a search never tells a secret by its yes or no. The caller reads
the schemas (store.history.cached_schemas)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kilolock import drift, versiondiff
from kilolock import schema as sch


@dataclass(frozen=True)
class Hints:
    """For one path: the types never to match (their schema calls the value secret) and the types
    whose value is stored elsewhere, with each place it may be (jsonb steps)."""

    secret_types: tuple[str, ...] = ()
    stored_paths: Mapping[str, list[list[str]]] = field(default_factory=dict)


def split_assignment(text: str) -> tuple[str, str] | None:
    """``PATH = VALUE`` cut at its first ``=`` outside brackets and quotes (``tags["a=b"] = x``), both
    sides stripped, a ``==`` read as ``=``; None without one."""
    depth, quoted, escaped, cut = 0, False, False, -1
    for i, c in enumerate(text):
        if quoted:
            escaped, quoted = (not escaped and c == "\\"), (quoted if escaped or c != '"' else False)
            continue
        if c == '"':
            quoted = True
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "=" and depth == 0:
            cut = i
            break
    if cut < 0:
        return None
    path_text, value_text = text[:cut].strip(), text[cut + 1:].strip()
    if value_text.startswith("="):
        value_text = value_text[1:].strip()
    return path_text, value_text


def path_steps(path: sch.AttributePath) -> list[str]:
    return [step.name if isinstance(step, sch.GetAttr) else str(step.key) for step in path]


@dataclass(frozen=True)
class Containing:
    """What the attribute index (migration 0032, jsonb ``@>``) can be asked for a value at a path:
    documents (JSON texts) of which every attributes object holding one of the values there contains
    one, and whether containing one is the same as holding a value (a scalar at keys only)."""

    documents: tuple[str, ...]
    exact: bool


def containing(path: sch.AttributePath, values: Sequence[str]) -> Containing | None:
    """The documents VALUES (JSON texts) at PATH make (``tags.env="prod"``: ``{"tags": {"env":
    "prod"}}``); None for a path through a list index, where containment cannot say the position
    (and ``#>`` reads an int step as a map's key too). An object or array value is contained in a
    larger one, so it is not exact: the value must still be compared."""
    import json

    if any(isinstance(step, sch.Index) and not isinstance(step.key, str) for step in path) or not path:
        return None
    documents, exact = [], True
    for text in values:
        doc: Any = json.loads(text)
        exact = exact and not isinstance(doc, (dict, list))
        for step in reversed(path):
            doc = {step.name if isinstance(step, sch.GetAttr) else step.key: doc}
        documents.append(json.dumps(doc, separators=(",", ":")))
    return Containing(tuple(documents), exact)


def schema_keys(kinds: Sequence[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """The schemas to read for KINDS (``provider``, ``mode``, ``type`` of every instance the search
    may match)."""
    return versiondiff.schema_keys([{**k, "address": "", "deposed": ""} for k in kinds])


def hints(kinds: Sequence[Mapping[str, Any]], schemas: versiondiff.Schemas, path: sch.AttributePath) -> Hints:
    """The hints for PATH over KINDS, from SCHEMAS (those of schema_keys, as cached)."""
    blocks = _kind_blocks(kinds, schemas)
    return Hints(tuple(sorted(_secret_types(blocks, path))), _stored_paths(blocks, path))


def _kind_blocks(kinds: Sequence[Mapping[str, Any]], schemas: versiondiff.Schemas) -> list[tuple[str, list[sch.Block]]]:
    """Each kind's type with its cached schemas' blocks, parsed once for the helpers below."""
    out = []
    for kind in kinds:
        key = versiondiff.schema_key(kind)
        out.append((str(kind["type"]), [sch.schema_from_json(b).block for b in schemas.get(key, ())] if key else []))
    return out


def _stored_paths(kinds: list[tuple[str, list[sch.Block]]], path: sch.AttributePath) -> dict[str, list[list[str]]]:
    """The types whose cached schemas store the value at PATH elsewhere than PATH's own steps (it
    crosses a dynamic value: ``manifest.metadata.name`` is under ``manifest``'s wrapper), with
    every place their instances may hold it. Without a cached schema a type is searched at PATH."""
    plain = tuple(path_steps(path))
    places: dict[str, set[tuple[str, ...]]] = {}
    for type_, blocks in kinds:
        places.setdefault(type_, set()).update({tuple(drift.stored_steps(b, path)) for b in blocks} or {plain})
    return {t: [list(p) for p in sorted(found)] for t, found in places.items() if found != {plain}}


def _secret_types(kinds: list[tuple[str, list[sch.Block]]], path: sch.AttributePath) -> set[str]:
    """Types whose cached schema calls the value at PATH (or one inside it) secret."""
    return {type_ for type_, blocks in kinds if any(versiondiff.schema_marks_path(b, path) for b in blocks)}


def loose_values(value_text: str) -> list[str]:
    """What ``PATH=VALUE`` (`kl resources --where`, /api/v1/resources) matches, as JSON texts: a
    JSON literal as it is (a quoted string, an array, an object, null), a number or a bool as that
    value or as the same text in a string (a map of strings holds ``"80"``), anything else as a
    string (``env=prod``)."""
    import json

    try:
        value = json.loads(value_text, parse_constant=_not_json)
    except ValueError:
        return [json.dumps(value_text)]
    if isinstance(value, (bool, int, float)):
        return [value_text, json.dumps(value_text)]
    return [value_text]


def _not_json(constant: str) -> Any:
    """NaN and Infinity are Python's, not JSON's (jsonb refuses them): such a value is text."""
    raise ValueError(constant)
