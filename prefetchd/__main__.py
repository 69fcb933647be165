"""``python -m prefetchd``. Spawned children run this module again (as ``__mp_main__``): they
must not run the command, and need nothing the command line imports, so it is imported here."""

if __name__ == "__main__":
    from prefetchd.commands.cli import main

    raise SystemExit(main())
