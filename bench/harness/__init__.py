"""The benchmark harness (``python -m bench``): datasets, contenders, runs, samples, results
and bars; see ``bench/__init__.py``."""
