"""LiveKit callers behind a link that loses 10 % of UDP both ways: every one hears the agent.

The loopback LiveKit server and a LiveKit worker (``duplex-agent start``, scripted model: a tone
for each reply) run in the worker's namespace; ten callers on the real livekit SDK, a room each,
in the caller's. At this loss the DTLS handshake of a caller's connection often takes seconds, and
a section negotiated meanwhile (the agent's track, subscribed as soon as it is published) must
still start sending once the connection is up. On the v0 signal path the server offers the
subscriber connection with its data channels alone and the agent's track comes in a second offer,
so that is the path this test takes; the v1 path is taken by the LiveKit benchmark of
``bench.lossy_network``.
"""

from __future__ import annotations

import pytest

from devtools.netem import ImpairedLink, Impairment
from devtools.netem.calls import livekit_callers, start_livekit

CALLS = 10
LOSS = Impairment(loss=0.10)
#: Loud agent audio a caller must hear for the call to count as heard (the callers' own bar).
HEARD_MS = 300


# A known fault (docs/performance.md, "Known faults"), kept running so that a fix shows as XPASS: under
# load one caller of ten now and then never hears the agent on this v0 path. The one such failure
# read since had its room given the agent's attributes before the agent (the callers' log shows the
# SDK's listener failing on them), a reordering in our FFI router that is fixed; whether it was the
# whole cause is not known.
@pytest.mark.xfail(reason="a LiveKit caller at 10 % loss now and then never hears the agent (v0 signalling, "
                          "a loaded machine); not wholly diagnosed", strict=False)
def test_ten_livekit_callers_at_10_percent_loss_all_hear_the_agent(tmp_path):
    with ImpairedLink(seed=42, to_worker=LOSS, to_caller=LOSS) as link, \
            open(tmp_path / "server.log", "w") as server_log, open(tmp_path / "worker.log", "w") as worker_log, \
            open(tmp_path / "callers.log", "w") as callers_log:
        url = start_livekit(link, server_log, worker_log, "--no-v1",
                            worker_flags=("--plugin", "scripted", "--max-sessions", str(CALLS)))
        # The callers stop as soon as each has heard the agent; the time is only a bound, and what
        # the known fault costs the suite when it shows.
        done = livekit_callers(link, url, 75, callers_log, "--until-heard", sessions=CALLS)
        counts = {direction: c.as_dict() for direction, c in link.counts().items()}
    callers = done["callers"]
    deaf = [(c["index"], c["error"], c["frames"], c["loud_ms"]) for c in callers if c["loud_ms"] < HEARD_MS]
    # The server's log names a subscriber its packets were held from (media_relay.HELD_WARNING).
    assert len(callers) == CALLS and not deaf, (deaf, counts, (tmp_path / "server.log").read_text()[-3000:])
    assert counts["to_caller"]["dropped"] > 0 and counts["to_worker"]["dropped"] > 0  # the loss was real
