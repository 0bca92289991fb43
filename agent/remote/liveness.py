"""Whether a remote duplex server still answers, judged from what arrives on its socket.

A host that loses power, is partitioned away or is frozen sends no TCP reset: its socket looks
open until the kernel gives up, minutes later. So the client watches the socket itself. Any frame
from the server proves it alive; a reply streams frames anyway, and on a quiet socket a websocket
ping asks. The ping is answered by the server's websocket layer (aiohttp's reader on our
endpoint, uvicorn's protocol on vLLM-Omni's), not by its model, so a busy engine still answers it
and only a host that stopped running does not.

``HostLiveness`` is the rule alone, on a clock it is given: ``heard`` on every frame, then
``verdict`` says whether to probe, wait, or give the host up. A pause shorter than
``unresponsive_after_s - probe_after_s`` (a garbage collection, a scheduling hiccup) delays one
pong and is forgiven; silence for ``unresponsive_after_s`` is a host that is gone. The host is
never given up before a probe had that answer window: when this side's own loop stalls past
the probe's time, the silence it finds is its own, so the host is asked first.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class Verdict(enum.Enum):
    ALIVE = "alive"
    #: Quiet long enough that the host should be asked (a ping).
    PROBE = "probe"
    #: Nothing at all, not even the probe's answer, for ``unresponsive_after_s``.
    UNRESPONSIVE = "unresponsive"


class HostLiveness:
    def __init__(self, *, probe_after_s: float, unresponsive_after_s: float, clock: Callable[[], float]) -> None:
        if not 0 < probe_after_s < unresponsive_after_s:
            raise ValueError(f"probe_after_s ({probe_after_s}) must be above 0 and below unresponsive_after_s "
                             f"({unresponsive_after_s}), or the probe's answer has no time to arrive")
        self.probe_after_s = probe_after_s
        self.unresponsive_after_s = unresponsive_after_s
        self._clock = clock
        self._heard_at = clock()
        self._probed_at: float | None = None  # when a probe went out since the last frame heard

    @property
    def silent_s(self) -> float:
        """Seconds since the server last sent anything."""
        return self._clock() - self._heard_at

    def heard(self) -> None:
        """A frame arrived (an event, a pong, a ping, a close)."""
        self._heard_at = self._clock()
        self._probed_at = None

    @property
    def _answer_window_s(self) -> float:
        return self.unresponsive_after_s - self.probe_after_s

    def verdict(self) -> Verdict:
        """What the silence so far means; PROBE once per quiet spell (the caller sends it)."""
        now = self._clock()
        silent = now - self._heard_at
        if self._probed_at is None:
            if silent < self.probe_after_s:
                return Verdict.ALIVE
            self._probed_at = now
            return Verdict.PROBE
        if silent >= self.unresponsive_after_s and now - self._probed_at >= self._answer_window_s:
            return Verdict.UNRESPONSIVE
        return Verdict.ALIVE

    def next_check_in(self) -> float:
        """Seconds until the verdict can next change, if nothing arrives meanwhile."""
        now = self._clock()
        if self._probed_at is None:
            return max(0.0, self.probe_after_s - (now - self._heard_at))
        due = max(self._heard_at + self.unresponsive_after_s, self._probed_at + self._answer_window_s)
        return max(0.0, due - now)
