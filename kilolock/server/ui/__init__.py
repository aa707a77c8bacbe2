"""The web UI of `kl serve`, under /ui/: read-only pages of states, versions, diffs, drift and
search, rendered on the server from Jinja2 templates. No script, no external file: every page is
HTML and one stylesheet, sent with a Content-Security-Policy that allows nothing else.

``handle`` is the one entry point (kilolock/server/http.py routes /ui/ here after authentication);
what a principal may see is decided in access.py only."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg

from kilolock.errors import KlError
from kilolock.server.access import Grants
from kilolock.server.auth import Principal
from kilolock.server.backend import Response
from kilolock.store.db import DatabaseError
from kilolock.store.errors import StateNotFound

PREFIX = "/ui/"

# What the pages may load: their own stylesheet and icon; no script, frame, font or form target
# elsewhere. The rest keeps a page from being framed, sniffed or leaking its URL (state names,
# addresses) to another site.
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                                "base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), interest-cohort=()",
}
_HTML = "text/html; charset=utf-8"
_STATIC_TYPES = {".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def _response(status: int, body: bytes, content_type: str, **extra: str) -> Response:
    return Response(status, body, content_type, {**SECURITY_HEADERS, **extra})


def handle(connection: Callable[[], AbstractContextManager[psycopg.Connection]], principal: Principal, grants: Grants,
           method: str, path: str, params: dict[str, list[str]], replica: bool = False) -> Response:
    """Answer one request under /ui/ for an authenticated PRINCIPAL holding GRANTS. ``replica``:
    CONNECTION reaches a read replica, and the page says how far behind the primary it was."""
    from kilolock.server.ui import pages, render
    from kilolock.store import ui_queries

    if method != "GET":
        return _response(405, f"{method} is not allowed on {path}: the web UI is read-only\n".encode(),
                         "text/plain; charset=utf-8", Allow="GET")
    if path == "/ui":
        return _response(308, b"", _HTML, Location=PREFIX)
    if path.startswith("/ui/static/"):
        name = path[len("/ui/static/"):]
        body = render.static(name)
        kind = next((t for s, t in _STATIC_TYPES.items() if name.endswith(s)), None)
        if body is None or kind is None:
            return _error(404, f"no such file {path!r}", principal)
        return _response(200, body, kind, **{"Cache-Control": "private, max-age=300"})
    route = pages.ROUTES.get(path)
    if route is None:
        return _error(404, f"no such page {path!r}: start at {PREFIX}", principal)
    request = pages.Request(principal, grants, path, params)
    try:
        with connection() as conn, conn.transaction():
            ui_queries.read_only_snapshot(conn)
            view = route(conn, request)
            lag = ui_queries.replica_lag(conn) if replica else None
    except pages.PageError as exc:
        return _error(exc.status, str(exc), principal)
    except StateNotFound as exc:
        return _error(404, str(exc), principal)
    except DatabaseError:
        raise  # the server's own answer: 503, retry
    except KlError as exc:  # a bad glob or path in a query: the user's input, said on the page
        return _error(400, str(exc), principal)
    body = render.page(view.template, principal=principal, replica_lag=lag, **view.context)
    return _response(view.status, body, _HTML, **{"Cache-Control": "no-store"})


def _error(status: int, message: str, principal: Principal, **context: Any) -> Response:
    from kilolock.server.ui import render

    body = render.page("error.html", principal=principal, status=status, message=message, **context)
    return _response(status, body, _HTML, **{"Cache-Control": "no-store"})
