from prefetchd.cli import main

if __name__ == "__main__":  # spawned children import this module too; they must not run it
    raise SystemExit(main())
