"""Text responders: turn a user's utterance (plus history) into streamed reply text.

A responder sees a bounded context: the last ``max_turns`` turns of the history
(a turn is a user message and what followed it), never the whole call.

An endpoint's failure is told twice (``ResponderError``): to the caller in one plain
sentence naming the endpoint's address, and to the operator's log with the reason in
words; neither carries the key or a repr of the HTTP client's internals.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from duplex_agent.plugins.contract.engine import StageFailure

#: Earlier turns a responder sees by default (settings: ``responder_max_turns``).
DEFAULT_MAX_TURNS = 8


def recent_turns(history: list[dict[str, str]], max_turns: int) -> list[dict[str, str]]:
    """The user/assistant messages of the last ``max_turns`` turns of ``history``."""
    messages = [turn for turn in history if turn.get("role") in ("user", "assistant")]
    if max_turns <= 0:
        return []
    starts = [i for i, turn in enumerate(messages) if turn["role"] == "user"]
    return messages[starts[-max_turns]:] if len(starts) > max_turns else messages


class ResponderError(StageFailure):
    """The responder's backend failed (unreachable, an HTTP error, a bad stream).

    ``str(exc)`` is the caller's sentence; ``detail`` the log's (address and reason).
    """


class Responder(Protocol):
    # Implemented as `async def ... yield`; calling it returns the iterator directly.
    def respond(self, history: list[dict[str, str]], user_text: str) -> AsyncIterator[str]:
        """Yield reply text deltas for user_text, given earlier user/assistant turns."""
        ...


class EchoResponder:
    """Deterministic, offline: replies "You said: <user_text>." in word-sized deltas.

    Trailing . ! ? of user_text are dropped so that the reply ends with exactly one ".".
    """

    async def respond(self, history: list[dict[str, str]], user_text: str) -> AsyncIterator[str]:
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

    def _messages(self, history: list[dict[str, str]], user_text: str) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages += [{"role": turn["role"], "content": turn["content"]}
                     for turn in recent_turns(history, self.max_turns)]
        messages.append({"role": "user", "content": user_text})
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

    async def respond(self, history: list[dict[str, str]], user_text: str) -> AsyncIterator[str]:
        body = {"model": self.model, "messages": self._messages(history, user_text), "stream": True}
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
                    delta = self._delta_text(data)
                    if delta:
                        yield delta
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

    def _delta_text(self, data: str) -> str:
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
        delta = choices[0].get("delta") or {}
        return delta.get("content") or ""


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
