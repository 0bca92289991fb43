"""The edge tool runner of one call: the model asks, the worker runs the tool, the model answers.

It watches the call's conversation events. A ``function_call`` item (its arguments whole) starts
the tool once per ``call_id``, whatever repeats; the tool runs as a task of the call's loop, under
the per-tool timeout, and its output goes back as a ``function_call_output`` item. Once every call
of the reply is answered and no response of the model is open, a ``response.create`` asks for the
answer, unless the model replies to tool outputs by itself, or every tool asked for no reply.

Bad input never stops the call and never runs anything twice: an unknown tool, arguments that are
not JSON or do not fit the schema, a tool that raises or overruns, calls beyond
``MAX_CALLS_PER_REPLY`` each get an error output (``outcomes.py`` names the reasons).

Barge-in: an ``after_heard`` tool waits until the caller has heard what the agent said before the
call, and is not run when they talked over it (heard.py). Talking over the agent while a tool
runs does not cancel it; the follow-up waits until the caller has finished speaking, and is left
out when the model has started a reply of its own by then (the one to the caller's new turn, with
the output already in its history). A call unanswered after ``hold_after_s`` has the hold sound
play (quiet while the caller speaks) until the answer's audio starts.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Protocol

from duplex_agent.agent.metrics import TOOL_CALLS, TOOL_FAILURES, TOOL_RUN_SECONDS
from duplex_agent.agent.protocol.events import (
    ClientEvent,
    ConversationItemAdded,
    ConversationItemCreate,
    ErrorEvent,
    ResponseAudioDelta,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseFunctionCallArgumentsDone,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
    ServerEvent,
    SpeechStarted,
    SpeechStopped,
)
from duplex_agent.agent.protocol.tools import MAX_CALLS_PER_REPLY, error_output, function_call_output_item
from duplex_agent.agent.tools.heard import HeardTracker
from duplex_agent.agent.tools.outcomes import (
    CALLER_INTERRUPTED,
    TOO_MANY_CALLS,
    TOOL_CANCELLED,
    TOOL_FAILED,
    TOOL_TIMEOUT,
    ToolAnswer,
    ToolCallRefused,
)

log = logging.getLogger("duplex_agent.tools")

#: After the caller stops speaking over a call's wait, how long the model has to start its own
#: reply (to their turn, with the outputs in its history) before the follow-up asks for one.
FOLLOW_UP_GRACE_S = 0.75
#: The hold sound stops after this long whatever happens: a model that never answers must not
#: leave the caller on hold for the rest of the call.
MAX_HOLD_S = 30.0
#: How long a closing call waits for its running tools to answer before it cancels them.
CLOSE_GRACE_S = 1.0
#: Calls (and their items) remembered, so that a repeated event runs nothing twice.
CALLS_KEPT = 256
#: The metric's label for a name the model made up (the label set stays the module's tools).
UNKNOWN_TOOL_LABEL = "(unknown)"


class RunnerTools(Protocol):
    """What the call path and the runner need of a call's tools (``toolbox.CallTools``)."""

    @property
    def schemas(self) -> list[dict[str, Any]]: ...

    @property
    def instructions(self) -> str: ...

    @property
    def timeout_s(self) -> float: ...

    @property
    def hold_after_s(self) -> float: ...

    def knows(self, name: str) -> bool: ...

    def after_heard(self, name: str) -> bool: ...

    def prepare(self, name: str, call_id: str, arguments: str,
                until_heard: Callable[[], Awaitable[bool]]) -> Callable[[], Awaitable[ToolAnswer]]: ...


