"""The supervisor's children, driven without processes: fake processes and a fake clock stand
in for the system (supervisord's ``DummyOptions``), so crash -> backoff -> restart -> fatal runs
in milliseconds. One test per transition of ``states.CHILD`` and ``states.DAEMON``, and exits
described by name ("killed by SIGKILL", never "code -9")."""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefetchd.child.context import ChildContext
from prefetchd.config import config_from_dict
from prefetchd.messages.child_report import ChildReport
from prefetchd.messages.status_record import DaemonState
from prefetchd.roles.shell import CHILD_BOOT_FAILURE
from prefetchd.roles.table import Role
from prefetchd.supervise.children import (
    BACKOFF_MAX,
    BACKOFF_START,
    HEARTBEAT_TIMEOUT,
    MAX_QUICK_CRASHES,
    QUICK_CRASH,
    Child,
    Clock,
    Exit,
    Lifecycle,
    backoff_delay,
    describe_exit,
)
from prefetchd.supervise.states import ChildState
from prefetchd.supervise.supervisor import STOP_GRACE, Supervisor

SIGKILLED = -signal.SIGKILL  # multiprocessing's exit code for a process killed by SIGKILL


def entry(ctx: ChildContext, index: int) -> None:
    raise AssertionError("fake children never run")


ROLE = Role("worker", entry, lambda _config: 1, numbered=False)


class FakeProcess:
    """A child process that ends when the test says so (``exit``), or on a signal."""

    def __init__(self, pid: int, *, obeys_sigterm: bool) -> None:
        self.pid = pid
        self.exitcode: int | None = None
        self.received: list[str] = []
        self.obeys_sigterm = obeys_sigterm

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        pass

    def terminate(self) -> None:
        self.received.append("SIGTERM")
        if self.obeys_sigterm:
            self.exitcode = 0  # drained and exited

    def kill(self) -> None:
        self.received.append("SIGKILL")
        self.exitcode = SIGKILLED

    def exit(self, code: int) -> None:
        self.exitcode = code


class Dummy:
    """The system as the lifecycle sees it: processes it spawns, and its monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.spawned: list[FakeProcess] = []
        self.obeys_sigterm = True
        self.clock = Clock(monotonic=lambda: self.now)

    def spawn(self, child: Child) -> FakeProcess:
        process = FakeProcess(100 + len(self.spawned), obeys_sigterm=self.obeys_sigterm)
        self.spawned.append(process)
        return process

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def dummy() -> Dummy:
    return Dummy()


@pytest.fixture
def life(dummy: Dummy) -> Lifecycle:
    lifecycle = Lifecycle([Child(ROLE, 0)], dummy.spawn, dummy.clock)
    lifecycle.start_all()
    return lifecycle


def process(child: Child) -> FakeProcess:
    assert isinstance(child.process, FakeProcess)
    return child.process


def report(child: Child, **fields: object) -> None:
    """What ``Supervisor._collect_reports`` would have read from the child's report file."""
    child.last_report = ChildReport.decode_object({"pid": child.pid, **fields})


def make_running(life: Lifecycle, dummy: Dummy) -> Child:
    (child,) = life.children
    report(child, ready=True, beat=dummy.now)
    life.mark_ready()
    assert child.state is ChildState.RUNNING
    return child


def crash(life: Lifecycle, child: Child, code: int = 1, **last_words: object) -> Exit:
    if last_words:
        report(child, **last_words)
    process(child).exit(code)
    (gone,) = life.reap()
    assert gone.child is child
    return gone


# --- starting ---------------------------------------------------------------------------------


def test_a_new_child_is_spawned_starting(life: Lifecycle, dummy: Dummy) -> None:
    (child,) = life.children
    assert child.state is ChildState.STARTING
    assert child.pid == 100 and len(dummy.spawned) == 1


def test_starting_to_running_when_the_child_reports_ready(life: Lifecycle, dummy: Dummy) -> None:
    (child,) = life.children
    report(child, ready=False)
    life.mark_ready()
    assert child.state is ChildState.STARTING
    assert not life.all_running()
    make_running(life, dummy)
    assert life.all_running()


