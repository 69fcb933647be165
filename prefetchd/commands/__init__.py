"""The commands (`prefetchd run|status|check|init`), apart from the library."""
