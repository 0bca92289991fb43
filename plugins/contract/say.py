"""A response that says a given text word for word: our extra on ``response.create``.

``{"type": "response.create", "response": {"say": "Hello, this is ..."}}`` asks a model whose
capabilities have ``speaks_given_text`` to say exactly that, in its own voice, as its next reply:
a greeting from the settings, a voicemail message. The words go into the conversation as the
model's own (what the caller heard of them). vLLM-Omni has no such field; it is never sent to a
vLLM-Omni server, and a vLLM-Omni client never sends it.
"""

from __future__ import annotations

from collections.abc import Mapping

#: The ``response.create`` field, and the key the runner hands a plugin's continuation plan it under.
RESPONSE_SAY = "say"
#: The longest text one response says (about a minute of speech).
MAX_SAY_CHARS = 1000


def text_to_say(response_options: Mapping[str, object]) -> str | None:
    """The text a continuation's response options ask the model to say, if any."""
    text = response_options.get(RESPONSE_SAY)
    return text if isinstance(text, str) and text.strip() else None
