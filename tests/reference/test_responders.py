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
    shown_address,
)
from tests.support.chat_stub import chunk, sse, start_server, streaming_reply
from tests.support.ports import refused_port


async def collect(stream) -> list[str]:
    return [delta async for delta in stream]


@pytest.mark.asyncio
async def test_echo():
    deltas = await collect(EchoResponder().respond([], "hello big world."))
    assert "".join(deltas) == "You said: hello big world."
    assert len(deltas) == 5
    assert await collect(EchoResponder().respond([], "  ")) == []


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


#: What must never reach a log line or the caller: the key, and the HTTP client's internals.
KEY = "sk-secret-123"
INTERNALS = ("ConnectionKey", "ClientConnectorError", "proxy_headers_hash", "Error(", KEY)


def plain(text: str) -> str:
    assert not [word for word in INTERNALS if word in text], text
    return text


async def failure(responder: OpenAIResponder) -> ResponderError:
    with pytest.raises(ResponderError) as failed:
        await collect(responder.respond([], "hi"))
    plain(str(failed.value))
    plain(failed.value.detail)
    return failed.value


@pytest.mark.asyncio
async def test_openai_http_error():
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=500, text=f"boom: the key {KEY} is fine,\n the GPU is not")

    runner, base_url = await start_server(handler)
    try:
        failed = await failure(OpenAIResponder(base_url, "m", KEY))
    finally:
        await runner.cleanup()
    assert str(failed) == "The language model answered with an error (HTTP 500)."
    assert failed.detail == (f"the language model at {base_url}: HTTP 500 from {base_url}/chat/completions: "
                             "boom: the key [key] is fine, the GPU is not")


@pytest.mark.asyncio
async def test_openai_refused_key_and_unknown_model_say_so():
    async def handler(request: web.Request) -> web.Response:
        status = 401 if request.headers.get("Authorization") != "Bearer right" else 404
        return web.Response(status=status, text="{}")

    runner, base_url = await start_server(handler)
    try:
        refused = await failure(OpenAIResponder(base_url, "m", KEY))
        unknown = await failure(OpenAIResponder(base_url, "m", "right"))
    finally:
        await runner.cleanup()
    assert str(refused) == "The language model refused this worker's key (HTTP 401)."
    assert "--openai-api-key" in refused.detail
    assert str(unknown) == "The language model answered with an error (HTTP 404)."
    assert "is --openai-base-url right, and --openai-model a model it serves?" in unknown.detail


@pytest.mark.asyncio
@pytest.mark.parametrize("event, sentence, detail", [
    (b"data: not json\n\n", "sent a reply that could not be read", "not an OpenAI stream chunk: 'not json'"),
    (sse({"error": {"message": "out of memory"}}), "reported an error", "an error in the stream: out of memory"),
])
async def test_openai_bad_stream(event, sentence, detail):
    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse(chunk("Hello")))
        await response.write(event)
        return response

    runner, base_url = await start_server(handler)
    try:
        failed = await failure(OpenAIResponder(base_url, "m", KEY))
    finally:
        await runner.cleanup()
    assert str(failed) == f"The language model {sentence}."
    assert failed.detail == f"the language model at {base_url}: {detail}"


@pytest.mark.asyncio
async def test_openai_unreachable():
    with refused_port() as port:
        failed = await failure(OpenAIResponder(f"http://127.0.0.1:{port}/v1", "m", KEY, timeout_s=5))
    assert str(failed) == "The language model could not be reached."
    assert failed.detail == (f"the language model at http://127.0.0.1:{port}/v1: the connection was refused "
                             "(is the server running, on that port?)")


def test_the_shown_address_carries_no_credentials():
    assert OpenAIResponder("http://user:pw@127.0.0.1:9/v1", "m").address == "http://127.0.0.1:9/v1"
    assert shown_address("https://user:pw@llm.example:8443/v1?api-key=abc#x") == "https://llm.example:8443/v1"
    assert OpenAIResponder("http://localhost:8000", "m").address == "http://localhost:8000/v1"
    assert OpenAIResponder("https://[::1]:8443/v1/chat/completions", "m").address == "https://[::1]:8443/v1"


@pytest.mark.asyncio
async def test_the_start_up_check():
    with refused_port() as port:
        problem = await OpenAIResponder(f"http://127.0.0.1:{port}/v1", "m", KEY).check_reachable()
    assert problem == "cannot be reached: the connection was refused (is the server running, on that port?)"

    asked: list[tuple[str, str | None]] = []

    async def models(request: web.Request) -> web.Response:
        asked.append((request.path, request.headers.get("Authorization")))
        return web.Response(status=401 if request.headers.get("Authorization") != f"Bearer {KEY}" else 200)

    runner, base_url = await start_server(streaming_reply(["ok"]), models=models)
    bare, bare_url = await start_server(streaming_reply(["ok"]))  # no /models: a 404 is an answer too
    try:
        assert await OpenAIResponder(base_url, "m", KEY).check_reachable() is None
        assert await OpenAIResponder(base_url, "m", "wrong").check_reachable() == \
            "refused this worker's key (HTTP 401; see --openai-api-key)"
        assert await OpenAIResponder(bare_url, "m").check_reachable() is None
    finally:
        await runner.cleanup()
        await bare.cleanup()
    assert asked == [("/v1/models", f"Bearer {KEY}"), ("/v1/models", "Bearer wrong")]


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
