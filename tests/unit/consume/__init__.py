"""Unit tests of prefetchd.consume. ready_files() is exercised without a daemon in
tests/functional (test_consumer.py, test_position.py), which play the daemon's part on disk."""
