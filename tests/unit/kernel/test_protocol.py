"""Both record kernels offer every operation of ``RecordKernel``, and the stub mypy checks the C
module against (``_native.pyi``) lists exactly the functions the C module has: mypy proves the
contract from the stub (``choice.py``), this proves the stub."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from prefetchd.kernel import twin
from prefetchd.kernel.protocol import RecordKernel

native = pytest.importorskip("prefetchd.kernel._native")
STUB = Path(twin.__file__).with_name("_native.pyi")
OPERATIONS = {
    name
    for name, member in vars(RecordKernel).items()
    if inspect.isfunction(member) and not name.startswith("_")
}


def test_the_contract_has_the_operations_the_stages_call() -> None:
    assert len(OPERATIONS) == 14, sorted(OPERATIONS)
    assert {"check_tar", "frame_tar", "check_file", "interleave", "source_picks"} <= OPERATIONS


@pytest.mark.parametrize("kernel", [twin, native], ids=["twin", "C"])
def test_each_kernel_has_every_operation(kernel: object) -> None:
    assert all(callable(getattr(kernel, name, None)) for name in OPERATIONS)


def test_the_stub_lists_the_c_modules_functions() -> None:
    tree = ast.parse(STUB.read_text())
    stubbed = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    built = {name for name in dir(native) if not name.startswith("_")}
    assert stubbed == built
    assert stubbed == OPERATIONS | {"set_crc32c", "masked_crc"}
