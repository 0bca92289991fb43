"""The wheel built from this tree, and a fresh venv holding only it (shared by the packaging tests)."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from tests.packaging.import_graph import ROOT


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
                   check=True, cwd=out)
    (built,) = out.glob("duplex_agent-*.whl")
    return built


@pytest.fixture(scope="session")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv holding only the wheel; its dependencies come from this venv's site-packages
    through a path file (a plain path line: the project's editable finder is not loaded)."""
    env_dir = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    fresh_python = env_dir / "bin" / "python"
    site = subprocess.run([str(fresh_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    deps = subprocess.run([sys.executable, "-c", "import aiohttp, os; print(os.path.dirname(os.path.dirname(aiohttp.__file__)))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(deps + "\n")
    entry = env_dir / "bin" / "duplex-agent"
    entry.write_text(f"#!{fresh_python}\nimport sys\nfrom duplex_agent.agent.app.cli import main\nsys.exit(main())\n")
    entry.chmod(0o755)
    return env_dir
