"""Every code block in README.md and docs/*.md that is a config, a command or Python is true to
the code: what a newcomer copies must work.

The conventions the docs follow (README.md, "Code blocks in these docs"):

- A fenced ``yaml`` block with a top-level ``source:`` (or ``sources:``) is a prefetchd
  config and loads with ``config_from_dict`` as written (bucket names, prefixes and
  endpoints are examples that validate as they are). So does a config that a shell block
  writes with a here-document (``cat > train.yaml <<'EOF'``); in an unquoted one, ``$VAR``
  stands for an example value:
  ``http://127.0.0.1:9000`` for a name with ``URL`` or ``ENDPOINT`` in it, else ``/tmp/VAR``.
  Other ``yaml`` blocks (manifests, fragments of a config) must parse.
- Every ``prefetchd ...`` command in a ``bash``, ``sh``, ``shell`` or ``console`` block (after
  a ``$ `` prompt, ``sudo [-u USER]``, ``VAR=value``, a path such as ``/opt/prefetchd/bin/``;
  ``\\`` continuations joined, redirections dropped) is accepted by the CLI's own argparse
  parser: a real subcommand with real flags. Nothing is run and no daemon is started.
- A ``python`` block compiles. One tagged ``python fragment`` is a piece of a larger program
  (an indented loop body, say) and is only checked to be there.
- Every file, module, class and method a page names in backticks exists (below), and
  docs/architecture.md's concept -> module table names every module of the package.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import re
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from prefetchd.commands.cli import _parser
from prefetchd.config import Config, config_from_dict

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
            if re.search(r"^sources?:", body, re.M):
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
    if isinstance(data, dict) and ("source" in data or "sources" in data):
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


# --- every module, class and function a page names exists ------------------------------------
#
# A page names code in backticks: a file (`download/publish.py`, `write/_native.c`,
# `tests/unit/test_layers.py`), a dotted name (`Publisher.publish`, `ledger.published_shards`,
# `prefetchd.consume.ready`, `python -m bench.profile_writer`) or a class (`ChildContext`).
# Each must name something in the repository: after a module moves or a method is renamed, a
# page that still names the old one fails here, not in a reader's head.

CODE_PACKAGES = ("prefetchd", "bench", "testkit")
SOURCE_SUFFIXES = (".py", ".pyi", ".c")
TEST_ID = re.compile(r"^([\w./-]+\.py)::(\w+)(?:::\w+)?(?:\[.*\])?$")
FILE_PATH = re.compile(r"^[\w./-]*\w\.(?:py|pyi|c)$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
PRIVATE = re.compile(r"^_[a-z]\w*$")
FOREIGN_PRIVATE = {"_copy_to_iter", "_total"}  # the kernel's function; a metric name's suffix
CLASS_NAME = re.compile(r"^_?[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")  # CamelCase, two humps at least
RUN_MODULE = re.compile(r"python3? -m ([\w.]+)")
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
# Dotted names that are not code of ours: file names (`status.json`), other projects' modules
# and classes.
NOT_CODE_SUFFIXES = {
    "json", "log", "lock", "yaml", "yml", "toml", "txt", "md", "tfrecord", "gz", "zst", "part",
    "owner", "job", "downloaded", "complete", "delivered", "parsing", "service", "mount", "conf",
    "sh", "png", "csv", "tar", "so", "html", "keep",
}  # fmt: skip
FOREIGN_MODULES = {
    "tf", "torch", "keras", "np", "numpy", "os", "sys", "time", "json", "signal", "socket",
    "threading", "multiprocessing", "asyncio", "boto3", "botocore", "awscrt", "zlib", "zstd",
    "zstandard", "tarfile", "io", "gzip", "hashlib", "pathlib", "collections", "typing",
    "dataclasses", "array", "yaml", "pytest", "hypothesis", "random", "contextlib", "logging",
    "importlib", "email", "glibc", "select", "selectors", "errno", "mmap", "struct", "ctypes",
    "google_crc32c", "crc32c", "isal", "webdataset", "systemd", "psutil", "prometheus_client",
    "tensorflow", "subprocess", "shutil", "tempfile", "uuid", "base64", "functools", "itertools",
    "math", "statistics", "urllib", "http", "enum", "abc", "pickle", "fcntl", "resource",
}  # fmt: skip
# CamelCase names of other projects (S3's API, TensorFlow, PyTorch, the standard library).
FOREIGN_CLASSES = {
    "ListObjectsV2", "GetObject", "HeadObject", "GetObjectAttributes", "ObjectParts",
    "ChecksumMode", "ChecksumType", "PartNumber", "ElementTree", "TFRecordDataset",
    "TFRecordWriter", "DataLoader", "DistributedSampler", "IterableDataset", "ModelCheckpoint",
    "BackupAndRestore", "MultiWorkerMirroredStrategy", "ParameterServerStrategy", "TypedDict",
    "NamedTuple", "StrEnum", "SimpleQueue", "ThreadPoolExecutor", "PyGILState", "DataFrame",
    "BytesIO", "PosixPath", "SeaweedFS", "MinIO", "JuiceFS", "PyTorch", "TensorFlow", "GitHub",
    "FullObject", "CephRGW", "LocalStack", "EmptyDir", "ConfigMap", "StatefulSet", "PodSpec",
    "IterDataset", "S3Request", "BadGzipFile", "DecodeError", "StatefulDataLoader",
    # S3 error codes and request fields
    "AccessDenied", "ExpiredToken", "InvalidAccessKeyId", "RequestTimeout", "InvalidObjectState",
    "SlowDown", "NoSuchBucket", "NoSuchKey", "MissingContentMD5", "MaxKeys",
    "SignatureDoesNotMatch", "InvalidToken", "TokenRefreshRequired",
    # systemd unit directives
    "NoNewPrivileges", "ProtectHome", "PrivateTmp", "RestrictAddressFamilies", "ProtectSystem",
}  # fmt: skip


@dataclass(frozen=True)
class CodeIndex:
    """What the repository defines: its source files, its modules (dotted name -> the names
    defined at their top level) and its classes (name -> members, over every class so named)."""

    files: frozenset[str]
    modules: dict[str, set[str]]
    classes: dict[str, set[str]]

    def module_named(self, dotted: str) -> list[str]:
        """The modules ``dotted`` can name: in full, or by its last parts (``ledger``,
        ``exactly_once.ledger``, ``prefetchd.exactly_once.ledger``)."""
        return [m for m in self.modules if m == dotted or m.endswith("." + dotted)]


def _members(cls: ast.ClassDef) -> set[str]:
    found: set[str] = set()
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
    for sub in ast.walk(cls):  # self.x = ... in any method
        if not (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)):
            continue
        if isinstance(sub.value, ast.Name) and sub.value.id == "self":
            found.add(sub.attr)
    return found


def _top_names(tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found.add(node.name)
        elif isinstance(node, ast.Assign):  # `A = ...` and `A, B = ...`
            found |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            found |= {(a.asname or a.name).split(".")[0] for a in node.names}
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):  # names a module loads lazily (PEP 562) are in its __all__
            found |= {
                e.value
                for e in ast.walk(node.value)
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            }
    return found


def code_index() -> CodeIndex:
    files = set()
    for top in ("prefetchd", "bench", "testkit", "tests", "scripts", "docker", "systemd"):
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                files.add(path.relative_to(ROOT).as_posix())
    files |= {p.name for p in ROOT.iterdir() if p.is_file()}
    modules: dict[str, set[str]] = {}
    classes: dict[str, set[str]] = {}
    for package in CODE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            names = _top_names(tree)
            if path.name == "__init__.py":  # a package's submodules are names of it
                names |= {p.stem for p in path.parent.glob("*.py")}
                names |= {p.name for p in path.parent.iterdir() if (p / "__init__.py").exists()}
            modules[dotted] = names
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    classes.setdefault(node.name, set()).update(_members(node))
    for path in (ROOT / "prefetchd").rglob("*.c"):  # an extension module: prefetchd.kernel._native
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts)] = set(re.findall(r'\{"(\w+)",', path.read_text()))
    return CodeIndex(frozenset(files), modules, classes)


def config_keys() -> set[str]:
    """``section.key`` of every config key (``download.window``): dotted, but not code."""
    keys = set()
    for section, kind in typing.get_type_hints(Config).items():
        keys.add(section)
        if dataclasses.is_dataclass(kind):
            keys |= {f"{section}.{name}" for name in typing.get_type_hints(kind)}
    return keys


def stale_reference(token: str, index: CodeIndex, config: set[str]) -> str | None:
    """Why ``token`` (the text of one inline code span) names nothing in the repository, or
    None if it names something that exists or is not a name of code."""
    token = token.strip().removesuffix("()")
    test = TEST_ID.match(token)
    if test:  # `tests/faults/test_crashes.py::test_x`: the file, and the test in it
        path, name = test.groups()
        files = [f for f in index.files if f == path or f.endswith("/" + path)]
        if not files:
            return f"no file {path}"
        define = re.compile(rf"^\s*(?:async )?(?:def|class) {name}\b", re.M)
        defined = any(define.search((ROOT / f).read_text(encoding="utf-8")) for f in files)
        return None if defined else f"no test {name} in {path}"
    if token.startswith("prefetchd/") or FILE_PATH.match(token):
        return None if _file_exists(token, index) else f"no file {token}"
    run = RUN_MODULE.search(token)
    if run:
        module = run.group(1)
        ours = module.split(".")[0] in (*CODE_PACKAGES, "tests", "scripts")
        return None if not ours or module in index.modules else f"no module {module}"
    if CLASS_NAME.match(token):
        known = token in index.classes or token in FOREIGN_CLASSES or hasattr(builtins, token)
        return None if known else f"no class {token}"
    if PRIVATE.match(token) and token not in FOREIGN_PRIVATE:  # `_publish`: a function of ours
        defined = any(token in names for names in index.modules.values()) or any(
            token in members for members in index.classes.values()
        )
        return None if defined else f"no function or method {token}"
    if not DOTTED.match(token) or token in config:
        return None
    parts = token.split(".")
    if parts[-1] in NOT_CODE_SUFFIXES or parts[0] in FOREIGN_MODULES:
        return None
    if ".".join(parts[:2]) in config:  # a config key's value: `epochs.shuffle.blocks`
        return None
    return _dotted_problem(parts, index)


def _file_exists(token: str, index: CodeIndex) -> bool:
    path = token.removeprefix("./")
    if path.endswith("/"):
        return (ROOT / path).is_dir() or (ROOT / "prefetchd" / path).is_dir()
    if path in index.files or f"prefetchd/{path}" in index.files:
        return True
    return any(f.endswith("/" + path) for f in index.files)


def _dotted_problem(parts: list[str], index: CodeIndex) -> str | None:
    token = ".".join(parts)
    # the longest leading run of parts that names a module of ours, then names inside it
    for n in range(len(parts), 0, -1):
        modules = index.module_named(".".join(parts[:n]))
        if not modules:
            continue
        rest = parts[n:]
        if not rest:
            return None
        for module in modules:
            if rest[0] not in index.modules[module]:
                continue
            if len(rest) == 1 or rest[0] not in index.classes:
                return None
            if rest[1] in index.classes[rest[0]]:
                return None
        if parts[0] == "prefetchd" or n > 1:
            return f"{token}: no {rest[0]} in {' or '.join(modules)}"
        break  # `status.x`: a one-word module name that may be a word; try a class below
    if parts[0] in index.classes:
        if parts[1] in index.classes[parts[0]]:
            return None
        return f"{token}: no {parts[1]} in class {parts[0]}"
    if index.module_named(parts[0]):
        return f"{token}: no {parts[1]} in {' or '.join(index.module_named(parts[0]))}"
    return None  # not a name of ours (a key of a JSON record, a field path)


def inline_code(page: Path) -> list[tuple[int, str]]:
    """``(line, text)`` of every inline code span of ``page`` outside fenced blocks, and the
    ``python -m`` modules inside them."""
    text = page.read_text(encoding="utf-8")
    spans = []
    fenced = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for n, line in enumerate(fenced.splitlines(), 1):
        spans += [(n, m.group(1)) for m in INLINE_CODE.finditer(line)]
    for match in FENCE.finditer(text):
        first = text.count("\n", 0, match.start()) + 2
        for k, line in enumerate(match.group(2).splitlines()):
            spans += [(first + k, m.group(0)) for m in RUN_MODULE.finditer(line)]
    return spans


def stale_references(pages: list[Path]) -> list[str]:
    index, config = code_index(), config_keys()
    found = []
    for page in pages:
        for line, token in inline_code(page):
            problem = stale_reference(token, index, config)
            if problem:
                found.append(f"{page.relative_to(ROOT)}:{line}: {problem}")
    return found


def test_every_module_class_and_function_a_page_names_exists() -> None:
    assert stale_references(PAGES) == []


def test_the_reference_check_catches_a_moved_module_or_a_renamed_method() -> None:
    """The checker itself: names that moved away are reported, words that are not code pass."""
    index, config = code_index(), config_keys()
    gone = [
        "supervise/child.py",
        "write/journal.py",
        "Writer._may_fetch",
        "Downloader._serve_kept",
        "KeepEpoch",
        "consume.report",
        "prefetchd.write._native",
        "python -m bench.nowhere",
        "test_layers.py::test_nothing_like_this",
    ]
    assert [t for t in gone if stale_reference(t, index, config) is None] == []
    fine = [
        "exactly_once/journal.py",
        "kernel/_native.c",
        "Mixer.may_fetch",
        "Handover.serve",
        "EpochKeep",
        "messages.consumer_report",
        "prefetchd.kernel._native",
        "prefetchd.records",
        "download.window",
        "status.json",
        "tf.data",
        "ListObjectsV2",
        "tests/unit/test_layers.py::test_every_import_follows_the_layers",
    ]
    assert {t: stale_reference(t, index, config) for t in fine} == dict.fromkeys(fine)


def test_the_architecture_page_names_every_module() -> None:
    """docs/architecture.md's concept -> module table names every module of the package by its
    path under prefetchd/; a package's ``__init__.py`` too when it defines something or tells
    a story (a docstring of 20 lines or more), not when it only re-exports its modules."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`([\w/]+\.(?:py|c|pyi))`", page))
    package = ROOT / "prefetchd"
    missing = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if path.name == "__init__.py" and not _holds_more_than_imports(path):
            continue  # its modules are named instead
        if rel not in named:
            missing.append(rel)
    assert missing == [], "add these modules to the table in docs/architecture.md"


def _holds_more_than_imports(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defines = any(isinstance(n, ast.FunctionDef | ast.ClassDef) for n in tree.body)
    return defines or len((ast.get_docstring(tree) or "").splitlines()) >= 20
