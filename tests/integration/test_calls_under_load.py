"""Four direct calls beside three CPU hogs for a minute: no call ends, every turn gets a reply, barge-in holds.

The worker (``serve``, the scripted model with a four-second reply to each turn) and the four callers
(``bench.livekit_callers --transport direct``: a question, ~300 ms of the reply heard, an interruption
running on into the next question, and so on) are processes of their own beside the hogs, so the
scheduler starves every loop, the callers' as much as the worker's. The callers keep ICE consent as a
browser does (RFC 7675's 30 s); the worker's is ``webrtc.direct.ice_consent``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

from bench.call_rig import write_speech
from tests.integration.long_reply import REPLY_MS
from tests.serve_process import REPO, ServeProcess, environment
from tests.support.waits import until

CALLS = 4
HOGS = int(os.environ.get("TEST_HOGS", "3"))
SOAK_S = 60.0
#: Reasons a call can end for on the worker's side that this test must not see.
ENDINGS = ("consent_expired", "consent_revoked", "media_timeout")


def errors_counted(metrics: str, code: str) -> float:
    match = re.search(rf'^duplex_errors_total\{{code="{code}"\}} (\S+)$', metrics, re.M)
    return float(match[1]) if match else 0.0


async def test_four_direct_calls_beside_three_cpu_hogs_for_a_minute(tmp_path):
    speech = tmp_path / "speech.npz"
    await asyncio.to_thread(write_speech, str(speech))  # Piper's work done before the hogs start
    worker = ServeProcess(tmp_path / "worker.log", "--plugin", "tests.integration.long_reply.LongReplyPlugin",
                          "--max-sessions", str(2 * CALLS))
    hogs: list[subprocess.Popen] = []
    lines: list[dict] = []
    callers_log = (tmp_path / "callers.log").open("w")
    callers = None
    reader: asyncio.Task | None = None
    try:
        worker.start()
        await worker.ready()
        callers = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.livekit_callers", "--transport", "direct", "--url", worker.http,
            "--sessions", str(CALLS), "--seconds", str(SOAK_S + 600), "--speech", str(speech),
            "--reply-ms", str(REPLY_MS),
            cwd=REPO, env=environment(), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=callers_log)

        async def read() -> None:
            assert callers is not None and callers.stdout is not None
            while line := await callers.stdout.readline():
                if line.startswith(b"{"):
                    lines.append(json.loads(line))

        reader = asyncio.create_task(read())
        await until(lambda: any(e.get("event") in ("ready", "not_ready") for e in lines), 120,
                    "the callers to connect and hear the agent")
        assert lines[0]["event"] == "ready", (lines[0], worker.report())
        hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(HOGS)]
        load_before = os.getloadavg()[0]
        await asyncio.sleep(SOAK_S)  # the soak itself: the minute is what is tested, not a wait for a signal
        print(f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} with {HOGS} hogs")
        health, metrics = await worker.health(), await worker.metrics()
        assert health is not None and health["sessions"] == CALLS, (health, worker.report())
        assert {code: errors_counted(metrics, code) for code in ENDINGS} == dict.fromkeys(ENDINGS, 0.0)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        if callers is not None and callers.stdin is not None:
            callers.stdin.close()  # the callers hang up
        if callers is not None:
            try:
                await asyncio.wait_for(callers.wait(), 120)
            except TimeoutError:
                callers.kill()
                await callers.wait()
        await worker.stop()
        callers_log.close()
    assert reader is not None
    await reader
    done = [e for e in lines if e.get("event") == "done"]
    assert done, (lines[-3:], worker.report())
    for caller in done[0]["callers"]:
        print({k: caller[k] for k in ("index", "attempts", "no_reply", "played_out", "missed", "heard_stop_ms", "reply_after_ms")})
        assert caller["error"] is None and caller["dropped"] is None, caller  # the call lasted the minute
        assert caller["no_reply"] == 0, caller  # every turn got its reply
        assert caller["attempts"] >= 3, caller
        # Barge-in holds: no reply talked over played to its end, and each interruption was heard to stop the
        # agent within 3 s or, where the caller did not hear the quiet (the next reply can start at once on
        # a starved machine), the worker said it cut the reply. The last may have been cut short by the hang-up.
        assert caller["played_out"] == 0, caller
        assert all(miss["cut_ms"] is not None for miss in caller["missed"]), caller
        assert len(caller["heard_stop_ms"]) + len(caller["missed"]) >= caller["attempts"] - 1, caller
