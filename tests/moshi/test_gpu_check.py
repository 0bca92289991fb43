"""The GPU check (bench/gpu_check.sh) works the first time a GPU machine is lent.

- Its dry run: the same script on the CPU with the tiny config, this checkout's venv (no wheel
  install), small batches and two rounds of real-time websocket sessions, prints every figure's line.
- What it installs there: bench/gpu-requirements*.txt name every distribution the bench and
  ``duplex-agent serve --no-webrtc`` import beyond the host's torch and numpy (it installs with
  --no-deps), and, where ``make gpu-wheels`` has filled gpu-wheels/, those wheels resolve offline for
  each Python it targets and fit in what a device run carries.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu_check.sh"
REQUIREMENTS = [REPO / "bench" / "gpu-requirements.txt", REPO / "bench" / "gpu-requirements-vad.txt"]
WHEELS = REPO / "gpu-wheels"
#: What a device run carries: the tracked tree plus the carried paths.
CARRY_LIMIT = 64 * 2**20
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64"]


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.slow
def test_the_dry_run_prints_the_batch_and_load_figures(tmp_path):
    pytest.importorskip("moshi")
    pytest.importorskip("livekit.local_inference")
    done = subprocess.run(
        ["bash", str(SCRIPT), "--no-install", "--python", sys.executable, "--device", "cpu", "--tiny",
         "--max-batch", "2", "--steps", "3", "--sessions", "1,2", "--seconds", "2"],
        capture_output=True, text=True, timeout=600, env=dict(_env(), OUT=str(tmp_path)), cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    # The batch bench: one line per batch size, then its verdict.
    assert re.search(r"^batch +1: step p50 +[\d.]+ ms +p99 +[\d.]+ ms", out, re.M), out
    assert re.search(r"^batch +2: step p50", out, re.M), out
    assert "largest batch whose p99" in out or "no batch size stepped" in out
    # The server came up and both load rounds ran with every session streaming and hearing audio.
    assert "server up" in out, out[-3000:]
    rounds = [json.loads(line) for line in (tmp_path / "realtime_load.jsonl").read_text().splitlines()]
    assert [r["sessions"] for r in rounds] == [1, 2]
    for r in rounds:
        assert r["failed"] == [], r
        assert r["frames_sent"] + r["sends_dropped"] == r["sessions"] * 25, r  # 2 s of 80 ms frames each
        assert r["audio_frames_received"] > 0, r
        assert r["server_error_events"] == 0, r
    assert re.search(r"^N=  2: sent \d+ frames .* frame overruns \+\d+", out, re.M), out
    # Everything is also under $OUT, and the summary repeats the figures at the end.
    assert {"gpu_check.log", "moshi_batch.txt", "realtime_load.txt", "serve.log"} <= {p.name for p in tmp_path.iterdir()}
    summary = out.split("== summary", 1)[1]
    assert "batch    1:" in summary and "N=  1:" in summary


PROBE = r"""
import importlib.metadata as md, json, os, sys
from pathlib import Path
import bench.moshi_batch, bench.realtime_load
import duplex_agent.agent.app.cli
from duplex_agent.agent.app.bootstrap import build_backend
from duplex_agent.agent.app.server import build_app
from duplex_agent.agent.app.settings import Settings
from duplex_agent.plugins.moshi.plugin import MoshiOptions
settings = Settings(plugin="moshi", max_sessions=1, webrtc=False,
                    plugin_options=MoshiOptions(moshi_config="tiny", device="cpu"))
build_app(build_backend(settings), settings, with_webrtc=settings.webrtc)
owner = {}
for dist in md.distributions():
    name, base = dist.metadata["Name"], Path(dist.locate_file("")).resolve()
    for f in dist.files or []:
        if f.suffix in (".py", ".so") or ".so" in f.name:
            owner[os.path.normpath(base / f)] = name
used = set()
for module in list(sys.modules.values()):
    path = getattr(module, "__file__", None)
    if path and str(Path(path).resolve()) in owner:
        used.add(owner[str(Path(path).resolve())])
print("DISTS " + json.dumps(sorted(used)))
"""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names() -> set[str]:
    names = set()
    for path in REQUIREMENTS:
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                names.add(_normal(re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0]))
    return names


def test_the_requirements_name_every_distribution_the_check_imports():
    pytest.importorskip("moshi")
    pytest.importorskip("livekit.local_inference")
    import importlib.metadata as md

    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600, env=_env(),
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    used = {_normal(d) for d in json.loads(done.stdout.split("DISTS ", 1)[1])}
    # The host brings torch (with its own needs) and numpy; this project goes in as its own wheel.
    host = {"torch", "numpy", "duplex-agent"} | {_normal(re.split(r"[=<>!~;\[ ]", r, maxsplit=1)[0])
                                                for r in md.requires("torch") or [] if "extra ==" not in r}
    # huggingface-hub is pinned to the release moshi takes (0.36.2, needs: requests...); this venv
    # may hold a newer one with other needs, which the GPU host never sees.
    if md.version("huggingface-hub") != "0.36.2":
        host |= {_normal(re.split(r"[=<>!~;\[ ]", r, maxsplit=1)[0]) for r in md.requires("huggingface-hub") or []
                 if "extra ==" not in r}
    missing = used - _requirement_names() - host
    assert not missing, f"imported by the GPU check but not in bench/gpu-requirements*.txt: {sorted(missing)}"
    assert not used & {"aiortc", "av", "livekit-api", "livekit", "onnxruntime", "cryptography"}, sorted(used)


def _resolves(python: str, requirements: list[Path], target: Path) -> subprocess.CompletedProcess[str]:
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    files = [arg for r in requirements for arg in ("-r", str(r))]
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--no-index", "--no-deps",
         "--find-links", str(WHEELS), "--only-binary=:all:", "--implementation", "cp", "--python-version", python,
         *platforms, "--target", str(target), *files],
        capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not WHEELS.is_dir(), reason="no gpu-wheels/ here (make gpu-wheels downloads it; tests never do)")
def test_the_carried_wheels_resolve_offline_and_fit_in_a_device_run(tmp_path):
    for python in ("3.11", "3.12"):
        done = _resolves(python, REQUIREMENTS[:1], tmp_path / python)
        assert done.returncode == 0, f"Python {python}: {done.stderr[-2000:]}"
    # The Silero VAD wheel is taken for one Python (GPU_SERVE_PYTHON): the serve stage needs it there.
    assert any(_resolves(p, REQUIREMENTS[1:], tmp_path / f"vad{p}").returncode == 0 for p in ("3.11", "3.12"))
    tracked = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=REPO, check=True).stdout
    tree = sum((REPO / p).stat().st_size for p in tracked.decode().split("\0") if p and (REPO / p).is_file())
    wheels = sum(p.stat().st_size for p in WHEELS.iterdir())
    assert tree + wheels <= CARRY_LIMIT, f"tree {tree / 2**20:.1f} MiB + wheels {wheels / 2**20:.1f} MiB"
