"""When the garbage collector runs in a one-shot `kl refresh` process.

CPython's cyclic collector walks the objects it tracks: the young ones every few hundred
allocations, all of them now and then. A refresh makes most of its objects to keep them until it
exits: the modules it imports (psycopg, grpc and protobuf are tens of thousands of objects) and the
state it loads (about ten objects an instance), and every walk finds them all alive again; a
10,000-instance refresh spent ~9% of its CPU in such walks, a 10-instance one ~15 ms of imports.
So `kl refresh` collects nothing until its state is loaded, then freezes what it holds (never
walked again, still freed by reference counting when dropped) and collects as usual from there:
the reads' objects come and go. What it could leak is cyclic garbage made before the freeze, which
a process that exits after its refresh does not keep for long. A long-running process (`kl serve`,
a fleet worker) never calls these, and neither does a process kl did not start itself
(kilolock.cli.run_process: the `kl` command, `python -m kilolock`, kl.pyz), such as a test calling
kilolock.cli.main.
"""
from __future__ import annotations

import gc

_own_process = False  # kilolock.cli.run_process started this process
_holding = False


def own_process() -> None:
    """Said by kilolock.cli.run_process: the process is kl's command and ends with it."""
    global _own_process
    _own_process = True


def hold() -> None:
    """Collect nothing until ``settled``: the process is about to import and load what it keeps."""
    global _holding
    if _own_process and gc.isenabled():
        gc.disable()
        _holding = True


def settled() -> None:
    """What the process holds now it keeps to the end: freeze it, and collect as usual again."""
    global _holding
    if _holding:
        _holding = False
        gc.freeze()
        gc.enable()
