"""Fixtures of the fault tests.

- ``plugin_path`` (session, automatic): this directory on ``sys.path``, so a test that reads an
  object in-process with a test plugin (``hostile_plugin``, ``crashing_plugin``) imports it
  as the daemon does (the daemon gets the directory through ``PYTHONPATH``).
- ``proxy``: a ``FaultProxy`` in front of the session's moto server, seeded with the test
  module's ``PROXY_SEED`` (0 if it has none); point ``source.endpoint_url`` at ``proxy.url``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.faultkit import HERE
from tests.faults.faultproxy import FaultProxy


@pytest.fixture(scope="session", autouse=True)
def plugin_path() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(HERE))
        yield


@pytest.fixture
def proxy(s3_endpoint: str, request: pytest.FixtureRequest) -> Iterator[FaultProxy]:
    with FaultProxy(s3_endpoint, seed=getattr(request.module, "PROXY_SEED", 0)) as p:
        yield p
