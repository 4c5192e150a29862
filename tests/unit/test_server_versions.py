"""app/server.py is written against one minor version of uvicorn and of websockets; this fails
loudly when the installed ones, or pyproject.toml's pins, are not those."""

from __future__ import annotations

import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from app.server import SUPPORTED_VERSIONS, unsupported_versions

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_installed_uvicorn_and_websockets_are_the_supported_ones() -> None:
    assert unsupported_versions() == {}, (
        f"installed {unsupported_versions()}, app/server.py supports {SUPPORTED_VERSIONS}: "
        "read their changes against app/server.py before moving SUPPORTED_VERSIONS"
    )


@pytest.mark.parametrize("name", sorted(SUPPORTED_VERSIONS))
def test_pyproject_pins_the_supported_minor_version(name: str) -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (requirement,) = [r for r in map(Requirement, dependencies) if r.name == name]
    major, minor = SUPPORTED_VERSIONS[name].split(".")
    assert requirement.specifier.contains(version(name)), requirement
    assert not requirement.specifier.contains(f"{major}.{int(minor) + 1}.0"), requirement
    assert not requirement.specifier.contains(f"{major}.{int(minor) - 1}.99"), requirement
