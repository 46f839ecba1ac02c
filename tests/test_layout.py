"""The house rules the import-linter contracts (pyproject.toml) cannot state themselves."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _contract(name_start: str) -> dict:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["name"].startswith(name_start))


def test_the_playground_contract_covers_every_product_module():
    # A new product module must be named in the contract, or it could import the playground unseen.
    product = {"kubeletplugin", "cdi"} | {
        f"dra_driver.{p.stem}" for p in (ROOT / "dra_driver").iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").exists())
        and p.stem not in {"__init__", "playground"}}
    assert set(_contract("The product never imports the playground")["source_modules"]) == product


def test_lint_imports_fails_on_a_product_import_of_the_playground(tmp_path):
    # The contract can fail: the same configuration over a copy where the plugin imports the demo.
    import shutil

    for pkg in ("dra_driver", "kubeletplugin", "cdi"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("_native", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / "kubeletplugin" / "driver.py", "a") as f:
        f.write("\nfrom dra_driver.playground import demo  # noqa\n")
    lint = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
            "sys.exit(c())", "--no-cache"]
    broken = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "kubeletplugin.driver -> dra_driver.playground.demo" in broken.stdout
