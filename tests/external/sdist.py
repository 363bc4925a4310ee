"""Fetch and unpack the source distribution of an installed package (its test tree).

LangGraph, langgraph-checkpoint and pymongo ship their tests only in their sdists. The
harnesses that run those tests against accord need the tree of the *installed* release,
so this downloads ``NAME==<installed version>`` with pip (the registry's ordinary client,
honouring the machine's pip configuration), unpacks it under ``.accord/external/`` (git-
ignored) and returns the unpacked root. A second call is a cache hit; concurrent callers
serialise on a lock file. Only test setup uses this: accord itself never fetches anything.

    from tests.external.sdist import fetch_sdist
    root = fetch_sdist("langgraph")            # .accord/external/sdist/langgraph-1.2.24
    tests_dir = root / "tests"
"""

from __future__ import annotations

import fcntl
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".accord" / "external"
_DONE = ".accord-complete"


class SdistError(RuntimeError):
    """The source distribution could not be fetched or unpacked (the message says why)."""


def installed_version(dist: str) -> str:
    """The installed version of distribution ``dist``; SdistError if it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        raise SdistError(
            f"{dist} is not installed in {sys.prefix}; install it (make .venv/.installed) "
            "or pass an explicit version"
        ) from None


def fetch_sdist(dist: str, version: str | None = None, cache_dir: Path | None = None) -> Path:
    """Return the unpacked source tree of ``dist`` at ``version`` (default: the installed one).

    Downloads with ``pip download --no-deps --no-binary :all:`` on first use; later calls
    return the cached tree. Raises SdistError with pip's output when the download fails.
    """
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", dist):
        raise SdistError(f"not a distribution name: {dist!r}")
    version = version or installed_version(dist)
    key = re.sub(r"[-_.]+", "_", dist).lower()
    cache = (cache_dir or CACHE_DIR) / "sdist"
    target = cache / f"{key}-{version}"
    if (target / _DONE).exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{key}-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / _DONE).exists():  # another process finished while we waited
            return target
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            archive = _download(dist, version, Path(tmp) / "download")
            unpacked = _unpack(archive, Path(tmp) / "unpacked")
            (unpacked / _DONE).write_text(f"{dist}=={version} from {archive.name}\n")
            if target.exists():
                shutil.rmtree(target)  # a half-written tree from an interrupted run
            unpacked.rename(target)
    return target


def _download(dist: str, version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    cmd += ["--no-binary", ":all:", "--dest", str(dest), f"{dist}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    archives = sorted(dest.glob("*")) if dest.exists() else []
    if proc.returncode != 0 or len(archives) != 1:
        raise SdistError(
            f"pip could not download the sdist of {dist}=={version} "
            f"(exit {proc.returncode}); PyPI must be reachable for the external suites:\n"
            f"{(proc.stdout + proc.stderr)[-2000:]}"
        )
    return archives[0]


def _unpack(archive: Path, dest: Path) -> Path:
    dest.mkdir()
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(dest)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")
    entries = list(dest.iterdir())
    if len(entries) != 1 or not entries[0].is_dir():
        raise SdistError(f"{archive.name} does not unpack to a single directory")
    return entries[0]


if __name__ == "__main__":  # python -m tests.external.sdist NAME [VERSION]
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m tests.external.sdist NAME [VERSION]")
    print(fetch_sdist(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else None))
