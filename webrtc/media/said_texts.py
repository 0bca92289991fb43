"""Texts the edge asked the model to say (``response.say``), and whether the caller heard each.

The model's reply that says a text is told by its transcript, which is the text itself; it was
heard once its playback ended uncut. A refusal (the ``error`` naming the ``response.create``), a
reply that did not complete, a cut playback or the call's end settle it as not heard.
"""

from __future__ import annotations

import asyncio
import itertools

from duplex_agent.agent.protocol.events import ErrorEvent, ResponseDone, ResponseTranscriptDone, ServerEvent


class SaidTexts:
    def __init__(self) -> None:
        self._serial = itertools.count(1)
        self._asked: dict[str, tuple[str, asyncio.Future[bool]]] = {}  # event id -> (text, heard)
        self._replies: dict[str, asyncio.Future[bool]] = {}  # response id -> heard

    def ask(self, text: str) -> tuple[str, asyncio.Future[bool]]:
        """A new request's event id and the future its hearing settles."""
        event_id = f"say_{next(self._serial)}"
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._asked[event_id] = (text.strip(), future)
        return event_id, future

    def observe(self, event: ServerEvent) -> None:
        if isinstance(event, ResponseTranscriptDone):
            for event_id, (text, future) in list(self._asked.items()):
                if event.transcript.strip() == text:
                    del self._asked[event_id]
                    self._replies[event.response_id] = future
                    break
        elif isinstance(event, ResponseDone) and event.status != "completed":
            self._settle(self._replies.pop(event.response_id, None), False)
        elif isinstance(event, ErrorEvent):
            asked = self._asked.pop(str(event.error.get("event_id")), None)
            if asked is not None:
                self._settle(asked[1], False)

    def playback_ended(self, response_id: str, *, interrupted: bool) -> None:
        self._settle(self._replies.pop(response_id, None), not interrupted)

    def close(self) -> None:
        for future in [f for _, f in self._asked.values()] + list(self._replies.values()):
            self._settle(future, False)
        self._asked.clear()
        self._replies.clear()

    @staticmethod
    def _settle(future: asyncio.Future[bool] | None, heard: bool) -> None:
        if future is not None and not future.done():
            future.set_result(heard)
