"""Generate accord's synchronous modules from their asynchronous sources.

accord writes I/O code once, async (pymongo's ``AsyncMongoClient``), and generates the
sync twin from it, as pymongo does for itself (its ``tools/synchro.py``). Convention:
every module in a package named ``asynchronous`` under ``accord/`` is a source, and its
twin is the same file name in the sibling ``synchronous`` package.

The translation, token by token (the ``unasync`` library): ``async``/``await`` removed,
``async with``/``async for`` become ``with``/``for``, ``__aenter__`` -> ``__enter__``
and friends, names starting with ``Async`` lose the prefix (``AsyncUnitOfWork`` ->
``UnitOfWork``, ``AsyncMongoClient`` -> ``MongoClient``), ``asynchronous`` ->
``synchronous`` in imports, plus :data:`REPLACEMENTS` (e.g. LangGraph's ``aget_tuple``
-> ``get_tuple``). Then: ``_IS_SYNC = False`` becomes ``True`` (so code can branch on
it), ``asyncio.sleep(x)`` becomes ``time.sleep(x)`` (the source imports ``time``), the
source's closing docstring sentence "This module is the async source; ... by
``tools/synchro.py``." becomes a note that the file is generated, and ruff formats the
result and drops imports the sync code no longer uses. Docstrings and comments are
translated too (``AsyncX`` -> ``X``, ``asynchronous`` -> ``synchronous``, the names of
:data:`REPLACEMENTS`), so the generated module describes itself, not its source: a source's
prose should therefore name its own twin's things in a way that reads right both ways.

Usage::

    python -m tools.synchro          # rewrite every generated module
    python -m tools.synchro --check  # exit 1, listing stale modules, if any differs

``tests/test_generated_code.py`` runs the check, so a stale generated file fails CI.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

import unasync

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "accord"

#: Extra token replacements (whole names) on top of unasync's and the ``Async`` prefix
#: rule. Add LangGraph's a-prefixed method names here as sources use them.
REPLACEMENTS: dict[str, str] = {
    "asynchronous": "synchronous",
    "AsyncClientSession": "ClientSession",
    "aclose": "close",
    "anext": "next",
    "aiter": "iter",
    "StopAsyncIteration": "StopIteration",
    # LangGraph's checkpointer API
    "aget_tuple": "get_tuple",
    "aget": "get",
    "alist": "list",
    "aput": "put",
    "aput_writes": "put_writes",
    "adelete_thread": "delete_thread",
    "adelete_for_runs": "delete_for_runs",
    "acopy_thread": "copy_thread",
    "aprune": "prune",
    "asetup": "setup",
    # LangGraph's store API
    "abatch": "batch",
    "asearch": "search",
    "adelete": "delete",
    "alist_namespaces": "list_namespaces",
    # accord.checkpointers: twin-specific helpers (accord/checkpointers/bridges.py,
    # ownership.Signal)
    "new_async_lock": "new_thread_lock",
    "asweep": "sweep",
    "adelete_expired": "delete_expired",
    "acollect_garbage": "collect_garbage",
    "apending_collection": "pending_collection",
    "aread_workflow_events": "read_workflow_events",
    "aput_artifact": "put_artifact",
    "aget_artifact": "get_artifact",
    "agc_artifacts": "gc_artifacts",
    "arollback": "rollback",
    "await_for": "wait_for",
    # accord's embedders (accord.memory.embedders)
    "aembed_documents": "embed_documents",
    "aembed_query": "embed_query",
    # accord's extractors (accord.memory.extraction)
    "arun_extractor": "run_extractor",
}

_ASYNC_NAME = re.compile(r"\bAsync(?=[A-Z])")
_PROSE_WORDS = re.compile(
    r"\b(" + "|".join(sorted(map(re.escape, REPLACEMENTS), key=len, reverse=True)) + r")\b"
)
_SOURCE_NOTE = re.compile(r"This module is the async source;.*?``tools/synchro\.py``\.", re.DOTALL)
_SLEEP = re.compile(r"\basyncio\.sleep\(")


class _Rule(unasync.Rule):  # type: ignore[misc]
    """unasync's rule, but ``AsyncX`` becomes ``X`` (not ``SyncX``)."""

    def _unasync_name(self, name: str) -> str:
        if name in self.token_replacements:
            return str(self.token_replacements[name])
        if len(name) > 5 and name.startswith("Async") and name[5].isupper():
            return name[5:]
        return name


