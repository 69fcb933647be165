"""Build the optional C record kernel (``prefetchd.kernel._native``).

Everything else is in pyproject.toml. ``optional=True``: without a compiler the install still
succeeds and the writers and the downloader's check use its pure-Python twin
(``prefetchd/kernel/twin.py``), which gives the same bytes, only slower. For a checkout:
``python setup.py build_ext --inplace``. The tests build it once more with AddressSanitizer
and UndefinedBehaviorSanitizer (``tests/unit/kernel/test_sanitized_fuzz.py``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "prefetchd.kernel._native",
            sources=["prefetchd/kernel/_native.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            optional=True,
        )
    ]
)