def test_starting_to_fatal_on_a_boot_failure_with_the_childs_reason(
    life: Lifecycle, dummy: Dummy
) -> None:
    (child,) = life.children
    gone = crash(life, child, CHILD_BOOT_FAILURE, boot_error="access denied to s3://bucket/")
    assert child.state is ChildState.FATAL
    assert gone.failure == "worker could not start: access denied to s3://bucket/"
    dummy.advance(BACKOFF_MAX * 10)
    life.restart_due()
    assert len(dummy.spawned) == 1, "a child that cannot boot must not be restarted"


def test_a_boot_failure_without_last_words_names_the_exit(life: Lifecycle) -> None:
    (child,) = life.children
    gone = crash(life, child, CHILD_BOOT_FAILURE)
    assert gone.failure == "worker could not start: exited with code 3"


def test_starting_to_backoff_when_killed_before_ready(life: Lifecycle) -> None:
    """Only the boot-failure code is fatal before ready: a SIGKILL while listing is a crash."""
    (child,) = life.children
    gone = crash(life, child, SIGKILLED)
    assert child.state is ChildState.BACKOFF
    assert gone.failure is None and gone.description == "killed by SIGKILL"


# --- running, backoff, restart, fatal ---------------------------------------------------------


def test_running_to_backoff_on_a_crash_logged_by_signal_name(
    life: Lifecycle, dummy: Dummy, caplog: pytest.LogCaptureFixture
) -> None:
    child = make_running(life, dummy)
    caplog.set_level(logging.INFO)
    gone = crash(life, child, SIGKILLED)
    assert child.state is ChildState.BACKOFF
    assert gone.description == "killed by SIGKILL" and gone.failure is None
    assert child.next_start == dummy.now + BACKOFF_START
    assert "pid 100 killed by SIGKILL; restarting in 0.5s" in caplog.text
    assert "code -9" not in caplog.text


def test_a_crash_logs_the_childs_last_error(
    life: Lifecycle, dummy: Dummy, caplog: pytest.LogCaptureFixture
) -> None:
    child = make_running(life, dummy)
    crash(life, child, 1, fatal="ValueError: bad record")
    assert "pid 100 exited with code 1 (ValueError: bad record); restarting in" in caplog.text


def test_backoff_to_starting_once_the_delay_has_elapsed(life: Lifecycle, dummy: Dummy) -> None:
    child = make_running(life, dummy)
    crash(life, child)
    dummy.advance(BACKOFF_START / 2)
    life.restart_due()
    assert (child.state, len(dummy.spawned)) == (ChildState.BACKOFF, 1)
    dummy.advance(BACKOFF_START / 2)
    life.restart_due()
    assert child.state is ChildState.STARTING
    assert child.restarts == 1 and child.pid == 101
    assert child.last_report is None, "the dead process's report must not make it look ready"
    make_running(life, dummy)


def crash_loop(life: Lifecycle, dummy: Dummy, uptime: float, crashes: int) -> list[float]:
    """Crash the running child ``crashes`` times, each ``uptime`` after its start; the delays
    it waited before each restart."""
    (child,) = life.children
    delays = []
    for _ in range(crashes):
        dummy.advance(uptime)
        crash(life, child)
        if child.state is ChildState.FATAL:
            break
        delays.append(child.next_start - dummy.now)
        dummy.advance(delays[-1])
        life.restart_due()
        make_running(life, dummy)
    return delays


def test_backoff_to_fatal_after_max_quick_crashes_in_a_row(life: Lifecycle, dummy: Dummy) -> None:
    make_running(life, dummy)
    delays = crash_loop(life, dummy, uptime=1.0, crashes=MAX_QUICK_CRASHES)
    (child,) = life.children
    assert child.state is ChildState.FATAL
    assert delays == [0.5, 1.0, 2.0, 4.0], "the delay doubles with each quick crash"
    assert child.restarts == MAX_QUICK_CRASHES - 1
    dummy.advance(BACKOFF_MAX * 10)
    life.restart_due()
    assert len(dummy.spawned) == MAX_QUICK_CRASHES, "a fatal child is never restarted"


