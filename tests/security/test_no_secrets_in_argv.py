"""No test, benchmark or tool starts a process with a secret on its command line (``ps`` shows argv
to every user of the machine): secrets go through the environment. Read from the source."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECRET_FLAGS = {"--api-key", "--api-secret", "--livekit-api-secret", "--backend-api-key", "--openai-api-key"}


def secret_flags_in_argv(path: Path) -> list[str]:
    """Secret flags written as elements of a list or tuple literal (an argv), with their line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.List | ast.Tuple):
            found += [f"{path.relative_to(ROOT)}:{e.lineno} {e.value}" for e in node.elts
                      if isinstance(e, ast.Constant) and e.value in SECRET_FLAGS]
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "create_subprocess_exec", "Popen", "run"):
            found += [f"{path.relative_to(ROOT)}:{a.lineno} {a.value}" for a in node.args
                      if isinstance(a, ast.Constant) and a.value in SECRET_FLAGS]
    return found


def test_the_scan_finds_a_secret_in_argv(tmp_path):
    sample = ROOT / "tests" / "security" / "_argv_sample.py"
    try:
        sample.write_text('import subprocess\nsubprocess.run(["duplex-agent", "--api-key", KEY])\n'
                          'asyncio.create_subprocess_exec("x", "--livekit-api-secret", S)\n')
        assert len(secret_flags_in_argv(sample)) == 2
    finally:
        sample.unlink()


def test_no_process_gets_a_secret_in_its_arguments():
    files = [p for folder in ("tests", "bench", "devtools") for p in (ROOT / folder).rglob("*.py")]
    assert [hit for path in files for hit in secret_flags_in_argv(path)] == []
