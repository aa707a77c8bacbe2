"""``kl db migrate|status|stop``."""
from __future__ import annotations

import argparse

from kilolock.cli.commands import CommandContext


def add_migrate_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments."""


def run_migrate(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import db
    from kilolock.store.migrate import apply_migrations, bundled_migrations

    target = db.resolve_target()
    with db.connect(target.url) as conn:
        applied = apply_migrations(conn)
    if applied:
        for name in applied:
            print(f"applied  {name}")
    else:
        print(f"database is current ({len(bundled_migrations())} migrations)")
    return 0


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments."""


def run_status(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store import db
    from kilolock.store.migrate import pending_migrations

    target = db.resolve_target()
    with db.connect(target.url) as conn:
        pending = pending_migrations(conn)
    print(f"database  {target.describe()}")
    print(f"schema    {'current' if not pending else 'pending: ' + ', '.join(pending)}")
    return 0


def add_stop_arguments(parser: argparse.ArgumentParser) -> None:
    """No arguments."""


def run_stop(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.store.embedded import EmbeddedCluster, default_data_dir

    cluster = EmbeddedCluster(default_data_dir())
    print("embedded PostgreSQL stopped" if cluster.stop() else "embedded PostgreSQL was not running")
    return 0
