"""The third-party internals we lean on were checked against the versions installed and pinned."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from duplex_agent.webrtc.private_internals import CHECKED_VERSIONS

requirements = pytest.importorskip("packaging.requirements")

ROOT = Path(__file__).resolve().parents[2]


def pinned() -> dict[str, str]:
    """package -> its specifier, from every requirement list in pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found: dict[str, str] = {}
    for line in [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]:
        requirement = requirements.Requirement(line)
        found.setdefault(requirement.name.lower(), str(requirement.specifier))
    return found


@pytest.mark.parametrize("package", sorted(CHECKED_VERSIONS))
def test_the_pin_admits_the_checked_version_and_no_other_minor(package):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    specifier = SpecifierSet(pinned()[package])
    checked = Version(CHECKED_VERSIONS[package])
    assert checked in specifier
    next_minor = Version(f"{checked.major}.{checked.minor + 1}.0")
    assert next_minor not in specifier, f"{package} {specifier} admits {next_minor}, which nobody checked"


@pytest.mark.parametrize("package", sorted(CHECKED_VERSIONS))
def test_the_installed_version_is_the_checked_one(package):
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed here (an extra)")
    assert installed == CHECKED_VERSIONS[package]
