"""The core install (`pip install accord`) works without the optional extras, and what
needs one says which to install. The extras' modules are blocked in a subprocess (as if
not installed), so this runs in the dev venv that has them all."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = ("fastapi", "fastapi_offline", "starlette", "uvicorn", "mcp", "voyageai")

BLOCK = textwrap.dedent(
    f"""
    import importlib.abc, sys
    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in {OPTIONAL!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
    sys.meta_path.insert(0, Blocked())
    """
)


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK + textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip


def test_the_core_imports_and_runs_without_the_extras(tmp_path: Path) -> None:
    result = run(
        f"""
        import accord.runtime, accord.checkpointers, accord.memory.aggregator
        import accord.platform.cli, accord.demo, accord.platform.embedded.server
        from accord.memory.embedders import HashingEmbedder
        from accord.platform.embedded import EmbeddedServer
        with EmbeddedServer({str(tmp_path)!r}, port=0, sync=False) as server:
            from accord.runtime import Accord
            with Accord(server.uri, db_name="lean") as app:
                app.checkpointer().setup()
                app.store().put(("notes",), "k", {{"text": "hello"}})
                print("stored", app.store().get(("notes",), "k").value)
        print("loaded", sorted(m for m in sys.modules if m.split(".")[0] in {OPTIONAL!r}))
        """
    )
    assert result.returncode == 0, result.stderr
    assert "stored {'text': 'hello'}" in result.stdout
    assert "loaded []" in result.stdout


def test_serve_and_mcp_name_the_server_extra() -> None:
    for command in (["serve"], ["mcp", "--tenant", "acme"]):
        result = run(f"from accord.platform.cli import app; app({command!r})")
        assert result.returncode == 2, result.stdout + result.stderr
        assert "pip install 'accord[server]'" in result.stdout + result.stderr
        assert "Traceback" not in result.stderr


def test_the_http_api_module_names_the_server_extra() -> None:
    result = run(
        """
        try:
            import accord.memory.http_api
        except ImportError as exc:
            from accord.errors import MissingExtraError
            print(type(exc).__name__, isinstance(exc, MissingExtraError), exc)
        """
    )
    assert "MissingExtraError True" in result.stdout, result.stderr
    assert "pip install 'accord[server]'" in result.stdout


def test_voyage_embedder_names_the_voyage_extra() -> None:
    result = run(
        """
        from accord.errors import MissingExtraError
        from accord.memory.embedders import VoyageEmbedder, resolve_embedder
        for make in (lambda: VoyageEmbedder("voyage-3.5"), lambda: resolve_embedder("voyage:voyage-3.5")):
            try:
                make()
            except MissingExtraError as exc:
                print("refused:", exc)
        """
    )
    assert result.stdout.count("pip install 'accord[voyage]'") == 2, result.stdout + result.stderr


def test_pyproject_keeps_the_extras_out_of_the_core() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {d.split(">")[0].split("[")[0].strip().lower() for d in project["dependencies"]}
    assert not core & {"fastapi", "fastapi-offline", "uvicorn", "mcp", "voyageai", "pyarrow"}, core
    extras = project["optional-dependencies"]
    assert {"fastapi", "fastapi-offline", "uvicorn", "mcp"} <= {
        d.split(">")[0].strip() for d in extras["server"]
    }
    assert any(d.startswith("voyageai") for d in extras["voyage"])
    assert any(d.startswith("pyarrow") for d in extras["export"])
    dev = next(d for d in extras["dev"] if d.startswith("accord["))
    # the tests exercise every extra but the local model's
    assert {"server", "voyage", "export"} <= set(dev[len("accord[") : -1].split(",")), dev
