"""The installed dependencies are inside the ranges pyproject.toml declares (the ranges CI tests)."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def test_every_installed_dependency_is_in_its_declared_range():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    outside = []
    for line in declared:
        requirement = Requirement(line)
        installed = version(requirement.name)
        if not requirement.specifier.contains(installed, prereleases=True):
            outside.append(f"{requirement.name} {installed} not in {requirement.specifier}")
    assert not outside, outside


def test_every_package_declares_its_type_hints():
    """PEP 561: type checkers read the packages' hints from an install only where a py.typed marker ships."""
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package in ("adaptive", "envs", "policies", "lab"):
        assert (ROOT / package / "py.typed").exists() and "py.typed" in shipped[package], package
