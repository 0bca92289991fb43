"""What the client knows of a remote server's responses: which one is speaking, their items,
and which ones this side stopped."""

from __future__ import annotations

from collections import OrderedDict

from duplex_agent.agent.protocol import events as p


class RecentIds:
    """A bounded set of response ids (the newest ``limit``)."""

    def __init__(self, limit: int = 256) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._limit = limit

    def add(self, key: str) -> None:
        self._ids[key] = None
        while len(self._ids) > self._limit:
            self._ids.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        return key in self._ids


class ServerResponses:
    """One conversation's responses as the server announced them and this side handled them."""

    def __init__(self) -> None:
        #: The response whose audio is arriving.
        self.speaking: str | None = None
        #: The latest response the server created.
        self.latest: str | None = None
        #: Responses the edge stopped: their late audio is dropped.
        self.cut = RecentIds()
        #: Responses this side ended: all their later events are dropped.
        self.ended_here = RecentIds()
        self._items: dict[str, str] = {}  # response -> item

    def created(self, event: p.ResponseCreated) -> None:
        self._items[event.response_id] = event.item_id
        self.latest = event.response_id
        if len(self._items) > 256:
            self._items.pop(next(iter(self._items)))

    def item_of(self, response_id: str) -> str | None:
        return self._items.get(response_id)

    def end_here(self, response_id: str) -> None:
        """This side ends the response (the server will not, or not in time)."""
        self.ended_here.add(response_id)
        if self.speaking == response_id:
            self.speaking = None
