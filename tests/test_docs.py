"""The README and docs/ a newcomer reads: links that resolve inside the repository, code
that does not shadow the package, and claims about CI that match what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [
    ROOT / "README.md",
    ROOT / "atlas-local" / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
# Markdown links [text](target), and paths quoted as code: `docs/x.md`, `../shared/X.md`.
LINK = re.compile(r"\]\(([^)#\s]+)[^)]*\)")
# (Only paths from the repository's root or above: `saver.py` alone is named in context.)
TOP = r"(?:\.\./[\w./-]+|(?:accord|docs|tests|benchmarks|tools|atlas-local|shared)/[\w./-]+)"
# ("`tests/x.py` of the installed langgraph" is another project's file.)
QUOTED_PATH = re.compile(rf"`({TOP}\.(?:md|py|yml|toml))`(?!\s+of the installed)")
CODE_BLOCK = re.compile(r"```(?:python|py)\n(.*?)```", re.DOTALL)


def _ids(pages: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in pages]


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_linked_or_quoted_path_exists_in_the_repository(page: Path) -> None:
    text = page.read_text()
    missing = []
    for target in LINK.findall(text) + QUOTED_PATH.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        candidates = [page.parent / target, ROOT / target]
        if not any(c.resolve().exists() for c in candidates):
            missing.append(target)
        elif not all(
            ROOT in c.resolve().parents or c.resolve() == ROOT for c in candidates if c.exists()
        ):
            missing.append(f"{target} (outside the repository)")
    assert not missing, f"{page.name} names paths that are not in the repository: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_python_examples_do_not_shadow_the_package(page: Path) -> None:
    for block in CODE_BLOCK.findall(page.read_text()):
        assert not re.search(r"^\s*accord\s*=|\bas accord\b", block, re.MULTILINE), block


def test_what_the_docs_say_ci_runs_is_what_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    ran = set(re.findall(r"^\s*make ([\w-]+)", ci, re.MULTILINE))
    for page in PAGES:
        text = " ".join(page.read_text().split())
        for sentence in re.findall(r"CI \(`\.ci/run`\) runs ([^.]*)", text):
            said = re.split(r";| only|, so|, not", sentence)[0]
            claimed = set(re.findall(r"`make ([\w-]+)`", said))
            assert claimed <= ran, f"{page.name}: CI runs {sorted(ran)}, not {sentence!r}"
