"""Run one client command sequence against a duplex server and describe what came back, key by key.

A run opens a fresh session, sends the case's events, then a ``session.heartbeat`` as a fence
(both servers answer commands in order, so the ``session.heartbeat_ack`` comes after the answers
to everything before it); a case that starts a response waits for its ``response.done`` first.
A reply a server starts on its own (ours, on a bare commit) streams on after its command's answer,
so only what of it came before the fence is compared. What is compared is the shape, not the
content: the event names in order, each event's keys with the JSON types of their values, and the
error codes.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

FENCE = {"type": "session.heartbeat"}
FENCE_ANSWER = "session.heartbeat_ack"
ANSWER_TIMEOUT_S = 30.0
#: vLLM-Omni's own debugging metadata (runtime names, scheduler facts) differs per model by design.
IGNORED_SUBTREES = ("vllm_omni",)
#: Events that repeat per chunk; their shape is compared once, their count is not.
STREAMED = (".delta",)


@dataclass
class Case:
    name: str
    events: list[dict[str, Any] | str]
    #: Wait for this event before the fence (a response's end).
    until: str | None = None
    #: Sent once ``until`` has arrived.
    after: list[dict[str, Any]] = field(default_factory=list)
    session: dict[str, Any] = field(default_factory=lambda: {"turn_detection": None})


@dataclass
class Answer:
    events: list[dict[str, Any]]
    note: str = ""

    @property
    def names(self) -> list[str]:
        """Event names in order of first appearance (streamed events once)."""
        seen: list[str] = []
        for event in self.events:
            if event["type"] not in seen:
                seen.append(event["type"])
        return seen

    @property
    def error_codes(self) -> list[str]:
        return [str((event.get("error") or {}).get("code")) for event in self.events if event["type"] == "error"]

    def shapes(self) -> dict[str, dict[str, str]]:
        """Event name -> {dotted key: JSON type}, merged over that event's occurrences."""
        merged: dict[str, dict[str, str]] = {}
        for event in self.events:
            merged.setdefault(event["type"], {}).update(flatten(event))
        return merged


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in IGNORED_SUBTREES:
                continue
            path = f"{prefix}.{key}" if prefix else key
            out[path] = json_type(inner)
            out.update(flatten(inner, path))
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        out.update(flatten(value[0], prefix + "[]"))
    return out


async def run_case(url: str, case: Case) -> Answer:
    async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=64 << 20) as ws:
        received: list[dict[str, Any]] = []

        async def until(kind: str) -> bool:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + ANSWER_TIMEOUT_S
            while loop.time() < deadline:
                try:
                    message = await ws.receive(timeout=max(0.01, deadline - loop.time()))
                except TimeoutError:
                    return False
                if message.type != aiohttp.WSMsgType.TEXT:
                    return False
                event = json.loads(message.data)
                received.append(event)
                if event.get("type") == kind:
                    return True
            return False

        # The opening's whole answer (session.created, and whatever follows it) ends at the fence.
        await ws.send_str(json.dumps({"type": "session.update", "session": case.session}))
        if not await until("session.created"):
            return Answer(received, "no session.created")
        await ws.send_str(json.dumps(FENCE))
        if not await until(FENCE_ANSWER):
            return Answer(received, f"no {FENCE_ANSWER} to the opening")
        opening = len(received)
        for event in case.events:
            await ws.send_str(event if isinstance(event, str) else json.dumps(event))
        if case.until is not None and not await until(case.until):
            return Answer(received[opening:], f"no {case.until} within {ANSWER_TIMEOUT_S} s")
        for event in case.after:
            await ws.send_str(json.dumps(event))
        if case.until == "session.closed":
            return Answer(received[opening:])
        if ws.closed:
            return Answer(received[opening:], "socket closed")
        await ws.send_str(json.dumps(FENCE))
        if not await until(FENCE_ANSWER):
            return Answer(received[opening:], f"no {FENCE_ANSWER} within {ANSWER_TIMEOUT_S} s")
        answer = Answer(received[opening:-1])  # the fence's own answer left out
        # Only session.close ends a vLLM-Omni session at once; a bare socket close holds its slot.
        await ws.send_str(json.dumps({"type": "session.close"}))
        return answer


@dataclass(frozen=True)
class Intended:
    """A difference we keep on purpose (docs/protocol.md, "Where we differ from vLLM-Omni 0.30.0, on purpose").

    ``lines`` are the lines ``diff`` prints for it, exactly, or up to a trailing ``*`` (a line that
    starts so); only those lines are excused, in that case only.
    """

    case: str
    lines: tuple[str, ...]
    reason: str


def unexcused(case: str, differences: list[str], intended: list[Intended]) -> tuple[list[str], list[Intended]]:
    """(the differences no intended entry covers, the entries for ``case`` that did not occur)."""
    mine = [entry for entry in intended if entry.case == case]
    patterns = [pattern for entry in mine for pattern in entry.lines]
    stale = [entry for entry in mine if not all(any(_covers(pattern, line) for line in differences)
                                                for pattern in entry.lines)]
    return [line for line in differences if not any(_covers(pattern, line) for pattern in patterns)], stale


def _covers(pattern: str, line: str) -> bool:
    return line.startswith(pattern[:-1]) if pattern.endswith("*") else line == pattern


def diff(real: Answer, ours: Answer) -> tuple[list[str], list[str]]:
    """(differences, extras), vLLM-Omni's answer first.

    A difference is what a vLLM-Omni client could trip on: another run outcome, other event
    names, other error codes, a key vLLM-Omni sends that ours lacks, or a key of another JSON
    type. Extras (keys only ours sends) are our own additions, which a vLLM-Omni client ignores.
    """
    lines: list[str] = []
    extras: list[str] = []
    if real.note != ours.note:
        lines.append(f"run: vLLM-Omni {real.note or 'answered'!r}, ours {ours.note or 'answered'!r}")
    if real.names != ours.names:
        lines.append(f"events: vLLM-Omni {real.names}")
        lines.append(f"        ours      {ours.names}")
    if real.error_codes != ours.error_codes:
        lines.append(f"error codes: vLLM-Omni {real.error_codes}, ours {ours.error_codes}")
    real_shapes, our_shapes = real.shapes(), ours.shapes()
    for name in [name for name in real.names if name in our_shapes]:
        theirs, mine = real_shapes[name], our_shapes[name]
        missing: dict[str, list[str]] = {}
        for key in sorted(set(theirs) | set(mine)):
            if key not in mine:
                if not _under_missing(key, mine):
                    parent, _, leaf = key.rpartition(".")
                    missing.setdefault(parent, []).append(f"{leaf} ({theirs[key]})")
            elif key not in theirs:
                extras.append(f"{name}: {key} ({mine[key]}) only in ours")
            elif theirs[key] != mine[key]:
                lines.append(f"{name}: {key} is {theirs[key]} in vLLM-Omni, {mine[key]} in ours")
        for parent, leaves in missing.items():
            lines.append(f"{name}: {parent or '(top)'} lacks {', '.join(leaves)}")
    return lines, extras


def _under_missing(key: str, mine: dict[str, str]) -> bool:
    """Whether a parent of ``key`` is already reported missing (one line per missing subtree)."""
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    return bool(parent) and parent not in mine
