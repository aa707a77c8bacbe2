"""What a notification says: the versioned JSON payload, the Slack message, the signature.

Both are built at send time from the event row (store/notify.py) and the lifecycle rows it names,
which never change once written, so every retry of an event sends the same content with the same
idempotency key (the event's id). Values are masked exactly as `kl drift` masks them
(kilolock.drift.changes over the rows' sensitivity marks and the cached schemas' sensitive
attributes): a sensitive value never leaves kl.
"""
from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote

from kilolock import drift

PAYLOAD_VERSION = 1
SIGNATURE_HEADER = "X-Kilolock-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"

_TITLES = {
    "drift.new": "started drifting",
    "drift.updated": "drift grew (more attributes differ)",
    "drift.resolved": "drift resolved",
    "refresh.failed": "refresh failed",
    "refresh.guarded": "refresh refused by the mass-removal guard",
    "refresh.stale": "no successful refresh",
    "resource.duplicate": "one object claimed more than once",
    "resource.unmanaged": "new unmanaged objects",
}

_COMMANDS = {"drift": "kl drift {state}", "refresh": "kl runs {state}", "resource": "kl resources --duplicates"}


def addresses(detail: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]],
              schemas: drift.Schemas | None = None) -> list[dict[str, Any]]:
    """A drift event's addresses, each with its changed paths and masked before/after values.
    ROWS: the lifecycle rows the event names (store.deliveries.resources), by id; SCHEMAS (cached)
    shape the paths as kl drift's."""
    out = []
    for a in detail.get("addresses", []):
        before, after = rows.get(str(a.get("baseline"))), rows.get(str(a.get("current")))
        key = None if after is None else drift.schema_key(after)
        block = None if after is None else drift.choose_block(
            drift.schema_blocks(schemas or {}, key), after["attributes"], (before or {}).get("attributes"))
        changes = [] if a["kind"] == "deleted" or before is None or after is None else drift.changes(
            before["attributes"], after["attributes"], before["sensitive_attributes"], after["sensitive_attributes"],
            drift.schema_sensitive(schemas or {}, key, before["attributes"], after["attributes"]), block=block)
        out.append({"address": a["address"], "deposed": a["deposed"] or None, "kind": a["kind"],
                    "paths": list(a.get("paths") or []),
                    "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in changes],
                    "resolved_how": a.get("resolved_how")})
    return out


def resource_ids(detail: Mapping[str, Any]) -> list[str]:
    return sorted({str(a[k]) for a in detail.get("addresses", []) for k in ("baseline", "current") if a.get(k)})


def ui_link(ui_url: str | None, state: str) -> str | None:
    return None if not ui_url else f"{ui_url.rstrip('/')}/states/{quote(state, safe='')}/drift"


def document(event: Mapping[str, Any], found: list[dict[str, Any]]) -> dict[str, Any]:
    """The `json` format's body, version PAYLOAD_VERSION (docs/notifications.md)."""
    kind, state = event["kind"], event["state_name"]
    created: datetime = event["created_at"]
    if kind == "resource.unmanaged":
        run = event.get("discovery_run_id")
        return {"version": PAYLOAD_VERSION, "event": kind, "idempotency_key": event["event_id"],
                "occurred_at": created.isoformat(), "state": state, "serial": None, "observation": None, "source": None,
                "run_id": run,
                "channel": event["channel"], "command": f"kl discover --results --run {run}",
                "ui_url": None, "discovery": dict(event["detail"])}
    body: dict[str, Any] = {
        "version": PAYLOAD_VERSION,
        "event": kind,
        "idempotency_key": event["event_id"],
        "occurred_at": created.isoformat(),
        "state": state,
        "serial": event["serial"],
        # The observation that found it (v7.3: the third of Terraform's v7); serial is its base's.
        "observation": event.get("observation"),
        "source": event.get("version_source"),
        "run_id": event["run_id"],
        "channel": event["channel"],
        "command": _COMMANDS[kind.split(".", 1)[0]].format(state=state),
        "ui_url": ui_link(event["ui_url"], state),
    }
    if kind.startswith("drift."):
        body["addresses"] = found
        if event["detail"].get("replayed"):
            body["replayed"] = True  # --replay-open-drift: drift open when the channel was added
    elif kind == "resource.duplicate":
        detail = event["detail"]
        body["duplicate"] = {k: detail.get(k) for k in ("confidence", "evidence", "provider", "type", "key", "claims")}
    elif kind == "refresh.stale":
        detail = event["detail"]
        body["stale"] = {"last_success_at": detail.get("last_success_at"), "stale_for_s": detail.get("stale_for_s"),
                         "stale_after_s": detail.get("stale_after_s"), "schedule": detail.get("schedule")}
    else:
        detail = event["detail"]
        body["refresh"] = {"error": detail.get("error"), "failures_in_a_row": detail.get("failures_in_a_row")}
    return body


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


MAX_SLACK_ADDRESSES = 10
MAX_SLACK_CHANGES = 5


