"""``--max-cpu`` outside 0-1 stops serve and start at once: one line, exit 2, no model loaded."""

from __future__ import annotations

import pytest

from tests.packaging.test_cli_backend import the_error
from tests.packaging.test_cli_responder import run_cli


@pytest.mark.parametrize("command", ["serve", "start"])
@pytest.mark.parametrize("value", ["1.5", "-0.2"])
def test_a_share_outside_0_to_1_is_one_line_and_exit_2(command, value):
    run = run_cli([command, "--max-cpu", value])
    assert the_error(run) == f"duplex-agent: --max-cpu must be a share between 0 (off) and 1, not {float(value)!r}"
    assert "loading Whisper" not in run.stderr and "loading Silero" not in run.stderr, run.stderr
