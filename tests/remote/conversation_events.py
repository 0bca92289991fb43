"""Reading a conversation's events in a test: until the one it waits for."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from duplex_agent.agent.protocol import events as p


async def events_until(conversation, done: Callable[[p.ServerEvent], bool], seen: list[p.ServerEvent],
                       timeout: float = 15.0) -> p.ServerEvent:
    """The first event ``done`` accepts; every event read on the way is appended to ``seen``."""
    async def read() -> p.ServerEvent:
        async for event in conversation.events():
            seen.append(event)
            if done(event):
                return event
        raise AssertionError(f"the conversation ended; seen {[e.type for e in seen][-12:]}")
    return await asyncio.wait_for(read(), timeout)
