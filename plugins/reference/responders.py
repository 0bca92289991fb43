"""Text responders: turn a user's utterance (plus history) into streamed reply text.

A responder sees a bounded context: the last ``max_turns`` turns of the history
(a turn is a user message and what followed it), never the whole call.

With tools, a reply may be function calls as well as words: a responder yields text
deltas (``str``) and whole calls (``ToolCall``). The history then holds the chat API's
shapes: assistant messages with ``tool_calls``, and ``tool`` messages with the outputs.

An endpoint's failure is told twice (``ResponderError``): to the caller in one plain
sentence naming the endpoint's address, and to the operator's log with the reason in
words; neither carries the key or a repr of the HTTP client's internals.
"""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from duplex_agent.plugins.contract.engine import StageFailure

log = logging.getLogger("duplex_agent.reference")

#: Earlier turns a responder sees by default (settings: ``responder_max_turns``).
DEFAULT_MAX_TURNS = 8
#: What a model is told of a call whose output has not come back (yet) when it next answers.
NO_OUTPUT_YET = json.dumps({"error": {"code": "no_output_yet", "message": "the tool has not answered yet"}})

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call of a reply, whole: ``arguments`` is the JSON text the model wrote."""

    call_id: str
    name: str
    arguments: str


def recent_turns(history: list[Message], max_turns: int) -> list[Message]:
    """The user, assistant and tool messages of the last ``max_turns`` turns of ``history``
    (a tool message without a ``tool_call_id`` answers nothing and is left out)."""
    messages = [turn for turn in history if turn.get("role") in ("user", "assistant")
                or (turn.get("role") == "tool" and turn.get("tool_call_id"))]
    if max_turns <= 0:
        return []
    starts = [i for i, turn in enumerate(messages) if turn["role"] == "user"]
    return messages[starts[-max_turns]:] if len(starts) > max_turns else messages


def paired_tool_messages(messages: list[Message]) -> list[Message]:
    """``messages`` in the order the chat API wants: each assistant message with ``tool_calls``
    followed at once by one ``tool`` message per call (an output that came after later turns is
    moved up; a call with none yet gets ``NO_OUTPUT_YET``); a tool message for no call in view is
    left out."""
    outputs = {m["tool_call_id"]: m for m in messages if m.get("role") == "tool"}
    paired: list[Message] = []
    for message in messages:
        if message.get("role") == "tool":
            continue
        paired.append(message)
        for call in message.get("tool_calls") or ():
            paired.append(outputs.get(call["id"]) or {"role": "tool", "tool_call_id": call["id"],
                                                       "content": NO_OUTPUT_YET})
    return paired


def chat_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Session tools (the realtime wire's flat definitions) in the chat API's nested shape."""
    return [{"type": "function", "function": {"name": tool["name"], "description": tool.get("description", ""),
                                              "parameters": tool.get("parameters", {"type": "object",
                                                                                    "properties": {}})}}
            for tool in tools]


def chat_tool_choice(choice: str | Mapping[str, Any]) -> str | dict[str, Any]:
    """A realtime ``tool_choice`` in the chat API's shape (a named function nests under ``function``)."""
    if isinstance(choice, Mapping):
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


class ResponderError(StageFailure):
    """The responder's backend failed (unreachable, an HTTP error, a bad stream).

    ``str(exc)`` is the caller's sentence; ``detail`` the log's (address and reason).
    """


class Responder(Protocol):
    # Implemented as `async def ... yield`; calling it returns the iterator directly.
    def respond(self, history: list[Message], user_text: str | None, *, tools: Sequence[Mapping[str, Any]] = (),
                tool_choice: str | Mapping[str, Any] = "auto") -> AsyncIterator[str | ToolCall]:
        """Yield reply text deltas and function calls for ``user_text``, given the earlier
        messages; ``user_text`` None answers from the history alone (after function outputs).
        ``tools`` are the realtime wire's flat definitions."""
        ...


class EchoResponder:
    """Deterministic, offline: replies "You said: <user_text>." in word-sized deltas.

    Trailing . ! ? of user_text are dropped so that the reply ends with exactly one ".".
    It calls no tools and has nothing to say without new words.
    """

    async def respond(self, history: list[Message], user_text: str | None, *, tools: Sequence[Mapping[str, Any]] = (),
                      tool_choice: str | Mapping[str, Any] = "auto") -> AsyncIterator[str | ToolCall]:
        if user_text is None:
            return
        text = user_text.strip().rstrip(".!?").rstrip()
        if not text:
            return
        for word in re.findall(r"\s*\S+", f"You said: {text}."):
            yield word


