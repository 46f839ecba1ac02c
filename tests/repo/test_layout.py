"""The house rules the import-linter contracts (pyproject.toml) cannot state themselves."""

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.support import ALONE

ROOT = Path(__file__).resolve().parents[2]


def _contract(name_start: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["name"].startswith(name_start))


def test_the_layers_contract_covers_every_package():
    # A new top-level package must sit in a layer, or it could import anything unseen.
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()} - {"tests"}
    contract = _contract("Layers")
    layered = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    assert layered == packages
    assert set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["root_packages"]) \
        == packages
    assert contract["layers"][0] == "playground"  # nothing may import the playground
    assert "ignore_imports" not in contract  # the layers hold without exceptions


def test_lint_imports_fails_on_a_product_import_of_the_playground(tmp_path):
    # The contract can fail: the same configuration over a copy where the plugin imports the demo.
    import shutil

    for pkg in ("dra_driver", "kubeletplugin", "cdi", "playground"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("_native", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "kubeletplugin" / "driver.py", "a") as f:
        f.write("\nfrom playground import demo  # noqa\n")
    with open(tmp_path / "dra_driver" / "kube.py", "a") as f:
        f.write("\nfrom kubeletplugin import driver  # noqa\n")
    # and the strategies' and the agent's contracts (one run for all)
    with open(tmp_path / "kubeletplugin" / "strategies" / "mps" / "control.py", "a") as f:
        f.write("\nfrom kubeletplugin.strategies.mig import ledger  # noqa\n")
    with open(tmp_path / "kubeletplugin" / "agent" / "status.py", "a") as f:
        f.write("\nfrom kubeletplugin.strategies.mps import control  # noqa\n")
    lint = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
            "sys.exit(c())", "--no-cache"]
    broken = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "kubeletplugin.driver -> playground.demo" in broken.stdout
    assert "dra_driver.kube -> kubeletplugin.driver" in broken.stdout
    assert "kubeletplugin.strategies.mps.control -> kubeletplugin.strategies.mig.ledger" in broken.stdout
    assert "kubeletplugin.agent.status -> kubeletplugin.strategies.mps.control" in broken.stdout


def _imports(source: str, package: str) -> list[str]:
    """Every module an import statement in `source` names, relative ones resolved against
    `package` (the importing module's package), with each `from M import name` also as M.name
    (the name may be a module)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return out


def _test_module_imports(source: str, package: str) -> list[str]:
    return [m for m in _imports(source, package)
            if any(part.startswith("test_") or part == "conftest" for part in m.split("."))]


def _python_files(folder: Path, pattern: str = "*.py") -> list[Path]:
    return sorted(p for p in folder.rglob(pattern) if "__pycache__" not in p.parts)


def test_no_test_module_imports_another_test_module_or_a_conftest():
    # Helpers live in tests/support/ and fixtures in conftest.py files: importing a test module
    # runs its tests' module code twice, and a fixture imported by name is redefined unseen.
    offenders = {}
    for path in _python_files(ROOT / "tests"):
        package = ".".join(path.relative_to(ROOT).parent.parts)
        if found := _test_module_imports(path.read_text(), package):
            offenders[str(path.relative_to(ROOT))] = found
    assert not offenders


def test_the_test_module_import_check_sees_every_form():
    for source in ("from .test_prepare import load_spec", "from . import test_prepare", "from .conftest import Dirs",
                   "import tests.kubeletplugin.test_prepare", "from tests.kubeletplugin import conftest",
                   "from ..agent.conftest import wait_for"):
        assert _test_module_imports(source, "tests.kubeletplugin"), source
    assert _test_module_imports("from tests.support import wait_for\nimport pytest", "tests.agent") == []


def test_neither_hack_nor_the_product_imports_the_tests():
    # Benchmarks take what they share with the tests from the playground (playground/claims.py).
    scripts = [p for p in _python_files(ROOT / "hack", "*")
               if p.is_file() and (p.suffix == ".py" or p.read_bytes().startswith(b"#!/usr/bin/env python"))]
    assert {p.name for p in scripts} >= {"bench-agent", "bench-backstop", "bench-prepare"}
    product = [p for pkg in ("dra_driver", "kubeletplugin", "cdi", "playground") for p in _python_files(ROOT / pkg)]
    offenders = {str(p.relative_to(ROOT)): found for p in scripts + product
                 if (found := [m for m in _imports(p.read_text(), "") if m.split(".")[0] == "tests"])}
    assert not offenders
    assert _imports("from tests.kubeletplugin.kubelet import make_claim", "")[0].split(".")[0] == "tests"


def _module_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other round a circle (Tarjan's strongly
    connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in imports.get(module, ()):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                other = stack.pop()
                group.append(other)
                if other == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(imports):
        if module not in index:
            visit(module)
    return cycles


def test_no_python_module_imports_round_a_circle():
    # Imports under `if TYPE_CHECKING:` count too: a type one module needs from another is
    # a dependency, and a circle of them means neither can be read alone.
    import grimp

    graph = grimp.build_graph("playground", "kubeletplugin", "dra_driver", "cdi")
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert _module_cycles(imports) == []


def test_the_circle_check_finds_a_circle():
    assert _module_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _module_cycles({"a": {"b"}, "b": set()}) == []


def test_every_test_file_measuring_at_real_time_priority_runs_alone():
    # measured_first's processes (SCHED_RR) would starve a timed test on the other serial worker
    # (tests/support ALONE; the Makefile runs `alone` after the other serial files).
    users = {str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
             if re.search(r"with [^\n]*measured_first\(\)", path.read_text())}
    assert users and users == set(ALONE)