def sources() -> list[Path]:
    """Every async source module (``accord/**/asynchronous/*.py`` except ``__init__``)."""
    return sorted(p for p in PACKAGE.rglob("asynchronous/*.py") if p.name != "__init__.py")


def target_of(source: Path) -> Path:
    return source.parent.parent / "synchronous" / source.name


def _prose(fragment: str) -> str:
    """Translate the names in a docstring or comment as unasync translates code."""
    fragment = _ASYNC_NAME.sub("", fragment)
    return _PROSE_WORDS.sub(lambda m: REPLACEMENTS[m.group(1)], fragment)


def _translate_prose(text: str) -> str:
    """Apply :func:`_prose` to every docstring and comment of ``text`` (Python source)."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(row: int, col: int, *, in_bytes: bool) -> int:
        line = lines[row - 1]
        if in_bytes:  # ast columns count UTF-8 bytes, tokenize's count characters
            col = len(line.encode("utf-8")[:col].decode("utf-8", errors="ignore"))
        return starts[row - 1] + col

    spans: list[tuple[int, int]] = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
            and first.end_lineno is not None
            and first.end_col_offset is not None
        ):
            spans.append((
                offset(first.lineno, first.col_offset, in_bytes=True),
                offset(first.end_lineno, first.end_col_offset, in_bytes=True),
            ))  # fmt: skip
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            spans.append((offset(*tok.start, in_bytes=False), offset(*tok.end, in_bytes=False)))
    for start, end in sorted(spans, reverse=True):  # from the end: earlier offsets hold
        text = text[:start] + _prose(text[start:end]) + text[end:]
    return text


def _postprocess(text: str, source: Path) -> str:
    rel = source.relative_to(ROOT).as_posix()
    if "\n_IS_SYNC = False\n" not in text:
        raise SystemExit(f"{rel}: an async source must define `_IS_SYNC = False` at top level")
    text = text.replace("\n_IS_SYNC = False\n", "\n_IS_SYNC = True\n", 1)
    text = _SLEEP.sub("time.sleep(", text)
    text = _translate_prose(text)
    text, notes = _SOURCE_NOTE.subn(
        f"Generated from ``{rel}`` by ``tools/synchro.py``: edit that file, not this one.",
        text,
    )
    if not notes:
        raise SystemExit(
            f"{rel}: the module docstring must end with 'This module is the async source; "
            f"... by ``tools/synchro.py``.'"
        )
    header = (
        f"# Generated from {rel} by tools/synchro.py. Do not edit: run `python -m tools.synchro`.\n"
    )
    return header + text


def generate(source: Path, out_root: Path) -> Path:
    """Write the sync twin of ``source`` under ``out_root`` (mirroring the tree)."""
    staged = out_root / source.relative_to(ROOT)
    staged.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, staged)
    rule = _Rule("/asynchronous/", "/synchronous/", additional_replacements=REPLACEMENTS)
    unasync.unasync_files([str(staged)], [rule])
    out = target_of(staged)
    out.write_text(_postprocess(out.read_text(encoding="utf-8"), source), encoding="utf-8")
    return out


def _ruff(paths: list[Path]) -> None:
    config = ["--config", str(ROOT / "pyproject.toml")]
    files = [str(p) for p in paths]
    subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--quiet", "--fix", "--select", "F401,I",
         *config, *files],
        check=False,
    )  # fmt: skip
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", *config, *files], check=True)


def build() -> dict[Path, str]:
    """Generated text per target path (nothing written in the tree)."""
    with tempfile.TemporaryDirectory() as tmp:
        out_root = Path(tmp)
        pairs = [(target_of(s), generate(s, out_root)) for s in sources()]
        if pairs:
            _ruff([p for _, p in pairs])
        return {target: staged.read_text(encoding="utf-8") for target, staged in pairs}


def stale() -> list[Path]:
    """Generated modules whose checked-in text differs from a fresh generation."""
    return [
        target
        for target, text in build().items()
        if not target.exists() or target.read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="report stale files, write nothing")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale()
        for path in bad:
            print(f"stale: {path.relative_to(ROOT)} (run `python -m tools.synchro`)")
        return 1 if bad else 0
    for target, text in build().items():
        target.parent.mkdir(parents=True, exist_ok=True)
        init = target.parent / "__init__.py"
        if not init.exists():
            init.write_text("")
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
