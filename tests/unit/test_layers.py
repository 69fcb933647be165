"""The layering contract, checked on every import in prefetchd/ (module level, in functions and
under ``TYPE_CHECKING`` alike):

    commands → supervise → roles → stages (download, write, consume) → core

A module may import its own layer and the layers below it, never one above; a stage never
imports another stage. The public trainer-side modules (``prefetchd``, ``prefetchd.tf``,
``prefetchd.keras``, ``prefetchd.torch``) sit on the consume stage and nothing of the daemon
imports them. Everything else in the package is the core, which imports only the core.

A new package must be placed in ``LAYERS`` (the test fails on an unplaced one), so the
contract is a decision, not an accident.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "prefetchd"

# Higher rank = higher layer. Stages share a rank but must not import each other.
COMMANDS, SUPERVISE, ROLES, API, STAGE, CORE = 5, 4, 3, 2, 1, 0
LAYERS: dict[str, int] = {
    "prefetchd.commands": COMMANDS,
    "prefetchd.__main__": COMMANDS,
    "prefetchd.supervise": SUPERVISE,
    "prefetchd.roles": ROLES,
    "prefetchd": API,  # the package itself: ready_files, records, TrainingPosition
    "prefetchd.tf": API,
    "prefetchd.keras": API,
    "prefetchd.torch": API,
    "prefetchd.download": STAGE,
    "prefetchd.write": STAGE,
    "prefetchd.consume": STAGE,
}
CORE_PACKAGES = {
    "prefetchd.kernel",
    "prefetchd.messages",
    "prefetchd.child",
    "prefetchd.exactly_once",
    "prefetchd.layout",
}


def module_name(path: Path) -> str:
    parts = ["prefetchd", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def group(module: str) -> str:
    """The layer entry a module belongs to: the longest LAYERS key it falls in, or itself."""
    if module in LAYERS:
        return module
    parts = module.split(".")
    for n in range(len(parts) - 1, 1, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    return ".".join(parts[:2])  # a core module or core package


def rank(module: str) -> int:
    return LAYERS.get(group(module), CORE)


def imports(module: str, path: Path) -> set[str]:
    """Every prefetchd module `module` imports, resolved to the deepest module of ours."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            if prefix == "prefetchd" and {a.name for a in node.names} == {"__version__"}:
                continue  # the release number, a constant every layer may print
            # `from prefetchd import errors` names a module; `from x import name` names x
            names = [f"{prefix}.{a.name}" for a in node.names if f"{prefix}.{a.name}" in MODULES]
            names = names or [prefix]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name.startswith("prefetchd") and name != module:
                found.add(name)
    return found


def violations() -> list[str]:
    found = []
    for module, path in sorted(MODULES.items()):
        for target in sorted(imports(module, path)):
            if group(module) == group(target):
                continue
            if rank(target) == API and rank(module) != API:
                found.append(f"{module} imports {target}, the trainer's API")
                continue
            if rank(target) > rank(module):
                found.append(f"{module} imports {target}, a higher layer")
            elif rank(target) == rank(module) == STAGE:
                found.append(f"{module} imports {target}, another stage")
    return found


def test_every_import_follows_the_layers() -> None:
    assert violations() == []


def test_every_package_is_placed_in_a_layer() -> None:
    packages = {module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    unplaced = {
        p
        for p in packages - {"prefetchd"}
        if group(p) not in LAYERS and p not in CORE_PACKAGES and p.count(".") == 1
    }
    assert unplaced == set(), "place each package in LAYERS or CORE_PACKAGES"


def test_the_contract_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker itself: a core module importing the supervisor is reported."""
    fake = tmp_path / "fake.py"
    fake.write_text("from prefetchd.supervise import supervisor\n")
    assert rank("prefetchd.budget") == CORE
    targets = imports("prefetchd.budget", fake)
    assert any(rank(t) > CORE for t in targets)
