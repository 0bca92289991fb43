"""A chat model (on tests.support.chat_stub's endpoint) that announces a hang-up, then makes it:
a long goodbye in words, then the ``hang_up`` call, as a real model streams content before its
tool calls."""

from __future__ import annotations

import re

from aiohttp import web

from tests.support.chat_stub import Handler, chunk, stream_reply, tool_call_chunks, tool_calling_reply

GOODBYE = ("Thank you for calling us today. I will end this call for you now, and I hope that "
           "you have a wonderful and restful evening with your family.")


def announcing_hang_up(seen: list[dict]) -> Handler:
    """Asked to hang up: the goodbye, then a ``hang_up`` call; anything else: the weather model."""
    weather = tool_calling_reply(seen)

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        last = (body.get("messages") or [{}])[-1]
        if last.get("role") != "user" or "hang up" not in str(last.get("content")).lower():
            return await weather(request)  # aiohttp keeps the body: it reads it again
        seen.append(body)
        chunks = [chunk(piece) for piece in re.findall(r"\s*\S+", GOODBYE)]
        chunks += tool_call_chunks(0, f"call_bye{len(seen)}", "hang_up", "{}")
        chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        return await stream_reply(request, chunks)

    return handler

