"""``--responder openai``: a missing or malformed ``--openai-base-url`` stops the worker at start with
one line and exit 2, before any model loads (before: it started without a word, and every reply failed);
an endpoint it cannot reach is a warning at start, and the worker serves anyway."""

from __future__ import annotations

import subprocess

import pytest

from tests.packaging.test_cli_backend import CLI, LIVEKIT, the_error
from tests.serve_process import REPO, ServeProcess, environment
from tests.support.ports import refused_port

EXAMPLE = "the address of an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1"
MISSING = f"duplex-agent: --responder openai needs --openai-base-url (or DUPLEX_OPENAI_BASE_URL): {EXAMPLE}"


def run_cli(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=REPO, env=environment(**LIVEKIT, **env), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("args, env, line", [
    (["serve", "--responder", "openai", "--openai-model", "m"], {}, MISSING),
    (["serve"], {"DUPLEX_RESPONDER": "openai"}, MISSING),
    (["serve", "--responder", "openai", "--openai-base-url", " "], {}, MISSING),
    (["start", "--responder", "openai"], {}, MISSING),
    (["serve", "--responder", "openai", "--openai-base-url", "127.0.0.1:8000/v1"], {},
     f"duplex-agent: --openai-base-url '127.0.0.1:8000/v1' is not an http:// or https:// URL: {EXAMPLE}"),
], ids=["serve flag", "serve environment", "blank", "start", "no scheme"])
def test_a_missing_or_malformed_base_url_is_one_line_and_exit_2_before_models_load(args, env, line):
    run = run_cli(args, **env)
    assert the_error(run) == line
    assert "loading Whisper" not in run.stderr and "loading Silero" not in run.stderr, run.stderr


async def test_an_endpoint_nothing_listens_on_is_a_warning_and_the_worker_serves(tmp_path):
    with refused_port() as port:
        address = f"http://127.0.0.1:{port}/v1"
        worker = ServeProcess(tmp_path / "serve.log", "--responder", "openai", "--openai-base-url", address,
                              "--openai-model", "m", env=environment(DUPLEX_OPENAI_API_KEY="sk-secret-123"))
        try:
            await worker.start().ready()
        finally:
            code = await worker.stop()
    assert code == 0, worker.report()
    warning = (f"WARNING duplex_agent.models: the language model at {address} cannot be reached: the connection "
               "was refused (is the server running, on that port?); starting anyway, and replies fail until that "
               "changes")
    assert warning in worker.log(), worker.report()
    assert "sk-secret-123" not in worker.log() and "Traceback" not in worker.log()
