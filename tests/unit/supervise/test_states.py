"""The state machines' tables: the docstring's diagrams are the tables, every state is
reachable, only final states are dead ends, a change the table lacks is refused, and nothing
but ``Machine.move`` assigns a state."""

from __future__ import annotations

import ast
import enum
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import pytest

from prefetchd.messages.status_record import DaemonState
from prefetchd.supervise import states
from prefetchd.supervise.states import (
    CHILD,
    DAEMON,
    ChildState,
    IllegalTransition,
    Machine,
    Transition,
)

PACKAGE = Path(states.__file__).resolve().parents[1]


S = TypeVar("S", bound=enum.StrEnum)


@dataclass
class Holder(Generic[S]):
    state: S


def docstring_diagrams() -> list[str]:
    """The literal blocks (after ``::``) of the states module's docstring."""
    doc = states.__doc__ or ""
    blocks = []
    for part in doc.split("::\n\n")[1:]:
        lines = itertools.takewhile(lambda line: line.startswith("    "), part.splitlines())
        blocks.append("\n".join(lines))
    return blocks


def test_the_module_docstring_draws_exactly_the_tables() -> None:
    assert docstring_diagrams() == [DAEMON.diagram(), CHILD.diagram()]


def reachable(machine: Machine[ChildState] | Machine[DaemonState], start: enum.StrEnum) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        source = todo.pop()
        for t in machine.transitions:
            if t.source == source and t.target not in seen:
                seen.add(t.target)
                todo.append(t.target)
    return {str(s) for s in seen}


@pytest.mark.parametrize(
    ("machine", "states_", "final"),
    [
        (CHILD, ChildState, {ChildState.EXITED, ChildState.FATAL}),
        (DAEMON, DaemonState, {DaemonState.DONE, DaemonState.FAILED, DaemonState.DRAINING}),
    ],
    ids=["child", "daemon"],
)
def test_every_state_is_reachable_and_only_final_states_have_no_way_out(
    machine: Machine[ChildState] | Machine[DaemonState],
    states_: type[enum.StrEnum],
    final: set[enum.StrEnum],
) -> None:
    assert reachable(machine, states_("starting")) == {str(s) for s in states_}
    dead_ends = {s for s in states_ if not any(t.source == s for t in machine.transitions)}
    assert dead_ends == final


def illegal_pairs() -> list[tuple[Machine[Any], enum.StrEnum, enum.StrEnum]]:
    pairs: list[tuple[Machine[Any], enum.StrEnum, enum.StrEnum]] = []
    machines: list[tuple[Machine[Any], type[enum.StrEnum]]] = [
        (CHILD, ChildState),
        (DAEMON, DaemonState),
    ]
    for machine, kind in machines:
        for source, target in itertools.product(kind, repeat=2):
            if not any(t.source == source and t.target == target for t in machine.transitions):
                pairs.append((machine, source, target))
    return pairs


@pytest.mark.parametrize(
    ("machine", "source", "target"),
    illegal_pairs(),
    ids=[f"{type(s).__name__}-{s}-{t}" for _, s, t in illegal_pairs()],
)
def test_a_transition_missing_from_the_table_is_refused_and_changes_nothing(
    machine: Machine[Any], source: enum.StrEnum, target: enum.StrEnum
) -> None:
    holder = Holder(source)
    with pytest.raises(IllegalTransition, match=f"{source} -> {target}"):
        machine.move(holder, target, "subject")
    assert holder.state == source


def test_a_transition_is_logged_at_its_level_with_its_label_and_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    holder = Holder(ChildState.RUNNING)
    caplog.set_level(logging.DEBUG, logger="prefetchd.supervise.states")
    CHILD.move(holder, ChildState.BACKOFF, "writer-0", "pid 7 killed by SIGKILL")
    CHILD.move(holder, ChildState.STARTING, "writer-0")
    crash, restart = caplog.records
    assert crash.levelno == logging.ERROR
    assert crash.getMessage() == (
        "writer-0: running -> backoff (exited unasked or killed for a lost heartbeat): "
        "pid 7 killed by SIGKILL"
    )
    assert restart.levelno == logging.INFO
    assert restart.getMessage() == "writer-0: backoff -> starting (delay elapsed: respawned)"
    assert holder.state is ChildState.STARTING


def test_a_table_that_lists_a_transition_twice_is_refused() -> None:
    step = Transition(ChildState.STARTING, ChildState.RUNNING, "ready", logging.INFO)
    with pytest.raises(ValueError, match="twice"):
        Machine([step, step])


def test_nothing_but_machine_move_assigns_a_state() -> None:
    """The table is the whole story only if no code sets ``.state`` behind its back; the one
    exception is the supervisor's initial ``starting``."""
    assigned = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = _targets(node)
            if any(isinstance(t, ast.Attribute) and t.attr == "state" for t in targets):
                value = ast.unparse(node.value) if isinstance(node, ast.Assign) else "?"
                assigned.append(f"{path.relative_to(PACKAGE)}: {value}")
    assert assigned == [
        "supervise/states.py: target",
        "supervise/supervisor.py: DaemonState.STARTING",
    ]


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return node.targets
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []
