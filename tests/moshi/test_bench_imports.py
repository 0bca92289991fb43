"""The Moshi bench runs on a GPU host with torch and a few pure-Python wheels: no WebRTC, LiveKit or HTTP stack."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import sys
from bench.moshi_batch import main
main(["--quick", "--max-batch", "2", "--steps", "3", "--warmup", "1"])
third_party = sorted({m.split(".")[0] for m in sys.modules if not m.startswith("_")} - set(sys.stdlib_module_names))
print("IMPORTED", ",".join(third_party))
"""
#: torch, numpy, moshi, and the pure-Python needs of the moshi modules the plugin uses (plus their own needs).
ALLOWED = {"bench", "duplex_agent", "numpy", "torch", "moshi", "einops", "safetensors", "sentencepiece",
           "huggingface_hub", "filelock", "fsspec", "packaging", "tqdm", "yaml", "typing_extensions", "requests",
           "urllib3", "idna", "certifi", "charset_normalizer", "httpx", "httpcore", "anyio", "sniffio", "h11",
           "hf_xet", "jinja2", "markupsafe", "sympy", "mpmath", "networkx", "shellingham", "typer", "click",
           "rich", "pygments", "markdown_it", "mdurl", "annotated_doc", "tomli", "setuptools", "pkg_resources",
           "distutils", "_distutils_hack", "mkl", "tbb", "triton", "google", "opt_einsum", "torchgen", "cython_runtime",
           "httpx2"}


def test_the_bench_runs_and_imports_nothing_of_the_serving_stack(tmp_path):
    # Its figures go to a folder of the test's, not over the committed bench/results.
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "BENCH_RESULTS": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "largest batch whose p99" in done.stdout or "no batch size stepped" in done.stdout
    imported = set(done.stdout.split("IMPORTED ", 1)[1].strip().split(","))
    assert not imported & {"aiortc", "livekit", "aiohttp", "av", "prometheus_client", "onnxruntime", "soxr"}
    assert imported <= ALLOWED, sorted(imported - ALLOWED)
    assert (tmp_path / "moshi_batch.json").exists()