def test_the_fatal_crash_gives_the_daemon_its_reason(
    life: Lifecycle, dummy: Dummy, caplog: pytest.LogCaptureFixture
) -> None:
    child = make_running(life, dummy)
    crash_loop(life, dummy, uptime=1.0, crashes=MAX_QUICK_CRASHES - 1)
    gone = crash(life, child, SIGKILLED)
    assert gone.failure == f"worker crashed {MAX_QUICK_CRASHES} times in a row (killed by SIGKILL)"
    assert "killed by SIGKILL; giving up" in caplog.text
    assert "backoff -> fatal" in caplog.text


def test_crashes_far_apart_are_restarted_forever_without_growing_delays(
    life: Lifecycle, dummy: Dummy
) -> None:
    make_running(life, dummy)
    delays = crash_loop(life, dummy, uptime=QUICK_CRASH + 1, crashes=4 * MAX_QUICK_CRASHES)
    (child,) = life.children
    assert child.state is ChildState.RUNNING
    assert delays == [BACKOFF_START] * 4 * MAX_QUICK_CRASHES


def test_a_slow_crash_starts_the_count_again(life: Lifecycle, dummy: Dummy) -> None:
    make_running(life, dummy)
    crash_loop(life, dummy, uptime=1.0, crashes=MAX_QUICK_CRASHES - 1)
    crash_loop(life, dummy, uptime=QUICK_CRASH + 1, crashes=1)
    crash_loop(life, dummy, uptime=1.0, crashes=MAX_QUICK_CRASHES - 2)
    (child,) = life.children
    assert child.state is ChildState.RUNNING


def test_the_delay_doubles_up_to_its_cap() -> None:
    assert [backoff_delay(n) for n in range(1, 9)] == [
        0.5,
        1,
        2,
        4,
        8,
        16,
        BACKOFF_MAX,
        BACKOFF_MAX,
    ]


def test_a_hung_child_is_killed_then_restarted_like_a_crash(
    life: Lifecycle, dummy: Dummy, caplog: pytest.LogCaptureFixture
) -> None:
    child = make_running(life, dummy)
    dummy.advance(HEARTBEAT_TIMEOUT)
    life.kill_hung()
    assert process(child).received == [], "silent for exactly the timeout is not yet hung"
    dummy.advance(1)
    life.kill_hung()
    assert process(child).received == ["SIGKILL"]
    assert "stopped reporting for 31s; killing it" in caplog.text
    (gone,) = life.reap()
    assert child.state is ChildState.BACKOFF and gone.description == "killed by SIGKILL"


def test_a_starting_child_is_not_killed_for_silence(life: Lifecycle, dummy: Dummy) -> None:
    """Listing millions of keys before ready can take minutes."""
    (child,) = life.children
    report(child, ready=False, beat=dummy.now)
    dummy.advance(HEARTBEAT_TIMEOUT * 10)
    life.kill_hung()
    assert process(child).received == []


# --- stopping ---------------------------------------------------------------------------------


def test_running_to_stopping_to_exited_on_sigterm(
    life: Lifecycle, dummy: Dummy, caplog: pytest.LogCaptureFixture
) -> None:
    child = make_running(life, dummy)
    caplog.set_level(logging.DEBUG)
    life.stop(grace=20)
    assert process(child).received == ["SIGTERM"]
    assert child.state is ChildState.EXITED
    assert "running -> stopping" in caplog.text
    assert "stopping -> exited (exited or killed after the grace period): exited with code 0" in (
        caplog.text
    )


def test_starting_to_stopping_when_the_daemon_stops_during_boot(life: Lifecycle) -> None:
    (child,) = life.children
    life.stop(grace=20)
    assert process(child).received == ["SIGTERM"]
    assert child.state is ChildState.EXITED


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(
    dummy: Dummy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    dummy.obeys_sigterm = False
    life = Lifecycle([Child(ROLE, 0)], dummy.spawn, dummy.clock)
    life.start_all()
    child = make_running(life, dummy)
    life.stop(grace=20)
    assert process(child).received == ["SIGTERM", "SIGKILL"]
    assert child.state is ChildState.EXITED
    assert "worker did not stop in 20s; killing it" in caplog.text
    assert "grace period): killed by SIGKILL" in caplog.text


def test_backoff_to_stopping_cancels_the_restart(life: Lifecycle, dummy: Dummy) -> None:
    child = make_running(life, dummy)
    crash(life, child)
    life.stop(grace=20)
    assert child.state is ChildState.EXITED
    assert process(child).received == [], "a dead process is not signalled"
    dummy.advance(BACKOFF_MAX)
    life.restart_due()
    assert len(dummy.spawned) == 1


def test_stopping_leaves_a_fatal_child_fatal(life: Lifecycle) -> None:
    (child,) = life.children
    crash(life, child, CHILD_BOOT_FAILURE)
    life.stop(grace=20)
    assert child.state is ChildState.FATAL


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (0, "exited with code 0"),
        (1, "exited with code 1"),
        (-signal.SIGKILL, "killed by SIGKILL"),
        (-signal.SIGTERM, "killed by SIGTERM"),
        (-signal.SIGSEGV, "killed by SIGSEGV"),
        (-250, "killed by signal 250"),
        (None, "still running"),
    ],
)
def test_exits_are_described_by_name(code: int | None, words: str) -> None:
    assert describe_exit(code) == words


