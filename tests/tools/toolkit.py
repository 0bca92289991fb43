"""Tools the runner's tests call: each records its runs; some wait, raise or overrun."""

from __future__ import annotations

import asyncio
from typing import Any

from livekit.agents import StopResponse, ToolError, function_tool

from duplex_agent.agent.tools import ToolContext, after_heard

instructions = "Look things up with the tools, and say what they found."


class Runs:
    """What ran (name, arguments), and what a waiting tool waits for; new for each test."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.contexts: list[ToolContext] = []
        self.release = asyncio.Event()
        self.cancelled: list[str] = []

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


RUNS = Runs()


def reset() -> Runs:
    global RUNS
    RUNS = Runs()
    return RUNS


@function_tool
async def get_weather(city: str, unit: str = "celsius") -> str:
    """The weather in a city now.

    Args:
        city: the city's name
        unit: celsius or fahrenheit
    """
    RUNS.calls.append(("get_weather", {"city": city, "unit": unit}))
    return f"Sunny and 21 degrees in {city}"


@function_tool
async def slow_lookup(seconds: float) -> str:
    """A lookup that takes its time."""
    RUNS.calls.append(("slow_lookup", {"seconds": seconds}))
    await asyncio.sleep(seconds)
    return f"found after {seconds:g} s"


@function_tool
async def wait_for_release() -> str:
    """A lookup that answers when the test says so."""
    RUNS.calls.append(("wait_for_release", {}))
    try:
        await RUNS.release.wait()
    except asyncio.CancelledError:
        RUNS.cancelled.append("wait_for_release")
        raise
    return "released"


@function_tool
async def broken() -> str:
    """Always fails."""
    RUNS.calls.append(("broken", {}))
    raise RuntimeError("the database is down")


@function_tool
async def refuse(order: str) -> str:
    """Refuses with a reason for the model."""
    RUNS.calls.append(("refuse", {"order": order}))
    raise ToolError(f"there is no order {order}")


@function_tool
async def quiet() -> str:
    """Asks for no spoken reply."""
    RUNS.calls.append(("quiet", {}))
    raise StopResponse()


@function_tool
async def count(n: int) -> dict[str, int]:
    """Answers with JSON."""
    RUNS.calls.append(("count", {"n": n}))
    return {"n": n, "twice": 2 * n}


@after_heard
@function_tool
async def transfer(ctx: ToolContext, to: str) -> str:
    """Transfer the caller (cannot be taken back)."""
    RUNS.calls.append(("transfer", {"to": to}))
    RUNS.contexts.append(ctx)
    await ctx.control.transfer(to)
    return f"transferred to {to}"


@function_tool(raw_schema={"name": "lookup_order", "description": "An order by its number.",
                           "parameters": {"type": "object", "properties": {"number": {"type": "integer"}},
                                          "required": ["number"], "additionalProperties": False}})
async def lookup_order(raw_arguments: dict[str, Any]) -> str:
    RUNS.calls.append(("lookup_order", dict(raw_arguments)))
    return f"order {raw_arguments['number']} is on its way"


@after_heard
@function_tool
async def hang_up(ctx: ToolContext) -> str:
    """End the call, once the goodbye is heard."""
    RUNS.calls.append(("hang_up", {}))
    RUNS.contexts.append(ctx)
    await ctx.control.hang_up("the caller said goodbye")
    return "hung up"
