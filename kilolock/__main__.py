import sys

try:
    from kilolock import gcpolicy
    from kilolock.cli import exit_process, main
except KeyboardInterrupt:  # Ctrl-C while Python is still importing: no traceback, kl's one line
    print("kl: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

gcpolicy.own_process()
exit_process(main())
