"""The pages: each reads what it shows through store/ui_queries.py (and the diff through
store/history.py) in one read-only transaction, masks secrets as `kl state diff` and `kl drift`
do (kilolock.versiondiff, kilolock.drift), and fills a template. Whether a principal may see a
state is asked of access.py only."""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

from kilolock import attrsearch, drift, globs, versiondiff
from kilolock import schema as sch
from kilolock.errors import KlError
from kilolock.server.access import Grants
from kilolock.server.auth import Principal
from kilolock.server.ui import access, svg
from kilolock.store import history, ui_queries
from kilolock.store.errors import StateNotFound

DEFAULT_PER_PAGE = 50
MAX_PER_PAGE = 500
CHART_POINTS = 200


class PageError(KlError):
    """A request the UI answers with an error page: a status and one line saying what is wrong."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Request:
    principal: Principal
    grants: Grants
    path: str
    params: Mapping[str, list[str]]

    def get(self, key: str) -> str | None:
        values = self.params.get(key)
        return values[0].strip() if values and values[0].strip() else None

    def number(self, key: str, default: int | None = None, minimum: int = 0) -> int | None:
        raw = self.get(key)
        if raw is None:
            return default
        try:
            n = int(raw)
        except ValueError:
            raise PageError(400, f"query parameter {key}={raw!r} is not a whole number") from None
        if n < minimum:
            raise PageError(400, f"query parameter {key}={raw!r} must be at least {minimum}")
        return n

    @property
    def per_page(self) -> int:
        per = self.number("per", DEFAULT_PER_PAGE, minimum=1)
        assert per is not None
        return min(per, MAX_PER_PAGE)

    def current(self) -> dict[str, str]:
        return {k: v[0] for k, v in self.params.items() if v and v[0]}


@dataclass(frozen=True)
class Pager:
    """One paginated list: its query parameter (several lists share a page), page, size, total."""

    request: Request
    param: str
    page: int
    per: int
    total: int
    anchor: str = ""
    label: str = "pages"
    more: bool = False  # more than total, not counted (a search's count stops at a cap)

    @classmethod
    def of(cls, request: Request, param: str, anchor: str = "", label: str = "pages") -> Pager:
        page = request.number(param, 1, minimum=1)
        assert page is not None
        return cls(request, param, page, request.per_page, 0, anchor, label)

    def with_total(self, total: int, more: bool = False) -> Pager:
        return Pager(self.request, self.param, self.page, self.per, total, self.anchor, self.label, more)

    @property
    def total_text(self) -> str:
        """The total as a page says it: ``more than 10,000`` past a count's cap."""
        return f"more than {self.total:,}" if self.more else str(self.total)

    @property
    def offset(self) -> int:
        return (self.page - 1) * self.per

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.per))

    @property
    def first_shown(self) -> int:
        return min(self.total, self.offset + 1)

    @property
    def last_shown(self) -> int:
        return min(self.total, self.offset + self.per)

    def href(self, page: int) -> str:
        return link(self.request.path, {**self.request.current(), self.param: str(page)}) + (f"#{self.anchor}" if self.anchor else "")


def link(path: str, params: Mapping[str, Any]) -> str:
    from urllib.parse import urlencode

    kept = {k: v for k, v in params.items() if v not in (None, "")}
    return path + ("?" + urlencode(kept) if kept else "")


@dataclass
class View:
    template: str
    context: dict[str, Any] = field(default_factory=dict)
    status: int = 200


def _require_state(request: Request, key: str) -> str:
    name = request.get(key)
    if name is None:
        raise PageError(400, f"query parameter {key} (a state name) is missing")
    if not access.visible(request.grants, name):
        # the same answer as a state that does not exist: a refusal would tell that it does
        raise PageError(404, str(StateNotFound(name)))
    return name


# --- states overview ---------------------------------------------------------------------------


