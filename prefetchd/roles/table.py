"""The table of child roles the supervisor runs: what each one is called, how many there are
and where its main loop lives. The child shell (``shell.child_main``) knows no role; it is
handed the role's entry point. Each entry imports its stage only inside the child, so a writer
never loads boto3 and the supervisor loads neither stage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prefetchd.child.context import ChildContext
from prefetchd.config import Config


def run_downloader(ctx: ChildContext, index: int) -> None:
    from prefetchd.download.downloader import Downloader

    Downloader(ctx).run()


def run_writer(ctx: ChildContext, index: int) -> None:
    from prefetchd.write.writer import Writer

    Writer(ctx, index).run()


@dataclass(frozen=True)
class Role:
    """One kind of child: its name, its entry point and how many the config asks for."""

    name: str
    entry: Callable[[ChildContext, int], None]  # module-level, so spawn can pickle it
    count: Callable[[Config], int]
    numbered: bool  # children named "<role>-<index>" (else just "<role>": there is one)

    def child_name(self, index: int) -> str:
        return f"{self.name}-{index}" if self.numbered else self.name


ROLES: tuple[Role, ...] = (
    Role("downloader", run_downloader, lambda _config: 1, numbered=False),
    Role("writer", run_writer, lambda config: config.output.writers, numbered=True),
)
