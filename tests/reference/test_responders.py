import asyncio
import json

import pytest
from aiohttp import web

from duplex_agent.plugins.reference.responders import (
    EchoResponder,
    OpenAIResponder,
    ResponderError,
    make_responder,
    recent_turns,
)


async def collect(stream) -> list[str]:
    return [delta async for delta in stream]


@pytest.mark.asyncio
async def test_echo():
    deltas = await collect(EchoResponder().respond([], "hello big world."))
    assert "".join(deltas) == "You said: hello big world."
    assert len(deltas) == 5
    assert await collect(EchoResponder().respond([], "  ")) == []


def sse(obj) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def chunk(content: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": content}}]}


async def start_server(handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/v1"


@pytest.mark.asyncio
async def test_openai_streams_sse():
    seen: dict = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen["body"] = await request.json()
        seen["auth"] = request.headers.get("Authorization")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b": keep-alive\n\n")
        await response.write(sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
        for piece in ("Hel", "lo", " there", "!"):
            await response.write(sse(chunk(piece)))
        # One event split across writes and lines, with CRLF endings.
        await response.write(b"data: " + json.dumps(chunk(" Bye")).encode()[:10])
        await response.write(json.dumps(chunk(" Bye")).encode()[10:] + b"\r\n\r\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    runner, base_url = await start_server(handler)
    try:
        responder = OpenAIResponder(base_url, "test-model", "sk-test", "Be brief.")
        history = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "tool", "content": "ignored"},
        ]
        deltas = await collect(responder.respond(history, "how are you"))
    finally:
        await runner.cleanup()
    assert deltas == ["Hel", "lo", " there", "!", " Bye"]
    assert seen["auth"] == "Bearer sk-test"
    assert seen["body"]["stream"] is True and seen["body"]["model"] == "test-model"
    assert seen["body"]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "how are you"},
    ]


@pytest.mark.asyncio
async def test_openai_http_error():
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=500, text="boom")

    runner, base_url = await start_server(handler)
    try:
        with pytest.raises(ResponderError, match="500"):
            await collect(OpenAIResponder(base_url, "m").respond([], "hi"))
    finally:
        await runner.cleanup()


@pytest.mark.asyncio
async def test_openai_unreachable():
    responder = OpenAIResponder("http://127.0.0.1:9/v1", "m", timeout_s=5)
    with pytest.raises(ResponderError):
        await collect(responder.respond([], "hi"))


@pytest.mark.asyncio
async def test_openai_cancel_closes_stream():
    disconnected = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            while True:
                await response.write(sse(chunk("word ")))
                await asyncio.sleep(0.01)
        except (ConnectionResetError, asyncio.CancelledError):
            disconnected.set()
            raise

    runner, base_url = await start_server(handler)
    try:
        stream = OpenAIResponder(base_url, "m").respond([], "talk forever")

        streaming = asyncio.Event()

        async def consume() -> None:
            async for _ in stream:
                streaming.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(streaming.wait(), 10)  # words are arriving: the stream is open
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(disconnected.wait(), 10)  # the server saw the client go
    finally:
        await runner.cleanup()


def test_make_responder():
    assert isinstance(make_responder("echo", {}), EchoResponder)
    r = make_responder("openai", {"base_url": "http://localhost:8000", "model": "m"})
    assert isinstance(r, OpenAIResponder) and r.url == "http://localhost:8000/v1/chat/completions"
    with pytest.raises(ValueError, match="nope"):
        make_responder("nope", {})
    with pytest.raises(ValueError, match="model"):
        make_responder("openai", {"base_url": "http://x/v1"})
    with pytest.raises(ValueError, match="colour"):
        make_responder("openai", {"base_url": "http://x/v1", "model": "m", "colour": 1})


@pytest.mark.asyncio
async def test_openai_sees_only_the_last_turns():
    bodies: list[dict] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk("ok")) + b"data: [DONE]\n\n")
        return response

    runner, base_url = await start_server(handler)
    try:
        responder = make_responder("openai", {"base_url": base_url, "model": "m", "max_turns": 2})
        history = []
        for turn in range(30):  # a long call
            history += [{"role": "user", "content": f"q{turn}"}, {"role": "assistant", "content": f"a{turn}"}]
        await collect(responder.respond(history, "now"))
    finally:
        await runner.cleanup()
    assert [m["content"] for m in bodies[0]["messages"]] == ["q28", "a28", "q29", "a29", "now"]


def test_recent_turns_keeps_whole_turns():
    history = [{"role": "assistant", "content": "hi, how can I help"},
               {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
               {"role": "user", "content": "u2"}, {"role": "tool", "content": "x"},
               {"role": "assistant", "content": "a2"}]
    assert [t["content"] for t in recent_turns(history, 1)] == ["u2", "a2"]
    assert [t["content"] for t in recent_turns(history, 5)] == ["hi, how can I help", "u1", "a1", "u2", "a2"]
    assert recent_turns(history, 0) == []


def test_the_setting_reaches_the_reference_responder():
    from duplex_agent.agent.app.settings import read_environment
    from duplex_agent.agent.protocol.audio import as_float32_audio
    from duplex_agent.plugins.reference.plugin import ReferenceOptions, ReferencePlugin

    options = ReferenceOptions()
    read_environment(options, {"DUPLEX_RESPONDER": "openai", "DUPLEX_OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
                               "DUPLEX_OPENAI_MODEL": "m", "DUPLEX_RESPONDER_MAX_TURNS": "3"})
    plugin = ReferencePlugin(as_float32_audio)
    plugin.configure(options, max_sessions=4)
    assert make_responder(plugin.responder_name, plugin.responder_settings).max_turns == 3
    # The call's remembered context is cut to what the responder will see.
    context = plugin.context("sess1")
    for turn in range(10):
        context.history.append({"role": "user", "content": f"q{turn}"})
        plugin.commit_model_context(session_id="sess1", assistant_text=f"a{turn}")
    assert [t["content"] for t in context.history] == ["q7", "a7", "q8", "a8", "q9", "a9"]
