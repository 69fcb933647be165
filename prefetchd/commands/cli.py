"""The ``prefetchd`` command: run, status, check, init. User mistakes are one line and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING, NoReturn

from prefetchd import __version__
from prefetchd.config import Config, load_config
from prefetchd.errors import (
    EXIT_FAILURE,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    PrefetchdError,
)
from prefetchd.layout import Layout

if TYPE_CHECKING:
    from prefetchd.messages.status_record import StatusRecord

# What only `run` or `check` needs (the supervisor, boto3, logging set-up) is imported inside
# those commands: `prefetchd status` must answer in a fraction of a second. What only `status`
# needs is imported inside it too: every child the daemon spawns imports this module again
# (multiprocessing re-runs the main script, the `prefetchd` entry point, as __mp_main__), and
# three processes paying for the status table is start-up CPU for nothing.


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"prefetchd: {message} (see prefetchd --help)\n")


EXIT_CODES = """exit codes:
  0  every epoch consumed and every record delivered (or drained after SIGTERM/SIGINT)
  4  every epoch consumed, but some objects' records were not delivered (quarantined or
     skipped; status says how many, the log names each); output.on_bad_object: fail
     turns the first such object into exit 1
  1  runtime failure (one line says why)
  2  invalid config or usage
  3  (status) no daemon running for that config"""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="prefetchd",
        description=(
            "Prefetch training data from S3 into TFRecord shards on a RAM disk, beside the trainer."
        ),
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"prefetchd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser(
        "run",
        help="run the daemon in the foreground",
        description="Run the daemon in the foreground until the last epoch is consumed.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("--config", required=True, help="path to the YAML config")
    status = sub.add_parser("status", help="show the state of a running daemon")
    status.add_argument("--config", required=True, help="path to the YAML config")
    status.add_argument("--json", action="store_true", help="print the status record as JSON")
    status.add_argument("--watch", action="store_true", help="redraw every second until Ctrl-C")
    check = sub.add_parser("check", help="validate config, credentials, bucket and directories")
    check.add_argument("--config", required=True, help="path to the YAML config")
    init = sub.add_parser("init", help="write a commented config sized for this host")
    init.add_argument("--url", required=True, help="the data: s3://bucket/prefix/")
    init.add_argument("--endpoint-url", help="an S3-compatible store's http(s):// URL")
    init.add_argument("--output", help="the file to write (never overwritten); default: stdout")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "init":
            return _init(args.url, args.endpoint_url, args.output)
        config = load_config(args.config)
        if args.command == "run":
            return _run(config)
        if args.command == "status":
            return _status(config, as_json=args.json, watch=args.watch)
        return _check(config)
    except PrefetchdError as exc:
        from prefetchd.logs import redact

        print(f"prefetchd: {redact(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _run(config: Config) -> int:
    from prefetchd.logs import setup_logging
    from prefetchd.supervise.supervisor import Supervisor

    setup_logging(config.log.level, "supervisor")
    supervisor = Supervisor(config)
    code = supervisor.run()
    if supervisor.reason:
        print(f"prefetchd: {supervisor.reason}", file=sys.stderr)
    return code


def _status(config: Config, *, as_json: bool, watch: bool) -> int:
    from prefetchd.supervise.status import is_running, read_status

    layout = Layout.of(config)
    tty = sys.stdout.isatty()
    if watch and tty and not as_json:
        sys.stdout.write(HIDE_CURSOR)
    try:
        while True:
            status = read_status(layout)
            running = is_running(status)
            if status is not None and (running or not watch):
                # A stopped daemon's last record still tells what happened (exit code says 3).
                text = _render(status, as_json=as_json, compact=watch)
            if not running:
                if status is not None and not watch:
                    print(text)
                last = f" (last state: {status.state})" if status else ""
                print(f"prefetchd: not running for {config.path}{last}", file=sys.stderr)
                return EXIT_NOT_RUNNING
            if not watch:
                print(text)
                return EXIT_OK
            sys.stdout.write(watch_frame(text, tty=tty and not as_json))
            sys.stdout.flush()
            time.sleep(1.0)
    except KeyboardInterrupt:
        return EXIT_OK  # Ctrl-C is how one leaves --watch
    finally:
        if watch and tty and not as_json:
            sys.stdout.write(SHOW_CURSOR)
            sys.stdout.flush()


HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"


def _render(status: StatusRecord, *, as_json: bool, compact: bool) -> str:
    from prefetchd.supervise.status_table import render_table

    if not as_json:
        return render_table(status)
    record = json.loads(status.encode())  # keys this version does not know: as written
    if compact:  # --watch --json: one record per line (JSON Lines), for programs that follow
        return json.dumps(record, sort_keys=True)
    return json.dumps(record, indent=2, sort_keys=True)


def watch_frame(text: str, *, tty: bool) -> str:
    """One --watch frame. On a terminal it overwrites the previous frame in place: cursor to
    the top left, each line cleared to its end, the rest of the screen cleared (no blank
    flash between frames). Elsewhere (a pipe, a log) frames simply follow each other."""
    if not tty:
        return text + "\n"
    return "\x1b[H" + "".join(f"{line}\x1b[K\n" for line in text.splitlines()) + "\x1b[J"


def _check(config: Config) -> int:
    from prefetchd.commands.check import run_checks
    from prefetchd.logs import redact

    findings = run_checks(config)
    for finding in findings:
        print(f"{finding.level.upper():<4} {redact(finding.message)}")
    return EXIT_FAILURE if any(f.level == "fail" for f in findings) else EXIT_OK


def _init(url: str, endpoint_url: str | None, output: str | None) -> int:
    """Print or write (exclusively: an existing file is an error) a config for this host; it
    is validated first, so a bad ``--url`` is the usual one line and exit 2."""
    import yaml

    from prefetchd.commands.init_config import plan, probe_host, render
    from prefetchd.config import config_from_dict

    text = render(plan(probe_host()), url=url, endpoint_url=endpoint_url)
    config_from_dict(yaml.safe_load(text))
    if output is None:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        with open(output, "x", encoding="utf-8") as f:
            f.write(text)
    except FileExistsError:
        raise ConfigError(
            f"--output {output}: the file exists (prefetchd init never overwrites)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"--output {output}: cannot write: {exc.strerror}") from None
    print(f"wrote {output}; next: prefetchd check --config {output}", file=sys.stderr)
    return EXIT_OK
