"""Build the optional C extensions: the record kernel (``prefetchd.kernel._native``) and the
native GET client's engine (``prefetchd.kernel._http``, ``download.client: native``).

Everything else is in pyproject.toml. ``optional=True``: without a compiler the install still
succeeds and the writers and the downloader's check use its pure-Python twin
(``prefetchd/kernel/twin.py``), which gives the same bytes, only slower; without ``_http``,
``download.client: native`` is a configuration error naming the build. For a checkout:
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
        ),
        Extension(
            "prefetchd.kernel._http",
            sources=["prefetchd/kernel/_http.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            libraries=["z", "pthread"],  # zlib's crc32: the library Python's zlib module uses
            optional=True,
        ),
    ]
)