def _chat_completions_url(base_url: str) -> str:
    """Accept ".../v1", ".../v1/chat/completions" or a bare host (then /v1 is assumed)."""
    url = base_url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    if urlsplit(url).path in ("", "/"):
        url += "/v1"
    return url + "/chat/completions"


def shown_address(url: str) -> str:
    """``url`` as logs and callers may see it: no user or password, no query, no fragment."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{host}:{port}" if port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def plain_reason(exc: BaseException) -> str:
    """Why a request to an endpoint failed, in words (never the client library's repr)."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError) or (
            isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, socket.gaierror)):
        return "its host name could not be resolved"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return "its TLS certificate was not accepted"
    if isinstance(exc, aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(exc, aiohttp.ClientConnectorError):
        if isinstance(exc.os_error, ConnectionRefusedError):
            return "the connection was refused (is the server running, on that port?)"
        return f"the connection failed ({exc.os_error.strerror or type(exc.os_error).__name__})"
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        return "it did not answer in time"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "it closed the connection without an answer"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the reply broke off"
    if isinstance(exc, aiohttp.InvalidURL):
        return "the address is not a valid http:// or https:// URL"
    if isinstance(exc, aiohttp.ClientOSError):
        return f"the connection failed ({exc.strerror or type(exc).__name__})"
    return f"the request failed ({type(exc).__name__})"


class OpenAIResponder:
    """Streams from any OpenAI-compatible /v1/chat/completions endpoint (stream: true, SSE)."""

    #: Seconds the start-up check (``check_reachable``) may take.
    CHECK_TIMEOUT_S = 5.0

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str = "",
        system_prompt: str = "",
        *,
        timeout_s: float = 60.0,
        max_turns: int = DEFAULT_MAX_TURNS,
    ) -> None:
        self.url = _chat_completions_url(base_url)
        #: The endpoint's base (".../v1") as logs and the caller see it.
        self.address = shown_address(self.url.removesuffix("/chat/completions"))
        self.max_turns = max_turns
        self.model = model
        self.api_key = api_key
        self.system_prompt = system_prompt
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=10.0)

    def _messages(self, history: list[Message], user_text: str | None) -> list[Message]:
        messages: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        turns = recent_turns(history, self.max_turns)
        if user_text is not None:
            turns.append({"role": "user", "content": user_text})
        messages += paired_tool_messages([_chat_message(turn) for turn in turns])
        return messages

    def _headers(self, accept: str) -> dict[str, str]:
        headers = {"Accept": accept}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _words(self, text: str) -> str:
        """Text from the endpoint, fit for a log: one line, bounded, never the key."""
        text = " ".join(text.split())[:300]
        return text.replace(self.api_key, "[key]") if self.api_key else text

    def _error(self, sentence: str, reason: str) -> ResponderError:
        return ResponderError(f"The language model {sentence}.",
                              f"the language model at {self.address}: {reason}")

    def _http_error(self, status: int, body: str) -> ResponderError:
        said = f": {self._words(body)}" if body.strip() else ""
        if status in (401, 403):
            return self._error(f"refused this worker's key (HTTP {status})",
                               f"HTTP {status} from {shown_address(self.url)}: the key was refused "
                               f"(--openai-api-key){said}")
        hint = " (is --openai-base-url right, and --openai-model a model it serves?)" if status == 404 else ""
        return self._error(f"answered with an error (HTTP {status})",
                           f"HTTP {status} from {shown_address(self.url)}{hint}{said}")

    async def check_reachable(self) -> str | None:
        """None when the endpoint answers (any HTTP status but a refused key), else what is wrong, in
        words that follow its address ("cannot be reached: the connection was refused ...").

        One short GET of ``{base}/models`` with the key, bounded by ``CHECK_TIMEOUT_S``.
        """
        url = self.url.removesuffix("/chat/completions") + "/models"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.CHECK_TIMEOUT_S)) as session, \
                    session.get(url, headers=self._headers("application/json")) as response:
                status = response.status
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return f"cannot be reached: {plain_reason(exc)}"
        if status in (401, 403):
            return f"refused this worker's key (HTTP {status}; see --openai-api-key)"
        return None

    async def respond(self, history: list[Message], user_text: str | None, *, tools: Sequence[Mapping[str, Any]] = (),
                      tool_choice: str | Mapping[str, Any] = "auto") -> AsyncIterator[str | ToolCall]:
        body: dict[str, Any] = {"model": self.model, "messages": self._messages(history, user_text), "stream": True}
        if tools:
            body["tools"] = chat_tools(tools)
            body["tool_choice"] = chat_tool_choice(tool_choice)
        calls = _ToolCallPieces()
        # A session per reply keeps the responder free of any one event loop.
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            try:
                response = await session.post(self.url, json=body, headers=self._headers("text/event-stream"))
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise self._error("could not be reached", plain_reason(exc)) from exc
            finished = False
            try:
                if response.status >= 400:
                    raise self._http_error(response.status, await response.text(errors="replace"))
                async for data in _sse_data(response):
                    if data == "[DONE]":
                        break
                    delta = self._delta(data)
                    calls.add(delta.get("tool_calls"))
                    if text := delta.get("content"):
                        yield str(text)
                finished = True
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise self._error("stopped answering in the middle of a reply",
                                  f"the reply from {shown_address(self.url)} failed: {plain_reason(exc)}") from exc
            finally:
                # On cancellation or an abandoned iterator, drop the connection so the
                # server stops generating; otherwise hand it back for reuse.
                if finished:
                    response.release()
                else:
                    response.close()
        # A call is whole only once the stream ends (its arguments come in pieces until then).
        for call in calls.whole():
            yield call

    def _delta(self, data: str) -> dict[str, Any]:
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict):
            raise self._error("sent a reply that could not be read",
                              f"not an OpenAI stream chunk: {self._words(data)[:200]!r}")
        if "error" in chunk:
            error = chunk["error"]
            said = error.get("message", error) if isinstance(error, dict) else error
            raise self._error("reported an error", f"an error in the stream: {self._words(str(said))}")
        choices = chunk.get("choices") or [{}]
        delta = choices[0].get("delta") if isinstance(choices[0], dict) else None
        return delta if isinstance(delta, dict) else {}


