try:
    from kilolock.cli import exit_process, main
except KeyboardInterrupt:  # Ctrl-C while Python is still importing: no traceback for that
    raise SystemExit(130) from None

exit_process(main())
