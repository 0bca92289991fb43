"""A module with functions, none of them a tool."""

instructions = "There are no tools here."


async def get_weather(city: str) -> str:
    return f"sunny in {city}"