def _chat_message(turn: Message) -> Message:
    """One history message as the chat API takes it (only the fields it knows)."""
    message: Message = {"role": turn["role"], "content": turn.get("content")}
    if turn.get("tool_calls"):
        message["tool_calls"] = turn["tool_calls"]
    if turn["role"] == "tool":
        message["tool_call_id"] = turn["tool_call_id"]
    return message


class _ToolCallPieces:
    """A streamed reply's ``tool_calls`` deltas, put together: each call's id and name come once,
    its arguments in pieces, all under the call's ``index``."""

    def __init__(self) -> None:
        self._calls: dict[int, dict[str, str]] = {}

    def add(self, deltas: object) -> None:
        if not isinstance(deltas, list):
            return
        for piece in deltas:
            if not isinstance(piece, dict):
                continue
            index = piece.get("index")
            if not isinstance(index, int):
                # A server that leaves the index out: a new id is a new call, else the latest goes on.
                fresh = piece.get("id") and all(c["id"] != piece["id"] for c in self._calls.values())
                index = len(self._calls) if fresh or not self._calls else max(self._calls)
            call = self._calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
            if isinstance(piece.get("id"), str) and not call["id"]:
                call["id"] = piece["id"]
            given = piece.get("function")
            function: dict[str, Any] = given if isinstance(given, dict) else {}
            if isinstance(function.get("name"), str) and not call["name"]:
                call["name"] = function["name"]
            if isinstance(function.get("arguments"), str):
                call["arguments"] += function["arguments"]

    def whole(self) -> list[ToolCall]:
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call["name"]:
                log.warning("the language model streamed a tool call with no name; it is dropped")
                continue
            # An id the runner will replace if it is missing or taken.
            calls.append(ToolCall(call["id"], call["name"], call["arguments"] or "{}"))
        return calls


async def _sse_data(response: aiohttp.ClientResponse) -> AsyncIterator[str]:
    """The data payload of each server-sent event (multi-line data joined by newlines)."""
    data: list[str] = []
    async for raw in response.content:
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
        # Other fields (event:, id:, retry:) and ":" comments carry nothing we need.
    if data:
        yield "\n".join(data)


_OPENAI_KEYS = frozenset({"base_url", "model", "api_key", "system_prompt", "timeout_s", "max_turns"})


def make_responder(name: str, settings: Mapping[str, Any] | None = None) -> Responder:
    """Build a responder by name: "echo" (ignores settings) or "openai" (base_url, model, ...)."""
    settings = dict(settings or {})
    if name == "echo":
        return EchoResponder()
    if name == "openai":
        unknown = set(settings) - _OPENAI_KEYS
        if unknown:
            raise ValueError(f"unknown openai responder settings: {sorted(unknown)}")
        missing = {"base_url", "model"} - set(settings)
        if missing:
            raise ValueError(f"openai responder needs settings: {sorted(missing)}")
        return OpenAIResponder(**settings)
    raise ValueError(f"unknown responder {name!r}; expected 'echo' or 'openai'")