# --- the daemon's states, through the supervisor ----------------------------------------------


@pytest.fixture
def supervisor(
    tmp_path: Path, dummy: Dummy, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Supervisor]:
    """A supervisor whose children are fakes (downloader, writer-0, writer-1), spawned."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    config = config_from_dict(
        {
            "source": {"url": "s3://bucket/data/"},
            "epochs": {"count": 1},
            "download": {"cache_dir": str(tmp_path / "cache")},
            "output": {"ram_dir": str(tmp_path / "ram")},
            "status": {"state_dir": str(tmp_path / "state")},
        }
    )
    sup = Supervisor(config)
    sup.lifecycle = Lifecycle(sup.children, dummy.spawn, dummy.clock)
    sup.lifecycle.start_all()
    yield sup


def all_ready(sup: Supervisor, dummy: Dummy) -> None:
    for child in sup.children:
        report(child, ready=True, beat=dummy.now)
    sup._check_started()


def by_name(sup: Supervisor, name: str) -> Child:
    (child,) = (c for c in sup.children if c.name == name)
    return child


def test_daemon_starting_to_running_once_every_child_is_ready(
    supervisor: Supervisor, dummy: Dummy
) -> None:
    report(by_name(supervisor, "downloader"), ready=True)
    supervisor._check_started()
    assert (supervisor.state,) == (DaemonState.STARTING,)  # a tuple: no narrowing for mypy
    all_ready(supervisor, dummy)
    assert supervisor.state is DaemonState.RUNNING


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_daemon_starting_to_draining_on_a_stop_signal(
    supervisor: Supervisor, signum: signal.Signals
) -> None:
    supervisor.signals.append(signum)
    assert supervisor._handle_signals()
    assert supervisor.state is DaemonState.DRAINING


def test_daemon_running_to_draining_on_sigterm_and_a_second_signal_is_harmless(
    supervisor: Supervisor, dummy: Dummy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    all_ready(supervisor, dummy)
    supervisor.signals.extend([signal.SIGTERM, signal.SIGINT])
    assert supervisor._handle_signals()
    assert supervisor.state is DaemonState.DRAINING
    assert "received SIGINT: already draining" in caplog.text


def test_children_that_exit_with_a_stop_signal_pending_are_not_restarted(
    supervisor: Supervisor, dummy: Dummy
) -> None:
    """A SIGTERM to the whole process group reaches the children too: no restarts, no
    crash counted, and the drain leaves each one exited."""
    all_ready(supervisor, dummy)
    for child in supervisor.children:
        process(child).exit(-signal.SIGTERM)
    supervisor.signals.append(signal.SIGTERM)
    supervisor._reap_and_restart()
    assert all(c.state is ChildState.RUNNING for c in supervisor.children)
    supervisor._handle_signals()
    supervisor.lifecycle.stop(STOP_GRACE)
    assert {c.state for c in supervisor.children} == {ChildState.EXITED}
    assert len(dummy.spawned) == 3


def test_daemon_starting_to_failed_when_a_child_cannot_boot(supervisor: Supervisor) -> None:
    downloader = by_name(supervisor, "downloader")
    report(downloader, boot_error="no objects under s3://bucket/data/ match")
    process(downloader).exit(CHILD_BOOT_FAILURE)
    supervisor._reap_and_restart()
    assert supervisor.state is DaemonState.FAILED
    assert (
        supervisor.reason == "downloader could not start: no objects under s3://bucket/data/ match"
    )


def test_daemon_running_to_failed_when_a_child_keeps_crashing(
    supervisor: Supervisor, dummy: Dummy
) -> None:
    all_ready(supervisor, dummy)
    writer = by_name(supervisor, "writer-0")
    for _ in range(MAX_QUICK_CRASHES):
        process(writer).exit(SIGKILLED)
        supervisor._reap_and_restart()
        dummy.advance(BACKOFF_MAX)
        supervisor._reap_and_restart()
    assert supervisor.state is DaemonState.FAILED
    assert supervisor.reason == "writer-0 crashed 5 times in a row (killed by SIGKILL)"
    assert writer.restarts == MAX_QUICK_CRASHES - 1


def test_two_children_failing_in_one_tick_keep_the_first_reason(supervisor: Supervisor) -> None:
    for child in supervisor.children:
        process(child).exit(CHILD_BOOT_FAILURE)
    supervisor._reap_and_restart()
    assert supervisor.state is DaemonState.FAILED
    assert supervisor.reason == "downloader could not start: exited with code 3"
    assert {c.state for c in supervisor.children} == {ChildState.FATAL}


def finished_job(sup: Supervisor) -> None:
    """Every epoch complete and every shard consumed: what ``_check_done`` looks for."""
    sup.layout.create()
    sup.layout.job_file.write_text(json.dumps({"fingerprint": {}, "finished": False}))
    sup.epochs.next_epoch = 1


def test_daemon_running_to_done_once_the_last_epoch_is_consumed(
    supervisor: Supervisor, dummy: Dummy
) -> None:
    all_ready(supervisor, dummy)
    finished_job(supervisor)
    supervisor._check_done()
    assert supervisor.state is DaemonState.DONE
    assert json.loads(supervisor.layout.job_file.read_text())["finished"] is True


def test_daemon_starting_to_done_when_a_resumed_job_had_nothing_left(
    supervisor: Supervisor,
) -> None:
    finished_job(supervisor)
    supervisor._check_done()
    assert supervisor.state is DaemonState.DONE


def test_a_failure_in_the_last_tick_is_not_reported_done(supervisor: Supervisor) -> None:
    finished_job(supervisor)
    process(by_name(supervisor, "downloader")).exit(CHILD_BOOT_FAILURE)
    supervisor._reap_and_restart()
    supervisor._check_done()
    assert supervisor.state is DaemonState.FAILED


class _Owned:
    """The ownership of a started job, as ``_shut_down`` lets go of it."""

    def close(self) -> None:
        pass


def test_spares_a_killed_writer_left_are_deleted_once_every_child_has_stopped(
    supervisor: Supervisor, dummy: Dummy, tmp_path: Path
) -> None:
    """A writer SIGKILLed after giving spares is not restarted once the job is done, and the
    writer that stopped last cleared before them: the supervisor, the one process that outlives
    every child, leaves no spare in ``.tmp`` (the soak test found some left)."""
    all_ready(supervisor, dummy)
    supervisor.layout.create()
    tmp = supervisor.layout.cache_tmp
    spares = [tmp / "spare-w1-22", tmp / "spare-w0-5"]
    for spare in spares:
        spare.touch()
    other = tmp / "not-a-spare.part"
    other.write_bytes(b"x")
    process(by_name(supervisor, "writer-1")).kill()
    supervisor._fence = os.open(tmp_path / "fence", os.O_CREAT | os.O_RDWR, 0o600)
    supervisor.ownership = _Owned()  # type: ignore[assignment]
    supervisor._shut_down()
    assert not any(spare.exists() for spare in spares)
    assert other.exists(), "only spares: a .part is the downloader's start-up sweep's"


def test_a_supervisor_that_did_not_start_deletes_no_spares(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    """Refused at start-up (another daemon owns these directories): their spares are not its."""
    supervisor.layout.create()
    tmp = supervisor.layout.cache_tmp
    (tmp / "spare-w0-1").touch()
    supervisor.ownership = _Owned()  # type: ignore[assignment]
    supervisor._shut_down()
    assert (tmp / "spare-w0-1").exists()
