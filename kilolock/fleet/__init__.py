"""The fleet runtime: many states refreshed by one process (``kl refresh --all``, many.py) and the
``kl worker`` that works off the fleet's queue (worker.py) with providers kept warm between runs
(warm.py). Each state is refreshed by kilolock.refresh.service, as ``kl refresh STATE`` does."""
