"""Whether the caller heard what the agent said before a function call.

A turn's replies are the responses the model made since the caller last stopped speaking; a call
(a response of its own) comes after some of them ("I'll transfer you now"). Those words were
heard once each such reply has played to its end, or ended without a sound; they were talked
over if any of them was cut short (a barge-in, a cancel), which the call path reports as an
interrupted playback end.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

#: Replies remembered: far more than one turn ever makes. One forgotten counts as heard (it is
#: long over).
REPLIES_KEPT = 64


@dataclass(slots=True)
class _Reply:
    sounding: bool = False  # some of its audio came
    done: bool = False  # the model has finished it
    ended: str | None = None  # "heard" or "cut": its playback is over

    @property
    def settled(self) -> bool:
        return self.ended is not None or (self.done and not self.sounding)


class HeardTracker:
    def __init__(self) -> None:
        self._replies: OrderedDict[str, _Reply] = OrderedDict()
        self._turn: list[str] = []  # this turn's replies, in order
        self._before: OrderedDict[str, tuple[str, ...]] = OrderedDict()  # reply -> the turn's replies before it
        self._waiters: list[tuple[tuple[str, ...], asyncio.Future[bool]]] = []

    # ---- what happens ----

    def new_turn(self) -> None:
        """The caller stopped speaking: the model's next replies answer them."""
        self._turn = []

    def response_created(self, response_id: str) -> None:
        self._before[response_id] = tuple(self._turn)
        self._turn.append(response_id)
        self._replies[response_id] = _Reply()
        for kept in (self._before, self._replies):
            while len(kept) > REPLIES_KEPT:
                kept.popitem(last=False)
        del self._turn[:-REPLIES_KEPT]

    def audio(self, response_id: str) -> None:
        reply = self._replies.get(response_id)
        if reply is not None:
            reply.sounding = True

    def response_done(self, response_id: str) -> None:
        reply = self._replies.get(response_id)
        if reply is not None:
            reply.done = True
            self._settle_waiters()

    def playback_ended(self, response_id: str, *, interrupted: bool) -> None:
        reply = self._replies.get(response_id)
        if reply is not None and reply.ended is None:
            reply.ended = "cut" if interrupted else "heard"
            self._settle_waiters()

    # ---- what a call waits for ----

    def before(self, response_id: str | None) -> tuple[str, ...]:
        """The replies of the turn that came before ``response_id`` (a call's own response); for a
        call whose response was never announced, those of the turn so far."""
        if response_id is not None and response_id in self._before:
            return self._before[response_id]
        return tuple(self._turn)

    def verdict(self, replies: tuple[str, ...]) -> bool | None:
        """True: all of ``replies`` heard; False: one was cut short; None: not known yet."""
        states = [self._replies[r] for r in replies if r in self._replies]
        if any(reply.ended == "cut" for reply in states):
            return False
        return True if all(reply.settled for reply in states) else None

    async def heard(self, replies: tuple[str, ...]) -> bool:
        """Waits until ``replies`` are heard (True) or one of them is cut short (False)."""
        known = self.verdict(replies)
        if known is not None:
            return known
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append((replies, future))
        try:
            return await future
        finally:
            self._waiters = [(r, f) for r, f in self._waiters if f is not future]

    def _settle_waiters(self) -> None:
        for replies, future in self._waiters:
            known = self.verdict(replies)
            if known is not None and not future.done():
                future.set_result(known)