class HoldControl(Protocol):
    """The call's hold sound (``webrtc.media.hold_sound.HoldSound``)."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


class _Remembered:
    """Keys seen lately, the oldest forgotten past ``CALLS_KEPT``."""

    def __init__(self) -> None:
        self._keys: OrderedDict[str, Any] = OrderedDict()

    def put(self, key: str, value: Any = None) -> None:
        self._keys[key] = value
        while len(self._keys) > CALLS_KEPT:
            self._keys.popitem(last=False)

    def get(self, key: str) -> Any:
        return self._keys.get(key)

    def discard(self, key: str) -> None:
        self._keys.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._keys


class EdgeToolRunner:
    def __init__(self, tools: RunnerTools, send: Callable[[ClientEvent], None], *,
                 replies_to_tool_output: bool, hold: HoldControl | None = None,
                 follow_up_grace_s: float = FOLLOW_UP_GRACE_S) -> None:
        self._tools = tools
        self._send = send
        self._replies_by_itself = replies_to_tool_output
        self._hold = hold
        self._grace_s = follow_up_grace_s
        self._heard = HeardTracker()
        self._items = _Remembered()  # function_call item id -> (name, call_id)
        self._calls = _Remembered()  # call ids seen: each runs once
        self._answers = _Remembered()  # responses that answer the calls (their audio ends the hold)
        self._open: set[str] = set()  # the model's responses not done yet
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}
        # The calls of the reply being answered now.
        self._group: list[str] = []
        self._pending: dict[str, str] = {}  # call id -> tool name, until answered
        self._group_started_at = 0.0
        self._wants_reply = False
        self._answered_by: str | None = None  # a reply the model started after the outputs went in
        self._awaiting_answer = False  # the follow-up went: the next response is the answer
        self._speaking = False
        self._speech_ended_at: float | None = None
        self._waiting = False  # a call waits for its answer to be heard
        self._holding = False
        self._closed = False
        self.calls = 0
        self.failures: dict[str, int] = {}

    # ---- the conversation's events ----

    def observe(self, event: ServerEvent) -> None:
        if self._closed:
            return
        if isinstance(event, ResponseAudioDelta):
            self._heard.audio(event.response_id)
            if event.response_id in self._answers and not self._pending:
                self._end_wait()
        elif isinstance(event, ResponseCreated):
            self._heard.response_created(event.response_id)
            self._open.add(event.response_id)
            self._response_started(event.response_id)
        elif isinstance(event, ConversationItemAdded | ResponseOutputItemAdded):
            self._note_item(event.item)
        elif isinstance(event, ResponseFunctionCallArgumentsDone):
            named = self._items.get(event.item_id)
            if named is not None:  # else the output item's end brings the name with the arguments
                self._call(event.call_id, named[0], event.arguments, event.response_id)
        elif isinstance(event, ResponseOutputItemDone):
            item = event.item
            if item.get("type") == "function_call":
                arguments = item.get("arguments", "")
                self._call(str(item.get("call_id") or ""), str(item.get("name") or ""),
                           arguments if isinstance(arguments, str) else json.dumps(arguments, default=str),
                           event.response_id)
        elif isinstance(event, ResponseDone):
            self._heard.response_done(event.response_id)
            self._open.discard(event.response_id)
            self._maybe_follow_up()
            if event.response_id in self._answers and not self._pending:
                self._end_wait()  # the answer ended (without a sound, when none ended the wait yet)
        elif isinstance(event, SpeechStarted):
            self._speaking = True
            self._sound()
        elif isinstance(event, SpeechStopped):
            self._speaking = False
            self._speech_ended_at = self._now()
            self._heard.new_turn()
            self._sound()
            self._maybe_follow_up()
        elif isinstance(event, ErrorEvent) and event.code == "invalid_function_call_output":
            log.warning("the model refused a tool output: %s", event.error.get("message"))

    def playback_ended(self, response_id: str, *, interrupted: bool) -> None:
        """The call path is done playing a response: to its end, or cut short."""
        self._heard.playback_ended(response_id, interrupted=interrupted)

    async def close(self) -> None:
        """Cancel every timer, give the running tools ``CLOSE_GRACE_S`` to answer, then cancel
        them and wait for them to stop. Each call left unanswered gets an error output: a
        conversation kept for a resume goes on with a history that says what became of it."""
        self._closed = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._end_wait()
        tasks = list(self._tasks)
        if tasks:
            # A tool that ends the call (a hang-up, a transfer) is often still returning when the
            # call closes: its answer, not a cancel, is what became of it.
            await asyncio.wait(tasks, timeout=CLOSE_GRACE_S)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for call_id, name in list(self._pending.items()):
            self._finish(call_id, name, ToolAnswer(error_output(
                TOOL_CANCELLED, f"the call's connection ended while {name} ran; whether it took effect is not known")),
                TOOL_CANCELLED)

    # ---- calls ----

    def _note_item(self, item: dict[str, Any]) -> None:
        if item.get("type") == "function_call" and isinstance(item.get("id"), str):
            self._items.put(item["id"], (str(item.get("name") or ""), str(item.get("call_id") or "")))

    def _call(self, call_id: str, name: str, arguments: str, response_id: str) -> None:
        if not call_id or call_id in self._calls:
            return
        self._calls.put(call_id)
        self.calls += 1
        TOOL_CALLS.labels(tool=name if self._tools.knows(name) else UNKNOWN_TOOL_LABEL).inc()
        self._answers.discard(response_id)  # a call, not an answer
        if self._answered_by == response_id:
            self._answered_by = None
        if not self._group:
            self._group_started_at = self._now()
        self._group.append(call_id)
        self._pending[call_id] = name
        self._begin_wait()
        if len(self._group) > MAX_CALLS_PER_REPLY:
            refused = ToolCallRefused(TOO_MANY_CALLS, f"at most {MAX_CALLS_PER_REPLY} tool calls per reply; "
                                      f"{name} was not run")
            self._finish(call_id, name, ToolAnswer(refused.output()), refused.code)
            return
        task = asyncio.get_running_loop().create_task(self._run(call_id, name, arguments, response_id),
                                                      name=f"tool-{call_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, call_id: str, name: str, arguments: str, response_id: str) -> None:
        loop = asyncio.get_running_loop()
        before = self._heard.before(response_id)
        timeout_s = self._tools.timeout_s
        started: float | None = None
        reason: str | None = None
        try:
            run = self._tools.prepare(name, call_id, arguments, partial(self._heard.heard, before))
            if self._tools.after_heard(name) and not await self._heard.heard(before):
                raise ToolCallRefused(CALLER_INTERRUPTED, f"the caller talked over what was said before this call, "
                                      f"so {name} was not run; ask them again if it is still wanted")
            started = loop.time()
            async with asyncio.timeout(timeout_s):
                answer = await run()
        except ToolCallRefused as refused:
            answer, reason = ToolAnswer(refused.output()), refused.code
        except TimeoutError:
            answer = ToolAnswer(error_output(TOOL_TIMEOUT, f"{name} did not answer within {timeout_s:g} s"))
            reason = TOOL_TIMEOUT
        except Exception:
            log.exception("tool %s (call %s) failed", name, call_id)
            answer, reason = ToolAnswer(error_output(TOOL_FAILED, f"{name} failed")), TOOL_FAILED
        finally:
            if started is not None:
                TOOL_RUN_SECONDS.observe(loop.time() - started)
        self._finish(call_id, name, answer, reason)

    def _finish(self, call_id: str, name: str, answer: ToolAnswer, reason: str | None) -> None:
        self._pending.pop(call_id, None)
        self._send(ConversationItemCreate(item=function_call_output_item(call_id, answer.output)))
        if reason is not None:
            log.info("tool call %s (%s) answered with an error: %s", call_id, name, reason)
            TOOL_FAILURES.labels(reason=reason).inc()
            self.failures[reason] = self.failures.get(reason, 0) + 1
        self._wants_reply = self._wants_reply or answer.reply_required
        self._maybe_follow_up()

    # ---- the answer ----

    def _response_started(self, response_id: str) -> None:
        if self._group and not self._pending and self._answered_by is None:
            self._answered_by = response_id  # the model answers by itself (or a call comes: see _call)
            self._answers.put(response_id)
        elif self._awaiting_answer:
            self._awaiting_answer = False
            self._answers.put(response_id)

    def _maybe_follow_up(self) -> None:
        self._cancel_timer("follow_up")
        if self._closed or not self._group or self._pending:
            return
        if self._replies_by_itself or not self._wants_reply or self._answered_by is not None:
            self._close_group(awaiting=self._wants_reply and self._answered_by is None)
            return
        if self._open or self._speaking:
            return  # again at the response's end, or the caller's
        grace_left = self._grace_left()
        if grace_left > 0:
            self._later("follow_up", grace_left, self._maybe_follow_up)
            return
        self._send(ResponseCreate())
        self._close_group(awaiting=True)

    def _grace_left(self) -> float:
        """Time the model still has to reply by itself to a turn the caller ended during the wait."""
        ended = self._speech_ended_at
        if ended is None or ended < self._group_started_at:
            return 0.0
        return ended + self._grace_s - self._now()

    def _close_group(self, *, awaiting: bool) -> None:
        had_answer = self._answered_by is not None
        self._group, self._wants_reply, self._answered_by = [], False, None
        self._awaiting_answer = awaiting
        if not awaiting and not had_answer:
            self._end_wait()  # no answer is coming: nothing to hold for

    # ---- the wait and its hold sound ----

    def _begin_wait(self) -> None:
        if self._waiting:
            return
        self._waiting = True
        self._later("hold", self._tools.hold_after_s, self._hold_due)

    def _hold_due(self) -> None:
        self._holding = True
        self._later("hold_cap", MAX_HOLD_S, self._end_wait)
        self._sound()

    def _end_wait(self) -> None:
        self._waiting = self._holding = False
        self._cancel_timer("hold")
        self._cancel_timer("hold_cap")
        self._sound()

    def _sound(self) -> None:
        if self._hold is None:
            return
        if self._holding and not self._speaking:
            self._hold.start()
        else:
            self._hold.stop()

    # ---- time ----

    def _later(self, name: str, delay_s: float, callback: Callable[[], None]) -> None:
        self._cancel_timer(name)
        self._timers[name] = asyncio.get_running_loop().call_later(max(0.0, delay_s), callback)

    def _cancel_timer(self, name: str) -> None:
        handle = self._timers.pop(name, None)
        if handle is not None:
            handle.cancel()

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()
