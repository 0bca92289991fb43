"""A real local OpenAI-compatible chat endpoint for tests: an aiohttp server on a loopback port whose
``POST /v1/chat/completions`` is the test's handler (streamed replies, errors, whatever it needs).

``tool_calling_reply`` stands in for a chat model that calls tools (no OpenAI-compatible server
that runs a real model can be installed here: llama-cpp-python ships only as a source build).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def sse(obj: object) -> bytes:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj)}\n\n".encode()


def chunk(content: str) -> dict:
    """A chat-completion stream chunk whose delta says ``content``."""
    return {"choices": [{"index": 0, "delta": {"content": content}}]}


def streaming_reply(pieces: list[str], seen: list[dict] | None = None) -> Handler:
    """A handler that streams ``pieces`` as deltas, then ``[DONE]``; each request's JSON body goes to ``seen``."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if seen is not None:
            seen.append(body)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            await response.write(sse(chunk(piece)))
        await response.write(b"data: [DONE]\n\n")
        return response

    return handler


async def start_server(handler: Handler, *, models: Handler | None = None) -> tuple[web.AppRunner, str]:
    """The server, started on a free loopback port, and its base URL (``http://127.0.0.1:PORT/v1``);
    ``models`` answers ``GET /v1/models`` (else it is a 404, which is an answer too)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    if models is not None:
        app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}/v1"


def tool_call_chunks(index: int, call_id: str, name: str, arguments: str, *, piece: int = 4) -> list[dict]:
    """Stream chunks that make one tool call as OpenAI streams it: the id and name first, then the
    arguments ``piece`` characters at a time, each under the call's ``index``."""
    def delta(call: dict) -> dict:
        return {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": index, **call}]}}]}

    chunks = [delta({"id": call_id, "type": "function", "function": {"name": name, "arguments": ""}})]
    chunks += [delta({"function": {"arguments": arguments[at:at + piece]}}) for at in range(0, len(arguments), piece)]
    return chunks


async def stream_reply(request: web.Request, chunks: list[dict]) -> web.StreamResponse:
    """``chunks`` as a chat endpoint streams them: server-sent events, then ``[DONE]``."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for piece in chunks:
        await response.write(sse(piece))
    await response.write(b"data: [DONE]\n\n")
    return response


def weather_cities(text: str) -> list[str]:
    """The places a question asks the weather of ("... weather in Paris and Rome?" -> Paris, Rome)."""
    found = re.search(r"\bin\s+(.+?)[\s?.!]*$", text, re.IGNORECASE)
    if found is None:
        return ["Paris"]
    places = re.split(r",\s*|\s+and\s+", found.group(1))
    return [place.strip(" ?.!").title() for place in places if place.strip(" ?.!")] or ["Paris"]


def asks_about_a_place(text: str) -> bool:
    """The weather, or a question that ends in a place, as a model with a weather tool would take it."""
    return "weather" in text.lower() or re.search(r"\bin\s+[A-Z][a-z]+[\s?.!]*$", text.strip()) is not None


#: What the stub says before each call-control call, as a model told to announce them would.
TRANSFER_ANNOUNCEMENT = "I will transfer you to a person now, please hold."
GOODBYE = "Thank you for calling. Have a nice day!"


def asks_for_a_person(text: str) -> bool:
    return re.search(r"\b(a person|a human|someone|somebody|an agent|a representative)\b", text, re.IGNORECASE) is not None


def says_goodbye(text: str) -> bool:
    return re.search(r"\b(that's all|that is all|thanks|thank you|goodbye|bye)\b", text, re.IGNORECASE) is not None


def callers_words(messages: list[dict]) -> str:
    """What the caller said since the agent last said something they heard: a model answers all
    of it, a request whose answer was cut short before a word of it was heard included."""
    said: list[str] = []
    for message in reversed(messages):
        if message.get("role") == "assistant" and message.get("content"):
            break
        if message.get("role") == "user":
            said.insert(0, str(message.get("content") or ""))
    return " ".join(said)


def tool_calling_reply(seen: list[dict] | None = None, *, transfer_to: str = "+15558880000") -> Handler:
    """A chat model that calls tools when it is given them, as a real one would, by rule:

    - a ``tool`` message last: a text answer that carries the tool outputs ("The tool says: ...");
    - ``tool_choice`` naming a function, or ``required``: a call of that function (else the first tool);
    - a question about the weather, or about a place ("... in Paris?": a recogniser may mishear
      "weather"), with a ``get_weather`` tool (and ``tool_choice`` not ``none``): one ``get_weather``
      call per place asked of, ``{"city": ...}``, arguments in pieces;
    - asking for a person with a ``transfer_call`` tool: ``TRANSFER_ANNOUNCEMENT`` and, in the same
      reply, a ``transfer_call`` to ``transfer_to``;
    - "that's all" or a goodbye with an ``end_call`` tool: ``GOODBYE`` and an ``end_call`` call;
    - anything else: a text answer saying what it heard.

    Each request's JSON body goes to ``seen``.
    """

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if seen is not None:
            seen.append(body)
        messages = body.get("messages") or []
        tools = {t["function"]["name"]: t for t in body.get("tools") or []}
        choice = body.get("tool_choice", "auto") if tools else "none"
        last = messages[-1] if messages else {}
        question = callers_words(messages)
        calls: list[tuple[str, dict]] = []
        said = ""
        if last.get("role") == "tool":
            outputs = []
            for message in reversed(messages):
                if message.get("role") != "tool":
                    break
                outputs.insert(0, str(message.get("content")))
            chunks = [chunk(piece) for piece in _pieces("The tool says: " + "; ".join(outputs) + ".")]
        elif isinstance(choice, dict) or choice == "required":
            name = choice["function"]["name"] if isinstance(choice, dict) else next(iter(tools))
            calls = [(name, {"city": city} if name == "get_weather" else {}) for city in weather_cities(question)[:1]]
        elif choice != "none" and "get_weather" in tools and asks_about_a_place(question):
            calls = [("get_weather", {"city": city}) for city in weather_cities(question)]
        elif choice != "none" and "transfer_call" in tools and asks_for_a_person(question):
            said, calls = TRANSFER_ANNOUNCEMENT, [("transfer_call", {"to": transfer_to})]
        elif choice != "none" and "end_call" in tools and says_goodbye(question):
            said, calls = GOODBYE, [("end_call", {})]
        if calls:
            # A model that announces a call says so first, in the same reply as the call.
            chunks = [chunk(piece) for piece in _pieces(said)] if said else []
            chunks += [c for index, (name, arguments) in enumerate(calls)
                      for c in tool_call_chunks(index, f"call_stub{len(seen or ())}_{index}", name,
                                                json.dumps(arguments))]
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
        elif last.get("role") != "tool":
            chunks = [chunk(piece) for piece in _pieces(f"I heard: {question}")]
        return await stream_reply(request, chunks)

    return handler


def _pieces(text: str) -> list[str]:
    """``text`` in word-sized stream deltas."""
    return re.findall(r"\s*\S+", text)
