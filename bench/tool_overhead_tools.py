"""The tool of ``bench.tool_overhead``: the weather, after a fixed wait that stands for the lookup.

Its run time is known (``RUN_S``) and the worker measures it too (``duplex_tool_run_seconds``), so
the bench takes it out of what the caller waited and what is left is the tool path's own cost.
"""

from __future__ import annotations

import asyncio

from livekit.agents import function_tool

#: How long the lookup takes: long enough to be a real tool, short of the hold sound (1.5 s).
RUN_S = 0.2

instructions = "Call get_weather for the weather and say what it returns."


@function_tool
async def get_weather(city: str) -> str:
    """The weather in a city now.

    Args:
        city: the city's name
    """
    await asyncio.sleep(RUN_S)
    return f"Sunny in {city}."
