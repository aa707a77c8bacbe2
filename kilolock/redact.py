"""Secret strings kl knows of, and masking them in text that leaves kl: logs and error messages.

Providers echo what they are given: a token in a stderr line, an attribute value in a panic or a
diagnostic. kl cannot recognise a secret in free text, but it knows which values are secret: the
resolved ``{"env": ...}`` references of provider configs, schema-sensitive config attributes, and
the sensitive attribute values of the instances it refreshes (found by kilolock.sensitive).

A ``Redactor`` belongs to one refresh run: the orchestrator creates it and hands it down through
the client factory to every provider it launches, whose log bridge, stdio stream and stderr tail
("plugin exited" messages) pass through it, as do the run's recorded failure messages. Two runs in
one process (a fleet worker) thus never see each other's secrets. Within a run, a value once
secret stays secret.
Strings shorter than ``MIN_LENGTH`` are not tracked: masking "on" or "1" would mangle every log
line while protecting nothing.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from typing import Any

from kilolock.errors import KlError

MASK = "(sensitive)"  # as kl drift shows sensitive values
MIN_LENGTH = 4


class Redactor:
    """A set of secret strings; ``redact`` replaces each occurrence (longest first) with MASK.

    Lookup goes through the first MIN_LENGTH characters of every secret, so checking a line costs
    one dict lookup per character however many secrets are known (a refresh of thousands of
    passwords knows thousands).
    """

    def __init__(self) -> None:
        self._by_prefix: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def add(self, secret: str) -> None:
        if not isinstance(secret, str) or len(secret) < MIN_LENGTH:
            return
        # Log lines are often JSON (hclog) or repr()ed: the escaped spellings are the same secret.
        forms = {secret, json.dumps(secret, ensure_ascii=False)[1:-1], json.dumps(secret)[1:-1], repr(secret)[1:-1]}
        with self._lock:
            for form in forms:
                if len(form) < MIN_LENGTH:
                    continue
                key = form[:MIN_LENGTH]
                known = self._by_prefix.get(key, ())
                if form not in known:
                    self._by_prefix[key] = tuple(sorted((*known, form), key=len, reverse=True))

    def add_value(self, value: Any) -> None:
        """Every string inside a JSON value (a sensitive attribute may be a map, list or object)."""
        for s in _strings(value):
            self.add(s)

    def __bool__(self) -> bool:
        return bool(self._by_prefix)

    def redact(self, text: str) -> str:
        table = self._by_prefix
        if not table or len(text) < MIN_LENGTH:
            return text
        out: list[str] = []
        last = i = 0
        end = len(text) - MIN_LENGTH
        while i <= end:
            candidates = table.get(text[i:i + MIN_LENGTH])
            if candidates:
                for s in candidates:
                    if text.startswith(s, i):
                        out.append(text[last:i])
                        out.append(MASK)
                        i = last = i + len(s)
                        break
                else:
                    i += 1
            else:
                i += 1
        if not out:
            return text
        out.append(text[last:])
        return "".join(out)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)



def env_ref(value: Any) -> str | None:
    """The variable NAME when VALUE is a reference {"env": "NAME"}; None otherwise."""
    if isinstance(value, dict) and set(value) == {"env"} and isinstance(value["env"], str):
        return value["env"]
    return None


def resolve_env_refs(value: Any, secrets: Redactor, where: str = "config", error: type[KlError] = KlError) -> Any:
    """Replace every {"env": "NAME"} with the variable's value (the stored value keeps the
    reference); each resolved value becomes one of SECRETS. Used for provider configs and for
    notification webhook URLs and secrets alike. A variable that is not set raises ERROR."""
    if isinstance(value, dict):
        name = env_ref(value)
        if name is not None:
            if name not in os.environ:
                raise error(f"{where}: environment variable {name} is not set")
            # A value kept out of the store is a secret: mask it wherever it could be echoed.
            secrets.add(os.environ[name])
            return os.environ[name]
        return {k: resolve_env_refs(v, secrets, f"{where}.{k}", error) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_env_refs(v, secrets, f"{where}[{i}]", error) for i, v in enumerate(value)]
    return value
