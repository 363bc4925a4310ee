"""The sdist fetcher's own contract: names are checked, the cache is used, errors say why."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.external.sdist import SdistError, fetch_sdist, installed_version


def test_rejects_what_is_not_a_distribution_name(tmp_path: Path) -> None:
    with pytest.raises(SdistError, match="not a distribution name"):
        fetch_sdist("langgraph; rm -rf /", "1.0", cache_dir=tmp_path)


def test_a_package_that_is_not_installed_is_named() -> None:
    with pytest.raises(SdistError, match="no-such-accord-package is not installed"):
        installed_version("no-such-accord-package")


def test_a_complete_cached_tree_is_returned_without_downloading(tmp_path: Path) -> None:
    tree = tmp_path / "sdist" / "langgraph_checkpoint-9.9.9"
    (tree / "tests").mkdir(parents=True)
    (tree / ".accord-complete").write_text("cached\n")
    assert fetch_sdist("langgraph-checkpoint", "9.9.9", cache_dir=tmp_path) == tree


def test_the_installed_version_is_the_default() -> None:
    import importlib.metadata

    assert installed_version("langgraph") == importlib.metadata.version("langgraph")
