"""A tool that is not async: it would block the call's loop."""

from livekit.agents import function_tool


@function_tool
def get_weather(city: str) -> str:
    """The weather."""
    return f"sunny in {city}"
