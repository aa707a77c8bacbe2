import sys

try:
    from kilolock.cli import run_process
except KeyboardInterrupt:  # Ctrl-C while Python is still importing: no traceback, kl's one line
    print("kl: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

run_process()
