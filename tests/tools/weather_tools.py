"""One tool, as a user writes it (the README's example): `duplex-agent serve --tools tests.tools.weather_tools`."""

from livekit.agents import function_tool

instructions = "When asked about the weather, call get_weather and say what it returns."


@function_tool
async def get_weather(city: str) -> str:
    """The weather in a city now.

    Args:
        city: the city's name
    """
    return f"It is sunny and 21 degrees in {city}."