def overview(conn: psycopg.Connection, request: Request) -> View:
    glob = request.get("q")
    sort = request.get("sort") or "name"
    if sort not in ui_queries.OVERVIEW_SORTS:
        raise PageError(400, f"sort={sort!r}: sort by one of {', '.join(ui_queries.OVERVIEW_SORTS)}")
    order = request.get("order") or ("asc" if sort == "name" else "desc")
    if order not in ("asc", "desc"):
        raise PageError(400, f"order={order!r}: use asc or desc")
    regex = None
    if glob is not None:
        # a plain word finds the names that contain it; `*`, `**` and `?` make it a glob
        regex = globs.sql_regex(glob if globs.is_glob(glob) else f"**{glob}**")
    pager = Pager.of(request, "page")
    found = ui_queries.states_overview(conn, access.visible_regexes(request.grants), regex, sort, order == "desc",
                                       pager.per, pager.offset)
    sorts = {key: link("/ui/", {**request.current(), "sort": key, "page": None,
                                "order": ("desc" if order == "asc" else "asc") if key == sort else ("asc" if key == "name" else "desc")})
             for key in ui_queries.OVERVIEW_SORTS}
    return View("overview.html", {"states": found.rows, "pager": pager.with_total(found.total), "q": glob or "",
                                  "sort": sort, "order": order, "sorts": sorts})


# --- a state -----------------------------------------------------------------------------------


def state(conn: psycopg.Connection, request: Request) -> View:
    name = _require_state(request, "name")
    head = ui_queries.state_header(conn, name)
    sid = head["id"]
    versions = Pager.of(request, "vpage", "versions", "version pages")
    runs = Pager.of(request, "rpage", "runs", "refresh run pages")
    drifts = Pager.of(request, "dpage", "drift", "drift pages")
    instances = Pager.of(request, "ipage", "instances", "instance pages")
    v = ui_queries.versions_page(conn, sid, versions.per, versions.offset)
    r = ui_queries.runs_page(conn, sid, runs.per, runs.offset)
    d = ui_queries.open_drift_page(conn, sid, drifts.per, drifts.offset)
    i = ui_queries.instances_page(conn, sid, instances.per, instances.offset)
    series = ui_queries.drift_series(conn, sid, CHART_POINTS)
    return View("state.html", {
        "state": head,
        "versions": v.rows, "versions_pager": versions.with_total(v.total),
        "runs": r.rows, "runs_pager": runs.with_total(r.total),
        "drift": _drift_entries(conn, d.rows), "drift_pager": drifts.with_total(d.total),
        "instances": i.rows, "instances_pager": instances.with_total(i.total),
        "rules": ui_queries.ignore_rules_for(conn, sid, name),
        "chart": svg.drift_chart(series, hidden=head["ignored_drift"]), "chart_summary": svg.summary(series, head["ignored_drift"]),
    })


