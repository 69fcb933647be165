"""``"package.module:function"``: user code ``function(key, path) -> Iterable[bytes]``.

User code is trusted to be correct, not to be well-behaved on every input. So, for one object:

- anything it raises (any exception type), or a value that is not bytes, is ``PluginError``;
- a record over ``output.max_record_size`` is ``RecordTooLarge`` (it is already in memory:
  the plugin made it, but it is never written);
- the time spent inside its code (creating the iterator and each ``next``) is summed, and
  once it passes ``source.parse_timeout`` the call is interrupted: ``ParseTimeout``.

Each quarantines that object only. The interruption is a ``SIGALRM`` timer armed while the
plugin's code runs on the main thread: its handler raises ``TimeUp`` in the interrupted frame
(a ``BaseException``, as ``KeyboardInterrupt`` is, so a plugin's ``except Exception`` does not
swallow it; and raised again every second should the plugin catch it anyway), which ends a
sleep, a blocking read or a Python loop. While the
plugin runs, ``busy`` is set so the writer keeps its heartbeat going from another thread
(``PluginHeartbeat``): a slow object within the limit is not mistaken for a hung writer. A
plugin blocked in C code that holds the GIL cannot be interrupted this way; the supervisor's
heartbeat check then kills the writer (see docs/reliability.md). Built-in formats never pay for
any of this.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import FrameType

from prefetchd.config import DEFAULT_MAX_RECORD_SIZE, DEFAULT_PARSE_TIMEOUT
from prefetchd.errors import CorruptObject
from prefetchd.write.quarantine import ParseTimeout, PluginError, RecordTooLarge

_END = object()
_REFIRE = 1.0  # seconds between alarms once the time is up (a plugin may catch the first)


class TimeUp(BaseException):
    """Raised by the alarm inside a plugin's code: its object's time is up."""


class PluginFormat:
    """A user plugin as a format (see the module docstring for what it guards against)."""

    def __init__(
        self,
        spec: str,
        function: Callable[[str, str], Iterable[bytes]],
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
        parse_timeout: float = DEFAULT_PARSE_TIMEOUT,
    ) -> None:
        self.spec = spec
        self.function = function
        self.max_record_size = max_record_size
        self.parse_timeout = parse_timeout
        self.lock = threading.Lock()  # held to clear ``busy`` and by the heartbeat's report
        self.busy = False  # the plugin's code runs on the main thread now

    def records(self, key: str, path: str) -> Iterator[bytes]:
        """The plugin's records for one object; raises ``PluginError``, ``RecordTooLarge`` or
        ``ParseTimeout`` (each a ``CorruptObject``)."""
        clock = _Clock(self.parse_timeout)
        try:
            with self._running(clock):
                iterator = iter(self.function(key, path))
            while True:
                with self._running(clock):
                    record = next(iterator, _END)
                if record is _END:
                    return
                yield self._checked(key, record)
        except CorruptObject:
            raise
        except TimeUp:
            raise ParseTimeout(key, self.spec, self.parse_timeout) from None
        except Exception as exc:  # user code: any failure quarantines this object only
            raise PluginError(key, f"{self.spec} raised {type(exc).__name__}: {exc}") from exc

    def _checked(self, key: str, record: object) -> bytes:
        if not isinstance(record, bytes | bytearray | memoryview):
            raise PluginError(key, f"{self.spec} yielded {type(record).__name__}, expected bytes")
        if len(record) > self.max_record_size:
            raise RecordTooLarge(key, "a record", len(record), self.max_record_size)
        return bytes(record)

    @contextlib.contextmanager
    def _running(self, clock: _Clock) -> Iterator[None]:
        self.busy = True
        try:
            with clock.running():
                yield
        finally:
            with self.lock:
                self.busy = False


class _Clock:
    """The time one object's plugin calls may still take, enforced by ``SIGALRM``."""

    def __init__(self, limit: float) -> None:
        self.left = limit

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Run the block with an alarm for the time left; on the main thread only (signals
        are delivered there), elsewhere unguarded."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        if self.left <= 0:
            raise TimeUp
        previous = signal.signal(signal.SIGALRM, _expired)
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, self.left, _REFIRE)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            self.left -= time.monotonic() - started


def _expired(signum: int, frame: FrameType | None) -> None:
    # Raising here is the point: it unwinds the plugin's frame, wherever it waits.
    raise TimeUp


class PluginHeartbeat:
    """A thread that keeps a writer's report fresh while a plugin runs on its main thread:
    ``report`` is called under the plugin's lock every ``interval`` seconds while ``busy``."""

    def __init__(self, plugin: PluginFormat, report: Callable[[], None], interval: float) -> None:
        self.plugin, self.report, self.interval = plugin, report, interval
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="plugin-heartbeat", daemon=True)

    def __enter__(self) -> PluginHeartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=self.interval * 4)

    def _run(self) -> None:
        while not self.stopped.wait(self.interval):
            with self.plugin.lock:
                if self.plugin.busy:
                    self.report()
