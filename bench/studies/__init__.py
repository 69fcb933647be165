"""Benchmarks of their own: the tuning sweep, the keep sweep, a very large manifest's start-up,
and how well prefetchd mixes records."""