def _drift_entries(conn: psycopg.Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`kl drift`'s entries, with values masked by the provider's cached schema as well as the
    objects' marks (everything masked without a schema), as the diff masks them."""
    def side(r: Mapping[str, Any], which: str) -> dict[str, Any]:
        return {"address": r["address"], "deposed": r["deposed"], "mode": r["mode"] or "managed", "type": r["type"],
                "provider": r["provider"], "status": None, "attributes": r[f"{which}_attributes"],
                "sensitive_attributes": r[f"{which}_sensitive_attributes"]}

    sides = [(side(r, "previous"), side(r, "current")) for r in rows]
    schemas = history.cached_schemas(conn, versiondiff.schema_keys([s for pair in sides for s in pair]))
    out = []
    for r, (before, after) in zip(rows, sides, strict=True):
        entry = drift.entry(r)
        if r["drift_kind"] != "deleted":
            entry["changes"] = versiondiff.instance(before, after, schemas, set())["changes"]
        out.append(entry)
    return out


# --- diff of two versions ------------------------------------------------------------------------


def diff(conn: psycopg.Connection, request: Request) -> View:
    name = _require_state(request, "state")
    serial_from = request.number("from")
    serial_to = request.number("to")
    if serial_to is None and serial_from is not None:
        raise PageError(400, "query parameter to (a serial) is missing; from needs a to")
    try:
        sid, serial_from, serial_to = history.endpoints(conn, name, serial_from, serial_to)
    except StateNotFound as exc:
        raise PageError(404, str(exc)) from None
    except KlError as exc:
        raise PageError(404, str(exc)) from None
    pager = Pager.of(request, "page", "changes")
    context: dict[str, Any] = {"state_name": name, "from": serial_from, "to": serial_to, "instances": [],
                               "counts": dict.fromkeys(versiondiff.ACTIONS, 0), "note": None, "pager": pager}
    if serial_from is None or serial_from == serial_to:
        return View("diff.html", context)
    pairs = versiondiff.pairs(history.differing_objects(conn, sid, serial_from, serial_to))
    counts = context["counts"]
    for before, after in pairs:
        counts["added" if before is None else "removed" if after is None else "changed"] += 1
    shown = pairs[pager.offset:pager.offset + pager.per]
    rows = [r for pair in shown for r in pair if r is not None]
    schemas = history.cached_schemas(conn, versiondiff.schema_keys(rows))
    unknown: set[str] = set()
    entries = [versiondiff.instance(b, a, schemas, unknown) for b, a in shown]
    context.update(instances=[e for e in entries if versiondiff.is_change(e)], pager=pager.with_total(len(pairs)),
                   note=versiondiff.masked_note(name, sorted(unknown)))
    return View("diff.html", context)


# --- a resource instance's lifecycle --------------------------------------------------------------

_HOW = {"apply": "changed by apply", "import": "changed by import", "refresh": "drifted (seen by refresh)"}
_BORN = {"apply": "created by apply", "import": "imported", "refresh": "appeared in a refresh"}
_GONE = {"apply": "deleted by apply", "import": "absent from an import", "refresh": "deleted outside Terraform (seen by refresh)"}


def resource(conn: psycopg.Connection, request: Request) -> View:
    name = _require_state(request, "state")
    address = request.get("address")
    if address is None:
        raise PageError(400, "query parameter address (a resource instance address) is missing")
    deposed = request.get("deposed") or ""
    sid = ui_queries.state_header(conn, name)["id"]
    pager = Pager.of(request, "page", "timeline", "timeline pages")
    # one more on each side than shown: each lifecycle is compared with the ones next to it
    before = 1 if pager.offset else 0
    found = ui_queries.lifecycles_page(conn, sid, address, deposed, pager.per + 1 + before, pager.offset - before)
    if not found.rows and pager.page == 1:
        raise PageError(404, f"state {name!r} has never held an instance at {address!r}")
    rows = found.rows
    schemas = history.cached_schemas(conn, versiondiff.schema_keys(rows))
    unknown: set[str] = set()
    events: list[dict[str, Any]] = []
    for i in range(before, min(len(rows), before + pager.per)):
        life = rows[i]
        newer = rows[i - 1] if i > 0 else None
        older = rows[i + 1] if i + 1 < len(rows) else None
        if life["delete_serial"] is not None and not (newer is not None and newer["create_serial"] == life["delete_serial"]):
            events.append({"what": _GONE.get(life["closed_source"], "deleted"), "kind": "deleted", "serial": life["delete_serial"],
                           "source": life["closed_source"], "actor": life["closed_actor"], "at": life["closed_at"],
                           "changes": [], "status": None})
        if older is not None and older["delete_serial"] == life["create_serial"]:
            entry = versiondiff.instance(older, life, schemas, unknown)
            kind = "drifted" if life["opened_source"] == "refresh" else "changed"
            events.append({"what": _HOW.get(life["opened_source"], "changed"), "kind": kind, "serial": life["create_serial"],
                           "source": life["opened_source"], "actor": life["opened_actor"], "at": life["opened_at"],
                           "changes": entry["changes"], "status": entry["status"]})
        else:
            events.append({"what": _BORN.get(life["opened_source"], "created"), "kind": "created", "serial": life["create_serial"],
                           "source": life["opened_source"], "actor": life["opened_actor"], "at": life["opened_at"],
                           "changes": [], "status": None})
    latest = rows[0] if rows and not before else None
    return View("resource.html", {
        "state_name": name, "address": address, "deposed": deposed, "events": events, "pager": pager.with_total(found.total),
        "latest": latest, "current": latest is not None and latest["delete_serial"] is None,
        "drift_records": ui_queries.drift_at(conn, sid, address, deposed),
        "note": versiondiff.masked_note(name, sorted(unknown)),
    })


# --- search across states ------------------------------------------------------------------------


def parse_attribute_query(text: str) -> tuple[sch.AttributePath, Any]:
    """``PATH = JSON``: a path as Terraform writes one (``tags["env"]``, ``rule[0].cidr``) and a JSON
    literal (``"prod"``, ``80``, ``true``, ``null``, ``["a"]``). Raises PageError naming what is wrong."""
    import json

    split = attrsearch.split_assignment(text)
    if split is None:
        raise PageError(400, f"attribute {text!r}: write PATH = VALUE, e.g. tags[\"env\"] = \"prod\" or port = 80")
    path_text, value_text = split
    try:
        path = sch.path_parse(path_text)
    except ValueError as exc:
        raise PageError(400, str(exc)) from None
    try:
        value = json.loads(value_text)
    except ValueError:
        raise PageError(400, f"attribute value {value_text!r} is not a JSON literal: quote a string (\"prod\"), "
                             "write numbers, true, false and null as they are") from None
    return path, value


def search(conn: psycopg.Connection, request: Request) -> View:
    import json

    form = {k: request.get(k) or "" for k in ("type", "address", "provider", "attr")}
    pager = Pager.of(request, "page", "results", "result pages")
    context: dict[str, Any] = {"form": form, "results": None, "pager": pager, "hidden": []}
    if not any(form.values()):
        return View("search.html", context)
    address_regex = None
    if form["address"]:
        address_regex = globs.address_regex(form["address"])
    path_steps, value = None, None
    path: sch.AttributePath = ()
    if form["attr"]:
        path, literal = parse_attribute_query(form["attr"])
        path_steps, value = attrsearch.path_steps(path), json.dumps(literal)
    every = ui_queries.state_names(conn)
    names = access.visible_names(request.grants, every)
    query = ui_queries.Search(None if len(names) == len(every) else ui_queries.state_ids(conn, names), type=form["type"] or None, address_regex=address_regex,
                              provider=form["provider"] or None, path=path_steps, value=value)
    if path_steps is not None:
        kinds = ui_queries.search_kinds(conn, query)
        hints = attrsearch.hints(kinds, history.cached_schemas(conn, attrsearch.schema_keys(kinds)), path)
        # The attribute index answers for the value where every type keeps it at the path itself.
        found_in = attrsearch.containing(path, [value]) if value is not None and not hints.stored_paths else None
        query = ui_queries.Search(**{**query.__dict__, "exclude_types": hints.secret_types,
                                     "stored_paths": hints.stored_paths,
                                     "contains": found_in.documents[0] if found_in else None,
                                     "exact": bool(found_in and found_in.exact)})
        context["hidden"] = ui_queries.present_types(conn, query.state_ids, hints.secret_types)
    found = ui_queries.search(conn, query, pager.per, pager.offset)
    # The same instances with their identity, status and drift, for tools: `kl resources` over
    # HTTP. Its --provider is a source, not the search's substring, so that filter is left out.
    from urllib.parse import urlencode

    api = {"type": form["type"], "address": form["address"], "where": form["attr"]}
    context.update(results=found.rows, pager=pager.with_total(found.total, found.more),
                   api_url="/api/v1/resources?" + urlencode({k: v for k, v in api.items() if v}))
    return View("search.html", context)


# --- discovery -----------------------------------------------------------------------------------


def discovery(conn: psycopg.Connection, request: Request) -> View:
    """Each discovery scope's latest run, or (run=ID) what one run listed. A run with a state's
    provider config is shown to those who may see that state; what a run's objects are claimed by
    names only the states the principal may see."""
    run_id = request.get("run")
    if run_id is None:
        scopes = [sc for sc in ui_queries.discovery_scopes(conn)
                  if sc.state is None or access.visible(request.grants, sc.state)]
        return View("discovery.html", {"scopes": scopes, "run": None})
    found = ui_queries.discovery_run(conn, run_id)
    if found is None or (found[0].state is not None and not access.visible(request.grants, found[0].state)):
        raise PageError(404, f"no discovery run {run_id}")
    run, objects = found
    shown = [{"identity": o.identity, "display_name": o.display_name, "match": o.match, "new": o.is_new,
              "claims": [c for c in o.claims if access.visible(request.grants, c["state"])],
              "hidden_claims": sum(1 for c in o.claims if not access.visible(request.grants, c["state"]))}
             for o in objects]
    return View("discovery.html", {"scopes": None, "run": run, "objects": shown})


ROUTES = {"/ui/": overview, "/ui/state": state, "/ui/diff": diff, "/ui/resource": resource, "/ui/search": search,
          "/ui/discovery": discovery}
