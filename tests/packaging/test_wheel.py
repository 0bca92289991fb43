"""The wheel: one top-level name, a working CLI, the page's LiveKit bundle, and no
shadowing by a user's own ``agent.py``."""

from __future__ import annotations

import os
import subprocess
import urllib.request
import zipfile

import pytest

from tests.packaging.import_graph import ROOT

pytestmark = pytest.mark.slow
BUNDLE = ROOT / "frontend" / "vendor" / "livekit-client.umd.js"


def test_only_top_level_name_is_duplex_agent(wheel):
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist() if not name.split("/")[0].endswith(".dist-info")}
        entry_points = next(archive.read(n).decode() for n in archive.namelist() if n.endswith("entry_points.txt"))
    assert tops == {"duplex_agent"}
    assert "duplex-agent = duplex_agent.agent.app.cli:main" in entry_points


def test_cli_help_from_the_wheel(installed, tmp_path):
    result = subprocess.run([str(installed / "bin" / "duplex-agent"), "--help"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout and "start" in result.stdout


@pytest.mark.skipif(not BUNDLE.is_file(), reason="livekit-client bundle missing (npm ci --prefix frontend)")
def test_installed_worker_serves_page_and_bundle_beside_a_users_agent_py(installed, tmp_path, free_port):
    """LiveKit's quickstart names its file agent.py; ours must still start beside it."""
    (tmp_path / "agent.py").write_text("raise SystemExit('the user agent.py was imported')\n")
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "__init__.py").write_text("raise SystemExit('the user plugins/ was imported')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([str(installed / "bin" / "duplex-agent"), "serve", "--plugin", "scripted",
                             "--port", str(free_port)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:  # the worker prints this once it listens
            if "is serving on" in line:
                break
        else:
            pytest.fail(f"worker exited with {proc.wait()}")
        base = f"http://127.0.0.1:{free_port}"
        with urllib.request.urlopen(base + "/vendor/livekit-client.umd.js", timeout=10) as response:
            assert response.status == 200 and len(response.read()) == BUNDLE.stat().st_size
        with urllib.request.urlopen(base + "/", timeout=10) as response:
            assert b"<html" in response.read().lower()
        with urllib.request.urlopen(base + "/favicon.ico", timeout=10) as response:  # no 404 in the console
            assert response.status == 200 and b"<svg" in response.read()
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
