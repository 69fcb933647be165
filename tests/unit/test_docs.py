"""Every code block in README.md and docs/*.md that is a config, a command or Python is true to
the code: what a newcomer copies must work.

The conventions the docs follow (README.md, "Code blocks in these docs"):

- A fenced ``yaml`` block with a top-level ``source:`` is a prefetchd config and loads with
  ``config_from_dict`` as written (bucket names, prefixes and endpoints are examples that
  validate as they are). So does a config that a shell block writes with a here-document
  (``cat > train.yaml <<'EOF'``); in an unquoted one, ``$VAR`` stands for an example value:
  ``http://127.0.0.1:9000`` for a name with ``URL`` or ``ENDPOINT`` in it, else ``/tmp/VAR``.
  Other ``yaml`` blocks (manifests, fragments of a config) must parse.
- Every ``prefetchd ...`` command in a ``bash``, ``sh``, ``shell`` or ``console`` block (after
  a ``$ `` prompt, ``sudo [-u USER]``, ``VAR=value``, a path such as ``/opt/prefetchd/bin/``;
  ``\\`` continuations joined, redirections dropped) is accepted by the CLI's own argparse
  parser: a real subcommand with real flags. Nothing is run and no daemon is started.
- A ``python`` block compiles. One tagged ``python fragment`` is a piece of a larger program
  (an indented loop body, say) and is only checked to be there.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from prefetchd.commands.cli import _parser
from prefetchd.config import config_from_dict

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}
REDIRECT = re.compile(r"^(\d*[<>]|&$)")  # `>log 2>&1 &`: the shell's, not the command's
EXAMPLE_URL = "http://127.0.0.1:9000"
HEREDOC = re.compile(r"<<-?\s*'?(\w+)'?[^\n]*\n(.*?)^\s*\1$", re.S | re.M)
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    """One fenced code block: its page, first line number, info string and text."""

    page: Path
    line: int
    info: str
    text: str

    @property
    def lang(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks() -> list[Block]:
    """Every fenced block of every page, in order."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 2  # the block's first line of code
            found.append(Block(page, line, match.group(1).strip(), match.group(2)))
    return found


def of_lang(*langs: str) -> list[Block]:
    return [b for b in blocks() if b.lang in langs]


def ids(items: list[Block]) -> list[str]:
    return [b.where for b in items]


def heredocs(text: str) -> list[str]:
    """The bodies of the ``<<'EOF'`` / ``<<EOF`` here-documents in a shell block; in an
    unquoted one, as the shell would expand it with the example values of ``expand``."""
    bodies = []
    for m in HEREDOC.finditer(text):
        quoted = "'" in m.group(0).split("\n", 1)[0]
        bodies.append(m.group(2) if quoted else expand(m.group(2)))
    return bodies


def expand(text: str) -> str:
    """``$VAR`` and ``${VAR}`` replaced by example values: a variable named like a URL or an
    endpoint is ``http://127.0.0.1:9000``, any other one the directory ``/tmp/VAR``."""

    def value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return EXAMPLE_URL if re.search("URL|ENDPOINT", name) else f"/tmp/{name}"

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", value, text)


def logical_lines(text: str) -> list[str]:
    """Shell lines with here-document bodies dropped, ``\\`` continuations joined and
    ``# comments`` removed."""
    text = HEREDOC.sub(lambda m: m.group(0).split("\n", 1)[0] + "\n", text)
    joined = re.sub(r"\\\n", " ", text)
    lines = []
    for raw in joined.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if line.startswith("$ "):
            line = line[2:]
        if line:
            lines.append(line)
    return lines


def prefetchd_commands(text: str) -> list[list[str]]:
    """The argument lists of every ``prefetchd`` command in a shell block."""
    commands = []
    for line in logical_lines(text):
        for segment in re.split(r"&&|\|\||;|\|", line):
            if "prefetchd" not in segment:
                continue  # `git clone <URL of ...>`: not ours to parse
            words = [w for w in shlex.split(segment) if not REDIRECT.match(w)]
            words = _strip_prefixes(words)
            if words and words[0] == "prefetchd":
                commands.append(words[1:])
    return commands


