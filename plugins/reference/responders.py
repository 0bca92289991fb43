"""Text responders: turn a user's utterance (plus history) into streamed reply text.

A responder sees a bounded context: the last ``max_turns`` turns of the history
(a turn is a user message and what followed it), never the whole call.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

#: Earlier turns a responder sees by default (settings: ``responder_max_turns``).
DEFAULT_MAX_TURNS = 8


def recent_turns(history: list[dict[str, str]], max_turns: int) -> list[dict[str, str]]:
    """The user/assistant messages of the last ``max_turns`` turns of ``history``."""
    messages = [turn for turn in history if turn.get("role") in ("user", "assistant")]
    if max_turns <= 0:
        return []
    starts = [i for i, turn in enumerate(messages) if turn["role"] == "user"]
    return messages[starts[-max_turns]:] if len(starts) > max_turns else messages


class ResponderError(RuntimeError):
    """The responder's backend failed (HTTP error, bad stream, unreachable)."""


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


class OpenAIResponder:
    """Streams from any OpenAI-compatible /v1/chat/completions endpoint (stream: true, SSE)."""

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

    async def respond(self, history: list[dict[str, str]], user_text: str) -> AsyncIterator[str]:
        headers = {"Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = {"model": self.model, "messages": self._messages(history, user_text), "stream": True}
        # A session per reply keeps the responder free of any one event loop.
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            try:
                response = await session.post(self.url, json=body, headers=headers)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ResponderError(f"cannot reach {self.url}: {exc!r}") from exc
            finished = False
            try:
                if response.status >= 400:
                    detail = (await response.text(errors="replace"))[:300]
                    raise ResponderError(f"HTTP {response.status} from {self.url}: {detail}")
                async for data in _sse_data(response):
                    if data == "[DONE]":
                        break
                    delta = _delta_text(data)
                    if delta:
                        yield delta
                finished = True
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise ResponderError(f"stream from {self.url} failed: {exc!r}") from exc
            finally:
                # On cancellation or an abandoned iterator, drop the connection so the
                # server stops generating; otherwise hand it back for reuse.
                if finished:
                    response.release()
                else:
                    response.close()


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


def _delta_text(data: str) -> str:
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ResponderError(f"bad stream chunk: {data[:200]!r}") from exc
    if not isinstance(chunk, dict):
        raise ResponderError(f"bad stream chunk: {data[:200]!r}")
    if "error" in chunk:
        raise ResponderError(f"backend error: {chunk['error']}")
    choices = chunk.get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return delta.get("content") or ""


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
