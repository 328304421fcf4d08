"""The packages form layers: ``adaptive`` (the decoding library) at the bottom, ``envs`` and ``policies``
beside each other on it, ``lab`` (training, evaluation, CLI) on top; imports flow one way, at module level."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {"adaptive": {"adaptive"}, "envs": {"adaptive", "envs"}, "policies": {"adaptive", "policies"}, "lab": {"adaptive", "envs", "policies", "lab"}}
LAZY = {"matplotlib", "matplotlib.pyplot", "wandb", "ray"}
"""Heavy or optional third-party imports that may load on first use (never a way around a cycle)."""


def _modules() -> list[Path]:
    return sorted(p for package in ALLOWED for p in (ROOT / package).rglob("*.py"))


def _imports(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node, node.module))
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_flow_down_the_layers_and_stay_at_module_level(path):
    package = path.relative_to(ROOT).parts[0]
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    for node, name in _imports(tree):
        first = name.split(".")[0]
        if first in ALLOWED:
            assert first in ALLOWED[package], f"{path.relative_to(ROOT)} ({package}) imports {name}: not allowed in this layer"
        assert id(node) in top_level or name in LAZY, f"{path.relative_to(ROOT)}:{node.lineno} imports {name} inside a function"


def test_the_decoding_api_does_not_pull_in_the_rl_stack():
    code = (
        "import sys; from adaptive import load_pair, SpeculativeDecoder, load_policy; "
        "assert not {'gymnasium', 'stable_baselines3', 'envs', 'policies', 'lab'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


@pytest.mark.parametrize("folder", ["benchmarks", "scripts"])
def test_no_folder_beside_the_scripts_shadows_a_package(folder):
    """A script run as ``python FOLDER/x.py`` has FOLDER first on its path: a subfolder there named like one of the
    packages (even without ``__init__.py``) would be imported in its place."""
    names = {p.name for p in (ROOT / folder).iterdir() if p.is_dir()}
    assert not names & set(ALLOWED), f"{folder}/ has a folder named like a package: {sorted(names & set(ALLOWED))}"
