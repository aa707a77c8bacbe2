try:
    from kilolock.cli import main
except KeyboardInterrupt:  # Ctrl-C while Python is still importing: no traceback for that
    raise SystemExit(130) from None

raise SystemExit(main())
