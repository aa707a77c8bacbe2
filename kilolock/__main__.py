"""`python -m kilolock`, and the `kl` command pip installs (pyproject's entry point)."""
import sys


def main() -> None:
    from kilolock import lazyimports

    lazyimports.own_process()  # before anything imports what kl never uses
    try:
        from kilolock.cli import run_process
    except KeyboardInterrupt:  # Ctrl-C while Python is still importing: no traceback, kl's one line
        print("kl: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    run_process()


if __name__ == "__main__":
    main()
