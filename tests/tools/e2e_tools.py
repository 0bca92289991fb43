"""The tools of the end-to-end calls: the weather, and a hang-up that cannot be taken back."""

from __future__ import annotations

from livekit.agents import function_tool

from duplex_agent.agent.tools import ToolContext, after_heard

instructions = "Call get_weather for the weather. Say goodbye before you hang up."

#: The hang-ups made (the worker runs in the test's process): what the test checks.
HUNG_UP: list[str] = []


@function_tool
async def get_weather(city: str) -> str:
    """The weather in a city now.

    Args:
        city: the city's name
    """
    return f"It is sunny and 21 degrees in {city}."


@after_heard
@function_tool
async def hang_up(ctx: ToolContext) -> str:
    """End the call, once the goodbye is heard."""
    HUNG_UP.append(ctx.caller_identity)
    await ctx.control.hang_up("the caller is done")
    return "the call is over"
