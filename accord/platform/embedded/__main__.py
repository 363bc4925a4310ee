"""``python -m accord.platform.embedded [OPTIONS]``: ``accord engine start --foreground``.

What ``accord engine start`` and ``accord.platform.connect()`` spawn. The options are the
typer command's (``accord engine start --help``); this is only a shim, so there is one CLI.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> None:
    from accord.platform.cli import app

    args = sys.argv[1:] if argv is None else argv
    app(["engine", "start", "--foreground", *args], prog_name="python -m accord.platform.embedded")


if __name__ == "__main__":
    main()
