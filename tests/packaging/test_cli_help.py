"""A new user's first commands: what ``make run`` installs lets every subcommand start, each
subcommand's ``--help`` shows only its own options, and a third-party plugin's own option
appears in ``--help`` and reaches the plugin."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.packaging.import_graph import ROOT

CLI = [sys.executable, "-m", "duplex_agent.agent.app.cli"]
SUBCOMMANDS = ["serve", "start", "dev", "token"]


def help_text(*args: str, env: dict[str, str] | None = None) -> str:
    shown = subprocess.run([*CLI, *args, "--help"], cwd=ROOT, env=env or os.environ, capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def flags(text: str) -> set[str]:
    return set(re.findall(r"--[a-z][a-z0-9-]+", text))


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_installs_the_extras_start_and_dev_import():
    steps = subprocess.run(["make", "-n", "-B", "run", "VENV=/nonexistent/venv"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60, check=True).stdout
    (extras,) = re.findall(r"-e '\.\[([a-z,]+)\]'", steps)
    assert {"reference", "livekit"} <= set(extras.split(","))


@pytest.mark.slow
@pytest.mark.parametrize("command", [[], *([name] for name in SUBCOMMANDS)])
def test_every_subcommand_help_from_a_fresh_install(installed, tmp_path, command):
    """The wheel in a venv of its own, run outside the repository: help exits 0 and prints nothing on stderr."""
    shown = subprocess.run([str(installed / "bin" / "duplex-agent"), *command, "--help"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stderr == "", shown.stderr
    assert "usage: duplex-agent" in shown.stdout


@pytest.mark.slow
def test_start_and_dev_import_cleanly_from_a_fresh_install(installed, tmp_path):
    """What `start` and `dev` import once past --help (the LiveKit worker), with the extras `make run` installs."""
    loaded = subprocess.run([str(installed / "bin" / "python"), "-W", "error::DeprecationWarning", "-c",
                             "import duplex_agent.agent.app.livekit_worker"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert loaded.returncode == 0 and "Traceback" not in loaded.stderr, loaded.stderr


def test_serve_shows_no_livekit_option_and_token_no_model_option():
    serve, start, token = help_text("serve"), help_text("start"), help_text("token")
    livekit = {"--livekit-url", "--livekit-api-key", "--livekit-api-secret", "--agent-name"}
    model = {"--plugin", "--backend", "--max-sessions", "--responder", "--openai-model", "--moshi-config", "--device"}
    assert livekit <= flags(start) and not livekit & flags(serve)
    assert {"--plugin", "--responder"} <= flags(serve) and not model & flags(token)
    assert {"--ttl", "--api-key", "--host"} <= flags(token)
    assert "--ice-address" not in flags(start)  # start serves no direct WebRTC peer


def test_help_names_the_choices_and_what_they_mean():
    serve = " ".join(help_text("serve").split())
    assert all(name in serve for name in ("reference", "scripted", "moshi"))
    assert "--responder {echo,openai}" in serve
    moshi = " ".join(help_text("serve", "--plugin", "moshi").split())
    assert "tiny: a small model with random weights" in moshi and "--responder" not in moshi
    token = " ".join(help_text("token").split())
    assert "--ttl TTL seconds this token opens sessions for" in token


def test_a_bad_plugin_path_is_one_line_and_exit_2():
    run = subprocess.run([*CLI, "serve", "--plugin", "no_such_package.Plugin"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "cannot load the plugin 'no_such_package.Plugin'" in run.stderr


THIRD_PARTY_PLUGIN = '''
from dataclasses import dataclass

from duplex_agent.plugins.contract import option
from duplex_agent.plugins.scripted import ScriptedPlugin


@dataclass
class GreeterOptions:
    greeting: str = option("hello", "the first words the greeter says")


class GreeterPlugin(ScriptedPlugin):
    options_type = GreeterOptions

    def configure(self, options, *, max_sessions):
        print(f"greeter configured: greeting={options.greeting!r} max_sessions={max_sessions}", flush=True)
'''


def test_a_third_party_plugin_declares_an_option_that_reaches_it(tmp_path, free_port):
    (tmp_path / "greeter.py").write_text(textwrap.dedent(THIRD_PARTY_PLUGIN))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    shown = " ".join(help_text("serve", "--plugin", "greeter.GreeterPlugin", env=env).split())
    assert "model: the options of --plugin greeter.GreeterPlugin" in shown
    assert "--greeting GREETING the first words the greeter says; env DUPLEX_GREETING; default: hello" in shown
    assert "--greeting" not in help_text("serve", env=env)

    worker = subprocess.Popen([*CLI, "serve", "--plugin", "greeter.GreeterPlugin", "--greeting", "good evening",
                               "--max-sessions", "2", "--port", str(free_port)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in worker.stdout:
            lines.append(line)
            if "is serving on" in line:
                break
    finally:
        worker.send_signal(signal.SIGINT)
        rest, _ = worker.communicate(timeout=60)
    output = "".join(lines) + rest
    assert "greeter configured: greeting='good evening' max_sessions=2" in output, output
    assert worker.returncode == 0, output


@pytest.mark.parametrize("command", ["start", "dev"])
def test_start_without_the_livekit_extra_names_the_install_command(command):
    """A venv without the livekit packages (pip install duplex-agent, no extra): one line, exit 2."""
    code = ("import sys; sys.modules['livekit'] = None; from duplex_agent.agent.app.cli import main; "
            f"sys.exit(main(['{command}', '--plugin', 'scripted']))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    (line,) = [text for text in run.stderr.splitlines() if text.startswith("duplex-agent:")]
    assert f"{command} needs the livekit extra" in line and "pip install 'duplex-agent[livekit]'" in line


CLASHING_PLUGIN = '''
from dataclasses import dataclass

from duplex_agent.plugins.contract import option
from duplex_agent.plugins.scripted import ScriptedPlugin


@dataclass
class ClashingOptions:
    {name}: int = option(2, "an option named like one of the worker's")


class ClashingPlugin(ScriptedPlugin):
    options_type = ClashingOptions
'''


@pytest.mark.parametrize("name, kept", [("max_sessions", "the worker setting max_sessions (--max-sessions)"),
                                        ("help", "a name the command line keeps for itself (--help)"),
                                        ("command", "a name the command line keeps for itself (--command)")])
def test_a_plugin_option_named_like_a_worker_setting_is_named_in_one_line(tmp_path, name, kept):
    """argparse refused a second --max-sessions or --help with a traceback, --help included; --command took
    the subcommand's place in the parsed arguments."""
    (tmp_path / "clashing.py").write_text(CLASHING_PLUGIN.format(name=name))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    reason = (f"the plugin 'clashing.ClashingPlugin' declares an option {name!r} in ClashingOptions, but that is "
              f"{kept}: the plugin must give its option another name")
    shown = " ".join(help_text("serve", "--plugin", "clashing.ClashingPlugin", env={**env, "COLUMNS": "400"}).split())
    assert f"note: {reason}" in shown  # wide: argparse would wrap the note at the hyphen of --max-sessions
    run = subprocess.run([*CLI, "serve", "--plugin", "clashing.ClashingPlugin"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip() == f"duplex-agent: {reason}"
