"""``kl notify add|list|remove|test|log``: notification channels (webhooks) and their delivery log.

A channel hears the events of the states its glob matches from the moment it is added (older
events are never replayed; --replay-open-drift sends the drift open now as drift.new, to it only). URLs and secrets given as {"env": "NAME"} are stored as that reference
and resolved at send time; neither a resolved one nor a literal secret is ever printed.
"""
from __future__ import annotations

import argparse
import json
from typing import Any
from urllib.parse import urlsplit

from kilolock import globs
from kilolock.cli import args as cli_args
from kilolock.cli import render
from kilolock.cli.commands import CommandContext
from kilolock.durations import format_duration
from kilolock.errors import KlError, UsageError

EVENTS = ("drift.new", "drift.updated", "drift.resolved", "refresh.failed", "refresh.guarded",
          "refresh.stale", "resource.duplicate", "resource.unmanaged")  # store.notify.EVENTS
# A state's own events. resource.duplicate (two states' claims) and resource.unmanaged (what a
# provider lists that no state manages) are about the fleet and are sent only to a channel that
# names them, so the channels made before they existed and those made without --events hear what
# they always heard.
OPT_IN_EVENTS = ("resource.duplicate", "resource.unmanaged")
DEFAULT_EVENTS = tuple(e for e in EVENTS if e not in OPT_IN_EVENTS)


def channel_name(text: str) -> str:
    cli_args.utf8_text(text)
    if not text or len(text) > 200 or not text.isprintable() or text != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a channel name (printable, no surrounding spaces, 1-200 characters)")
    return text


def _env_ref(text: str) -> Any:
    """TEXT as stored: a literal string, or {"env": "NAME"} given as that JSON."""
    if not text.lstrip().startswith("{"):
        return text
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not (isinstance(value, dict) and set(value) == {"env"} and isinstance(value["env"], str) and value["env"]):
        # argparse names the option ("argument --webhook: ...").
        raise argparse.ArgumentTypeError(f'give a literal value or {{"env": "NAME"}}, not {text!r}')
    return value


def webhook(text: str) -> Any:
    cli_args.utf8_text(text)
    value = _env_ref(text)
    if isinstance(value, str):
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            # The URL itself may be a credential: the message does not quote it.
            raise argparse.ArgumentTypeError('not an http(s) URL (or {"env": "NAME"} naming one)')
    return value


def secret(text: str) -> Any:
    cli_args.utf8_text(text)
    value = _env_ref(text)
    if isinstance(value, str) and not value:
        raise argparse.ArgumentTypeError("empty")
    return value


def event_list(text: str) -> list[str]:
    events = [e.strip() for e in text.split(",") if e.strip()]
    unknown = [e for e in events if e not in EVENTS]
    if unknown or not events:
        raise argparse.ArgumentTypeError(f"unknown event {', '.join(unknown) or '(none)'}; "
                                         f"events are {', '.join(EVENTS)}")
    return sorted(set(events), key=EVENTS.index)


def ui_url(text: str) -> str:
    cli_args.utf8_text(text)
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"{text!r} is not an http(s) URL")
    return text


def describe(value: Any) -> str:
    """A stored URL or secret as printed: an env reference by name, a literal URL by host only."""
    if value is None:
        return "-"
    if isinstance(value, dict) and "env" in value:
        return f"(env {value['env']})"
    parts = urlsplit(str(value))
    return f"{parts.scheme}://{parts.hostname}/…" if parts.hostname else "(set)"


def add_add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=channel_name, help="the channel's name")
    parser.add_argument("--webhook", required=True, type=webhook, metavar="URL",
                        help='where events are POSTed: an http(s) URL, or {"env": "NAME"} to read it at send time')
    parser.add_argument("--format", dest="payload_format", choices=("json", "slack"), default="json",
                        help="json: kl's versioned payload (default); slack: an incoming-webhook message")
    parser.add_argument("--states", metavar="GLOB", type=cli_args.state_glob, default="**",
                        help="states whose name matches: * within one /-separated segment, ** across (default **)")
    parser.add_argument("--events", type=event_list, default=list(DEFAULT_EVENTS), metavar="LIST",
                        help="comma-separated events to send (default all but resource.duplicate and resource.unmanaged): " + ", ".join(EVENTS))
    parser.add_argument("--secret", type=secret, metavar="S",
                        help='sign each body (X-Kilolock-Signature: sha256=HMAC): a value, or {"env": "NAME"}')
    parser.add_argument("--failed-after", type=cli_args.positive, default=1, metavar="N",
                        help="refresh.failed once a state's refreshes failed N times in a row (default 1); "
                             "once per streak")
    parser.add_argument("--stale-after", type=cli_args.duration, metavar="DURATION",
                        help="refresh.stale once a scheduled state (an active `kl schedule` matches it) has had no "
                             "successful refresh for this long, e.g. 6h or 1d; once per streak (default: not sent)")
    parser.add_argument("--replay-open-drift", action="store_true",
                        help="also send this channel (only) one drift.new per state for the drift open now, "
                             "after ignore rules (default: only drift found from now on)")
    parser.add_argument("--ui-url", type=ui_url, metavar="URL", help="the kl web UI's base URL, linked from payloads")
    parser.add_argument("--actor", type=cli_args.utf8_text, help="who adds it (default: $USER@cli)")


