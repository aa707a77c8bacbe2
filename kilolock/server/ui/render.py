"""Jinja2, set up once: templates and static files read through importlib.resources, so they load
the same from a checkout, a wheel and kl.pyz (a zip). Autoescape is on for every template."""
from __future__ import annotations

import functools
import re
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Any
from urllib.parse import urlencode

import jinja2
from markupsafe import Markup, escape

from kilolock import drift, tfstate

_PACKAGE = "kilolock.server.ui"


def _read(kind: str, name: str) -> str | None:
    if "/" in name or "\\" in name or name.startswith("."):
        return None
    item = resources.files(_PACKAGE).joinpath(kind).joinpath(name)
    try:
        return item.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def _load_template(name: str) -> str | None:
    return _read("templates", name)


@functools.cache
def static(name: str) -> bytes | None:
    """A file of static/ (the stylesheet, the icon), or None."""
    text = _read("static", name)
    return None if text is None else text.encode()


def _when(value: datetime | None) -> str:
    if value is None:
        return "—"
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _iso(value: datetime | None) -> str:
    return "" if value is None else value.astimezone(timezone.utc).isoformat(timespec="seconds")


def _age(value: timedelta | None) -> str:
    return "—" if value is None else drift.duration(value.total_seconds()) + " ago"


def _took(value: timedelta | None) -> str:
    if value is None:
        return "—"
    seconds = value.total_seconds()
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else drift.duration(seconds) if seconds >= 60 else f"{seconds:.1f} s"


def _value(v: Any) -> str:
    """A before/after value as kl prints one (the mask as is, everything else as JSON)."""
    return "(absent)" if v is None else drift.show(v)


def _provider(address: str) -> str:
    """A provider as a user writes its source (``registry.terraform.io/hashicorp/null``), not as the
    state spells its configuration (``provider["registry.terraform.io/hashicorp/null"]``)."""
    try:
        ref = tfstate.parse_provider(address)
    except tfstate.StateError:
        return address  # not kl's to correct here: shown as stored
    return ref.source + (f" (alias {ref.alias})" if ref.alias else "")


# Where a path may wrap on a narrow screen: after a step's dot and before an index, so that a line
# ends between steps (rule[0].<wbr>cidr), never inside a name; after a slash too, for a provider's
# source (registry.terraform.io/<wbr>hashicorp/<wbr>null) and keys such as app.kubernetes.io/name.
_PATH_BREAK = re.compile(r"(?<=[./])(?=.)|(?<=.)(?=\[)")


def _path(path: str) -> Markup:
    return Markup("<wbr>").join(escape(part) for part in _PATH_BREAK.split(path))


def _query(base: str, params: dict[str, Any]) -> str:
    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return base + ("?" + urlencode(kept) if kept else "")


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FunctionLoader(_load_template), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(when=_when, iso=_iso, age=_age, took=_took, value=_value, seconds=drift.duration,
                       provider=_provider, path=_path)
    env.globals["url"] = _query
    return env


def page(template: str, **context: Any) -> bytes:
    return environment().get_template(template).render(**context).encode()
