"""Refreshing a stored state out-of-band: ask every managed resource's provider what it looks like
now, and commit a new version when nothing failed.

Modules, in the order a run flows through them: ``service`` (the one way in, from a state's name
to its run, for ``kl refresh``, ``--all`` and the fleet worker alike) → ``options`` (how a run
refreshes: flag, else stored setting, else default) → ``slots`` (this process's share of the
fleet-wide provider limits) → ``orchestrator`` (what to refresh, in what order, whether to commit;
``lockwait`` waits out a held lock) → ``factory`` (discover, take a process from one of the
``sources``, configure, behind the protocols of ``client``; ``prelaunch`` starts the likely ones
early) → ``encoding`` (the one
crossing of JSON values into the codec) → ``inflight`` (requests in flight per provider) →
``splice`` (the refreshed state) → ``commit`` (the compare-and-swap commit). ``result`` is what a
run did, ``whyfailed`` why it failed, in one line. Importing the package loads none of them.
"""