def run_add(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import notify

    if args.stale_after is not None and "refresh.stale" not in args.events:
        raise UsageError("--stale-after: the channel's --events do not include refresh.stale")
    if args.replay_open_drift and "drift.new" not in args.events:
        raise UsageError("--replay-open-drift: the channel's --events do not include drift.new")
    with context.open_store() as conn, conn.transaction():
        channel = notify.add_channel(
            conn, name=args.name, format=args.payload_format, webhook=args.webhook, secret=args.secret,
            states_glob=args.states, states_regex=globs.sql_regex(args.states), events=args.events,
            failed_after=args.failed_after, ui_url=args.ui_url, created_by=args.actor or cli_args.default_actor(),
            stale_after_s=args.stale_after)
        replayed = notify.replay_open_drift(conn, channel.id) if args.replay_open_drift else 0
    since = (f"replaying the open drift of {replayed} state(s), then what happens from now on" if args.replay_open_drift
             else "from now on, nothing older is sent")
    print(f"added notification channel {channel.name}: {', '.join(channel.events)} of states {channel.states_glob} "
          f"to {describe(channel.webhook)} ({channel.format}); {since}")
    return 0


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_format(parser)


def run_list(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import notify

    with context.open_store() as conn:
        channels = notify.list_channels(conn)
    if args.format == "json":
        render.emit_json({"version": 1, "channels": [
            {"name": c.name, "format": c.format, "webhook": describe(c.webhook),
             "secret": describe(c.secret) if isinstance(c.secret, dict) else ("(set)" if c.secret else None),
             "states": c.states_glob, "events": c.events, "failed_after": c.failed_after,
             "stale_after_s": c.stale_after_s, "ui_url": c.ui_url,
             "created_at": c.created_at, "created_by": c.created_by} for c in channels]})
        return 0
    if not channels:
        print("no notification channels (kl notify add NAME --webhook URL)")
        return 0

    render.table(["name", "format", "webhook", "secret", "states", "events", "failed after", "stale after"],
                 [(c.name, c.format, describe(c.webhook),
                   describe(c.secret) if isinstance(c.secret, dict) else ("(set)" if c.secret else "-"),
                   c.states_glob, ",".join(c.events), c.failed_after,
                   "-" if c.stale_after_s is None else format_duration(c.stale_after_s)) for c in channels])
    return 0


def add_remove_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=channel_name, help="the channel's name (kl notify list)")


def run_remove(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import notify

    with context.open_store() as conn:
        notify.remove_channel(conn, args.name)
    print(f"removed notification channel {args.name} and its deliveries")
    return 0


def add_test_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", type=channel_name, help="the channel's name (kl notify list)")


def run_test(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.notify.deliver import send_test
    from kilolock.store import notify

    with context.open_store() as conn:
        channel = notify.get_channel(conn, args.name)
    ok, said = send_test(channel)
    if not ok:
        raise KlError(f"channel {args.name}: the test notification was not accepted: {said}")
    print(f"channel {args.name}: test notification accepted ({said})")
    return 0


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--failed", action="store_true",
                        help="only deliveries whose last attempt failed (given up, or waiting to retry)")
    parser.add_argument("--channel", type=channel_name, metavar="NAME", help="only this channel's deliveries")
    parser.add_argument("--limit", type=cli_args.positive, default=50, metavar="N", help="newest N (default 50)")
    cli_args.add_format(parser)


def run_log(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import deliveries

    with context.open_store() as conn:
        rows = deliveries.delivery_log(conn, failed=args.failed, channel=args.channel, limit=args.limit)
    if args.format == "json":
        render.emit_json({"version": 1, "deliveries": [
            {"id": r["id"], "channel": r["channel"], "event": r["event"], "state": r["state"], "serial": r["serial"],
             "idempotency_key": r["idempotency_key"], "status": r["status"], "attempts": r["attempt_log"],
             "last_error": r["last_error"], "created_at": r["created_at"], "delivered_at": r["delivered_at"],
             "next_attempt_at": r["next_attempt_at"] if r["status"] == "pending" else None} for r in rows]})
        return 0
    if not rows:
        print("no failed deliveries" if args.failed else "no deliveries")
        return 0
    render.table(["id", "channel", "event", "state", "serial", "status", "attempts", "last error", "created"],
                 [(r["id"], r["channel"], r["event"], r["state"], r["serial"], r["status"], r["attempts"],
                   r["last_error"], r["created_at"]) for r in rows])
    return 0
