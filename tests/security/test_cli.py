"""The real ``duplex-agent`` process: --help shows no secrets, a reachable address without a key
warns loudly, TLS (self-signed) with a key works end to end, and no output holds the key.
Secrets go in through the environment only."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.security.conftest import new_key

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "duplex_agent.agent.app.cli"]
SECRET_VARIABLES = ("LIVEKIT_API_SECRET", "DUPLEX_OPENAI_API_KEY", "DUPLEX_BACKEND_API_KEY", "DUPLEX_API_KEY")


def secret_environment() -> dict[str, str]:
    return {**os.environ, **{name: new_key() for name in SECRET_VARIABLES}}


@pytest.mark.parametrize("command", [[], ["serve"], ["start"], ["dev"], ["token"]])
def test_help_prints_no_secret(command):
    env = secret_environment()
    shown = subprocess.run([*CLI, *command, "--help"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    output = shown.stdout + shown.stderr
    for name in SECRET_VARIABLES:
        assert env[name] not in output, f"--help shows {name}"
    if command == ["serve"]:
        assert "--api-key SECRET" in output and "--tls-self-signed" in output


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Worker:
    """``duplex-agent serve`` with the scripted model; stdout and stderr collected."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.args = [*CLI, "serve", "--plugin", "scripted", "--log-level", "DEBUG", *args]
        self.env = {**env, "HF_HUB_OFFLINE": "1"}
        self.output: list[str] = []

    async def __aenter__(self) -> Worker:
        self.process = await asyncio.create_subprocess_exec(
            *self.args, env=self.env, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        async with asyncio.timeout(90):
            while "is serving on" not in "".join(self.output):
                line = await self.process.stdout.readline()
                assert line, "the worker exited:\n" + "".join(self.output)
                self.output.append(line.decode(errors="replace"))
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        while line := await self.process.stdout.readline():
            self.output.append(line.decode(errors="replace"))

    async def __aexit__(self, *exc) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGINT)
        self.returncode = await asyncio.wait_for(self.process.wait(), 60)
        await self._reader

    def text(self) -> str:
        return "".join(self.output)


async def test_a_reachable_address_without_a_key_warns(free_port):
    env = {k: v for k, v in os.environ.items() if k != "DUPLEX_API_KEY"}
    async with Worker("--host", "0.0.0.0", "--port", str(free_port), env=env) as worker:
        pass
    assert worker.returncode == 0, worker.text()
    assert "WARNING: duplex-agent is serving 0.0.0.0 with NO API KEY" in worker.text()
    metrics_port = unused_port()
    async with Worker("--host", "0.0.0.0", "--port", str(free_port), "--allow-unauthenticated",
                      "--metrics-port", str(metrics_port), env=env) as quiet, aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as scraped:
            assert scraped.status == 200 and "duplex_sessions_active" in await scraped.text()
        async with http.get(f"http://127.0.0.1:{free_port}/metrics") as main_port:
            assert main_port.status == 404
    assert quiet.returncode == 0 and "NO API KEY" not in quiet.text()


async def test_tls_self_signed_with_a_key_end_to_end(free_port, tmp_path, host_address):
    env = {**secret_environment(), "DUPLEX_TLS_DIR": str(tmp_path / "tls")}
    key = env["DUPLEX_API_KEY"]
    async with Worker("--host", "0.0.0.0", "--port", str(free_port), "--tls-self-signed", env=env) as worker:
        printed = worker.text()
        assert f"https://{host_address}:{free_port}/" in printed
        assert "Your connection is not private" in printed and "NO API KEY" not in printed
        fingerprint = printed.split("SHA-256 fingerprint: ")[1].split()[0]
        token_run = subprocess.run([*CLI, "token", "--ttl", "60", "--tls-self-signed", "--host", host_address,
                                    "--port", str(free_port)], env=env, cwd=REPO, capture_output=True, text=True,
                                   timeout=60)
        token = token_run.stdout.split()[0]
        assert f"https://{host_address}:{free_port}/#token={token}" in token_run.stdout

        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # trusted by fingerprint below, as the phone's user does
        base = f"https://{host_address}:{free_port}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as http:
            async with http.get(base + "/") as page:
                assert page.status == 200
            # The certificate from a handshake of its own: a response whose body came whole with its
            # headers has already released its connection (page.connection is None under load).
            served = ssl.PEM_cert_to_DER_cert(await asyncio.to_thread(ssl.get_server_certificate,
                                                                      (host_address, free_port)))
            assert ":".join(f"{b:02X}" for b in hashlib.sha256(served).digest()) == fingerprint
            async with http.get(base + "/metrics", headers={"Authorization": f"Bearer {new_key()}"}) as refused:
                assert refused.status == 401
            async with http.get(base + "/metrics", headers={"Authorization": f"Bearer {key}"}) as allowed:
                assert allowed.status == 200
            url = base.replace("https", "wss") + "/v1/realtime?duplex=1"
            async with http.ws_connect(url, protocols=("realtime", f"openai-insecure-api-key.{token}")) as ws:
                await ws.send_str(json.dumps({"type": "session.update", "session": {}}))
                event = json.loads((await ws.receive(timeout=20)).data)
                assert event["type"] == "session.created"
                # Only session.close ends a session at once: a bare socket close would hold it (and the
                # worker's exit on SIGINT) for the 30 s resume grace.
                await ws.send_str(json.dumps({"type": "session.close"}))
                while event["type"] != "session.closed":
                    message = await ws.receive(timeout=20)
                    assert message.type == aiohttp.WSMsgType.TEXT, message
                    event = json.loads(message.data)
    assert worker.returncode == 0
    output = worker.text()
    assert "refused GET /metrics" in output  # the log names refusals...
    for name in SECRET_VARIABLES:
        assert env[name] not in output, f"the worker's output shows {name}"  # ...never the secrets
    assert token not in output


@pytest.mark.parametrize("flags, reason", [
    (["--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"], "No such file"),
    (["--tls-cert", "/nonexistent/cert.pem"], "--tls-cert needs --tls-key"),
])
def test_a_bad_certificate_stops_the_worker_before_it_loads_models(flags, reason):
    run = subprocess.run([*CLI, "serve", "--plugin", "reference", *flags], env=os.environ, cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and reason in run.stderr, run.stderr
    assert "loading" not in run.stderr
