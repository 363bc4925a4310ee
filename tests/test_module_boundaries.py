"""DESIGN's dependency rules that a test can keep true.

- No module uses another module's private (``_name``) members, whether imported
  (``from m import _x``) or reached through a module (``m._x``). The one exception is
  ``accord/platform/embedded/mongomock_bridge.py``, the single place that may reach into
  mongomock (whose versions pyproject pins for that reason), and
  ``accord/checkpointers/langgraph_internals.py``, the single place that reads LangGraph's
  private API (checked by tests/checkpointers/test_langgraph_internals.py).
- Only ``accord.runtime`` constructs units of work (the kernel): every part gets its unit
  of work from there, so a hook registered on the runtime sees every write.
- ``import accord.platform`` (and the CLI) must not load the embedded engine or mongomock:
  a user on Atlas never pays for them.
- ``accord.platform`` never imports LangGraph or LangChain (memory, governance and durable
  execution build on it without them), and only ``accord.runtime`` imports
  ``accord.governance`` (the composition root hands governance's hooks to the others).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "accord"
ALLOWED = {
    ROOT / "platform" / "embedded" / "mongomock_bridge.py",
    ROOT / "checkpointers" / "langgraph_internals.py",
}
#: The kernel's classes; only accord/runtime.py may call them.
KERNEL_CLASSES = {"UnitOfWork", "AsyncUnitOfWork"}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: Path) -> list[str]:
    """``file:line: what`` for every use of another module's private name in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: set[str] = set()  # local names bound to imported modules (or their members)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            for alias in node.names:
                if _is_private(alias.name):
                    found.append(f"{path}:{node.lineno}: from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                found.append(f"{path}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_uses_another_modules_private_names() -> None:
    violations = [
        v for path in sorted(ROOT.rglob("*.py")) if path not in ALLOWED for v in private_uses(path)
    ]
    assert violations == [], "\n".join(violations)


def kernel_constructions(path: Path) -> list[str]:
    """``file:line`` of every call of a unit-of-work class in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in KERNEL_CLASSES:
                found.append(f"{path}:{node.lineno}: {ast.unparse(func)}(...)")
    return found


def test_only_the_runtime_constructs_units_of_work() -> None:
    runtime = ROOT / "runtime.py"
    elsewhere = [
        found
        for path in sorted(ROOT.rglob("*.py"))
        if path != runtime
        for found in kernel_constructions(path)
    ]
    assert elsewhere == [], (
        "units of work are built by accord.runtime.kernel() only:\n" + "\n".join(elsewhere)
    )
    assert kernel_constructions(runtime), "accord/runtime.py builds the kernel"


def test_the_checker_catches_both_forms(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from a.b import _hidden, public\nimport c.d as e\nx = e._inner\ny = public._z\n"
        "class K:\n    def f(self):\n        return self._mine\n"
    )
    uses = private_uses(sample)
    assert [u.split(": ", 1)[1] for u in uses] == [
        "from a.b import _hidden",
        "e._inner",
        "public._z",
    ]


def _loaded_after(statement: str) -> list[str]:
    code = (
        f"import sys\n{statement}\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith(('mongomock', "
        "'accord.platform.embedded.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.split()


def test_importing_the_platform_does_not_load_the_engine() -> None:
    loaded = _loaded_after("import accord.platform; accord.platform.connect")
    assert loaded == ["accord.platform.embedded.discovery"]


def test_the_cli_does_not_load_the_engine_until_it_runs_one() -> None:
    loaded = _loaded_after("import accord.platform.cli")
    assert loaded == ["accord.platform.embedded.discovery"]


def test_the_engine_does_load_them() -> None:
    # The check above would pass vacuously if the module names were wrong.
    loaded = _loaded_after("from accord.platform.embedded import EmbeddedServer")
    assert "mongomock" in loaded and "accord.platform.embedded.server" in loaded


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in ``path`` (accord uses no relative ones)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
    return found


def _importers(paths: list[Path], prefixes: tuple[str, ...]) -> list[str]:
    return [
        f"{path}:{line}: {module}"
        for path in paths
        for line, module in _imported_modules(path)
        if module == prefixes[0] or module.startswith(prefixes)
    ]


def test_the_platform_never_imports_langgraph_or_langchain() -> None:
    platform = sorted((ROOT / "platform").rglob("*.py"))
    assert len(platform) > 20  # the glob found the package
    for name in ("langgraph", "langchain", "langchain_core"):
        assert _importers(platform, (name, f"{name}.")) == []


def test_only_the_runtime_imports_governance() -> None:
    others = [p for p in sorted(ROOT.rglob("*.py")) if p != ROOT / "runtime.py"]
    others = [p for p in others if ROOT / "governance" not in p.parents]
    assert _importers(others, ("accord.governance", "accord.governance.")) == []


def test_the_import_checker_sees_both_forms(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import langgraph.graph\nfrom accord.governance.audit import x\n")
    assert _importers([sample], ("langgraph", "langgraph.")) != []
    assert _importers([sample], ("accord.governance", "accord.governance.")) != []
