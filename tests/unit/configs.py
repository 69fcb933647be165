"""A daemon config for unit tests: ``cache_dir``, ``ram_dir`` and ``state_dir`` private under
one root, the source at ``s3://bucket/prefix/``; each keyword is a section merged over that
(``output={"writers": 2}``). Loaded from a YAML file, as ``prefetchd run`` loads its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from prefetchd.config import Config, load_config

BUCKET = "bucket"


def unit_config(root: Path, **sections: dict[str, Any]) -> Config:
    raw: dict[str, dict[str, Any]] = {
        "source": {"url": f"s3://{BUCKET}/prefix/"},
        "download": {"cache_dir": str(root / "cache")},
        "output": {"ram_dir": str(root / "ram")},
        "status": {"state_dir": str(root / "state")},
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    path = root / "prefetchd.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_config(path)
