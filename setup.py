"""Build the optional C core of the writer (``prefetchd.write._native``).

Everything else is in pyproject.toml. ``optional=True``: without a compiler the install still
succeeds and the writer uses its pure-Python twin (``prefetchd/write/pycore.py``), which gives
the same bytes, only slower. For a checkout: ``python setup.py build_ext --inplace``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "prefetchd.write._native",
            sources=["prefetchd/write/_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
