"""``kl worker``: claim due refreshes from the fleet's queue and run them."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from kilolock.cli import args as cli_args
from kilolock.cli.commands import CommandContext
from kilolock.durations import from_env, parse_duration

EXAMPLE = """examples:
  kl worker --parallel-states 4 --name "$(hostname)-a"     # on every host that shares the database
  kl worker --once                                         # a CI cron job: run what is due, then exit"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EXAMPLE
    parser.add_argument("--parallel-states", type=cli_args.positive, default=1, metavar="N",
                        help="states refreshed at once by this worker (default 1)")
    parser.add_argument("--name", type=cli_args.utf8_text, help="how kl fleet status names it (default HOST:PID)")
    parser.add_argument("--once", action="store_true",
                        help="run what is due now (schedules and queued jobs), then exit: 1 if a run failed")
    parser.add_argument("--lease", type=cli_args.duration, metavar="DURATION",
                        help="how long a job stays this worker's without a heartbeat (default 60s, "
                             "$KL_WORKER_LEASE); another worker takes it over after that")
    parser.add_argument("--grace", type=cli_args.duration, metavar="DURATION", default=60.0,
                        help="after SIGTERM, how long runs may go on before they are cancelled and queued again (default 60s)")
    parser.add_argument("--poll", type=cli_args.duration, metavar="DURATION",
                        help="how often to look for due work (default 2s, $KL_WORKER_POLL)")
    parser.add_argument("--warm-providers", type=_at_least_zero, default=4, metavar="N",
                        help="provider processes kept running between states for reuse by the next run with the same "
                             "binary, config and workdir (default 4; 0: launch one per run, as kl refresh does)")
    parser.add_argument("--warm-idle", type=cli_args.duration, metavar="DURATION", default=300.0,
                        help="shut a warm provider down after it has been idle this long (default 5m)")
    parser.add_argument("--lock-timeout", metavar="DURATION", default="0s",
                        help="how long a run waits for a Terraform lock someone holds (default 0s: the run fails, the next time retries)")


def _at_least_zero(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return n


def run(args: argparse.Namespace, context: CommandContext) -> int:
    from kilolock.fleet.worker import Worker, WorkerConfig
    from kilolock.refresh.options import RefreshOverrides
    from kilolock.store import db

    lease = args.lease or from_env("KL_WORKER_LEASE", 60.0, allow_zero=False)
    config = WorkerConfig(name=args.name, parallel_states=args.parallel_states, once=args.once, lease_s=lease,
                          poll_s=args.poll or from_env("KL_WORKER_POLL", 2.0, allow_zero=False), grace_s=args.grace,
                          warm_providers=args.warm_providers, warm_idle_s=args.warm_idle)
    # A worker's run is `kl refresh STATE` with the state's stored settings and kl's defaults; a
    # bad --lock-timeout is refused here, before anything starts.
    overrides = RefreshOverrides(lock_timeout=parse_duration(args.lock_timeout, allow_zero=True),
                                 default_actor=cli_args.default_actor())
    from kilolock.notify.deliver import Background
    from kilolock.provider.process import sweep_orphaned_socket_dirs
    from kilolock.store import notify

    # A long-lived process on a host where kl processes get killed outright (the OOM killer, a
    # container's SIGKILL): what those left in the temporary directory goes at each start.
    swept = sweep_orphaned_socket_dirs()
    if swept:
        print(f"removed {swept} plugin socket director{'y' if swept == 1 else 'ies'} left by kl processes that are gone",
              flush=True)
    url = db.resolve_target().url
    # A worker commits, so it sends what its runs notify while it runs, not only when it exits.
    sender = Background(lambda: db.connect(url))
    with context.open_store() as conn:
        worker = Worker(conn, config, overrides, say=lambda text: print(text, flush=True))

        def on_signal(signum: int, _frame: Any) -> None:
            worker.request_stop("SIGTERM" if signum == signal.SIGTERM else "SIGINT")

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        sender.start()
        try:
            code = worker.run()
        finally:
            sender.stop()
            if not args.once:  # a long-lived worker's thread did the sending; --once sends at exit, as kl refresh
                notify.hand_over()
            for s, h in previous.items():
                signal.signal(s, h)
        if worker.abandoned:
            # Threads stuck on a database that stopped answering hold their connections (closing
            # the store's would wait for one) and the interpreter's exit would wait for some of
            # them (thread pools are joined at exit). SIGTERM was asked for: providers are killed,
            # output flushed, and the process ends here.
            from kilolock.provider.process import kill_all

            kill_all()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return code