def _strip_prefixes(words: list[str]) -> list[str]:
    """Drop what runs a command without being it: ``VAR=value``, ``sudo [-u USER]``,
    ``exec``, ``time``, ``.venv/bin/`` paths."""
    while words:
        head = words[0]
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", head) or head in {"exec", "time"}:
            words = words[1:]
        elif head == "sudo":
            words = words[3:] if words[1:2] == ["-u"] else words[1:]
        elif head.endswith("/prefetchd"):
            words = ["prefetchd", *words[1:]]
        else:
            return words
    return words


def test_the_pages_have_blocks_of_every_kind() -> None:
    """Guards the scan itself: a regex that matched nothing would pass every test below."""
    assert len(yaml_blocks()) >= 3
    assert len(of_lang("python")) >= 10
    commands = [c for b in of_lang(*SHELLS) for c in prefetchd_commands(b.text)]
    assert {c[0] for c in commands} >= {"run", "status", "check", "init"}


def yaml_blocks() -> list[Block]:
    """``yaml`` blocks, and the YAML configs that shell blocks write with a here-document
    (``cat > train.yaml <<'EOF'``)."""
    found = of_lang("yaml")
    for block in of_lang(*SHELLS):
        for body in heredocs(block.text):
            if re.search(r"^source:", body, re.M):
                found.append(Block(block.page, block.line, "yaml heredoc", body))
    return found


@pytest.mark.parametrize("block", yaml_blocks(), ids=ids(yaml_blocks()))
def test_a_yaml_config_block_loads(block: Block, monkeypatch: pytest.MonkeyPatch) -> None:
    # num_workers: auto reads TF_CONFIG, as on a tf.distribute worker
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}',
    )
    data = yaml.safe_load(block.text)
    if isinstance(data, dict) and "source" in data:
        config_from_dict(data, base_dir=ROOT)


@pytest.mark.parametrize("block", of_lang(*SHELLS), ids=ids(of_lang(*SHELLS)))
def test_every_prefetchd_command_is_one_the_cli_accepts(block: Block) -> None:
    for args in prefetchd_commands(block.text):
        try:
            _parser().parse_args(args)
        except SystemExit as exc:
            # --version and --help exit 0 after printing; a usage error exits 2
            assert exc.code == 0, f"{block.where}: `prefetchd {shlex.join(args)}` is refused"


@pytest.mark.parametrize("block", of_lang("python"), ids=ids(of_lang("python")))
def test_a_python_block_compiles(block: Block) -> None:
    if "fragment" in block.info.split()[1:]:
        assert block.text.strip(), f"{block.where}: an empty fragment"
        return
    compile(block.text, block.where, "exec")


def test_the_commands_scan_sees_through_prompts_and_prefixes() -> None:
    text = (
        "$ prefetchd check --config a.yaml   # comment\n"
        "sudo -u train prefetchd run \\\n  --config /etc/p.yaml\n"
        "AWS_PROFILE=x prefetchd status --config a.yaml --json | jq .state\n"
        "echo prefetchd && .venv/bin/prefetchd --version\n"
        "prefetchd run --config a.yaml >log 2>&1 &\n"
        "cat > a.yaml <<'EOF'\nsource: {url: \"s3://b/it's/\"}\nprefetchd in a heredoc\nEOF\n"
    )
    assert prefetchd_commands(text) == [
        ["check", "--config", "a.yaml"],
        ["run", "--config", "/etc/p.yaml"],
        ["status", "--config", "a.yaml", "--json"],
        ["--version"],
        ["run", "--config", "a.yaml"],
    ]


def test_a_wrong_flag_is_caught() -> None:
    """The parser must refuse what the docs could get wrong, or the scan proves nothing."""
    for args in (["status", "--config", "a", "--follow"], ["start", "--config", "a"], ["run"]):
        with pytest.raises(SystemExit) as exc:
            _parser().parse_args(args)
        assert exc.value.code == 2