def slack(doc: Mapping[str, Any]) -> dict[str, Any]:
    """An incoming-webhook message a person can read: what, where, and the command to paste."""
    kind, state = doc["event"], doc["state"]
    if kind == "resource.unmanaged":
        return _slack_message(*_unmanaged_lines(doc), doc)
    where = f"{state} {doc['observation']}" if doc.get("observation") else \
        f"{state}" + (f" v{doc['serial']}" if doc.get("serial") is not None else "")
    title = f"{_TITLES[kind]}: {len(doc['addresses'])} address(es) in {where}" if kind.startswith("drift.") \
        else f"{_TITLES[kind]}: {where}"
    lines: list[str] = []
    if kind.startswith("drift."):
        for a in doc["addresses"][:MAX_SLACK_ADDRESSES]:
            how = f" (by {a['resolved_how']})" if a.get("resolved_how") else ""
            lines.append(f"• `{_slack_escape(a['address'])}` {a['kind']}{how}")
            if kind != "drift.resolved":
                for c in a["changes"][:MAX_SLACK_CHANGES]:
                    lines.append(f"    `{_slack_escape(c['path'])}`: {_slack_escape(drift.show(c['before']))} → "
                                 f"{_slack_escape(drift.show(c['after']))}")
                if len(a["changes"]) > MAX_SLACK_CHANGES:
                    lines.append(f"    … {len(a['changes']) - MAX_SLACK_CHANGES} more")
        if len(doc["addresses"]) > MAX_SLACK_ADDRESSES:
            lines.append(f"… {len(doc['addresses']) - MAX_SLACK_ADDRESSES} more addresses")
    elif kind == "resource.duplicate":
        dup = doc["duplicate"]
        lines.append(f"{dup['confidence']} ({'same identity' if dup['evidence'] == 'identity' else 'same id'}): "
                     f"`{_slack_escape(str(dup['type']))}` of {_slack_escape(str(dup['provider']))}")
        for c in dup["claims"][:MAX_SLACK_ADDRESSES]:
            lines.append(f"• {_slack_escape(str(c['state']))}: `{_slack_escape(str(c['address']))}`")
    elif kind == "refresh.stale":
        stale = doc["stale"]
        last = stale.get("last_success_at")
        lines.append(f"last successful refresh: {_slack_escape(str(last)) if last else 'never'}; "
                     f"stale for {_span(stale.get('stale_for_s'))} (alert after {_span(stale.get('stale_after_s'))})")
        schedule = stale.get("schedule") or {}
        if schedule:
            every = f"every {_span(schedule.get('every_s'))}" if schedule.get("every_s") else f"cron `{schedule.get('cron')}`"
            lines.append(f"scheduled by schedule {schedule.get('id')} ({_slack_escape(str(schedule.get('states')))}, {every})")
    else:
        refresh = doc["refresh"]
        if refresh.get("failures_in_a_row"):
            lines.append(f"{refresh['failures_in_a_row']} failed run(s) in a row")
        if refresh.get("error"):
            lines.append(_slack_escape(str(refresh["error"])))
    return _slack_message(title, lines, doc)


def _unmanaged_lines(doc: Mapping[str, Any]) -> tuple[str, list[str]]:
    found = doc["discovery"]
    where = f" (provider config of {doc['state']})" if doc.get("state") else ""
    title = f"{_TITLES['resource.unmanaged']}: {found['new_unmanaged']} {found['type']} of {found['source']}{where}"
    objects = found.get("objects") or []
    lines = [f"• {_slack_escape(o.get('display_name') or '')} `{_slack_escape(json.dumps(o['identity'], sort_keys=True))}`"
             for o in objects[:MAX_SLACK_ADDRESSES]]
    if found["new_unmanaged"] > min(len(objects), MAX_SLACK_ADDRESSES):
        lines.append(f"… {found['new_unmanaged'] - min(len(objects), MAX_SLACK_ADDRESSES)} more")
    return title, lines


def _slack_message(title: str, lines: list[str], doc: Mapping[str, Any]) -> dict[str, Any]:
    context = f"See it: `{doc['command']}`"
    if doc.get("ui_url"):
        context += f" · <{doc['ui_url']}|open in Kilolock>"
    text = f"Kilolock: {_slack_escape(title)}"
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": f"*{text}*"}}]
    if lines:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:2900]}})
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    return {"text": text, "blocks": blocks}


def _span(seconds: Any) -> str:
    """Seconds as a person reads them: 90061 → 1d1h1m."""
    if seconds is None:
        return "?"
    left = int(float(seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    if left or not parts:
        parts.append(f"{left}s")
    return "".join(parts)


def body_bytes(format: str, doc: Mapping[str, Any]) -> bytes:
    payload = doc if format == "json" else slack(doc)
    return json.dumps(payload, ensure_ascii=False, sort_keys=True, default=str).encode()


def signature(secret: str, body: bytes) -> str:
    """The X-Kilolock-Signature value: HMAC-SHA256 of the exact body bytes, hex, with its scheme."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def headers(event: Mapping[str, Any], body: bytes, secret: str | None, user_agent: str) -> dict[str, str]:
    out = {"Content-Type": "application/json", "User-Agent": user_agent,
           "X-Kilolock-Event": str(event["kind"]), IDEMPOTENCY_HEADER: str(event["event_id"]),
           "X-Kilolock-Delivery": str(event["delivery_id"])}
    if secret:
        out[SIGNATURE_HEADER] = signature(secret, body)
    return out
