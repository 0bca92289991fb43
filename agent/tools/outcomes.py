"""How a model's function call ends: the tool's answer, or an error output saying why not.

Each refusal reason is the ``code`` of the error output the model reads (``error_output``)
and the ``reason`` label of the failure metric, so a log line, a graph and what the model was told
name the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

from duplex_agent.agent.protocol.tools import error_output

UNKNOWN_TOOL = "unknown_tool"
INVALID_ARGUMENTS = "invalid_arguments"
TOO_MANY_CALLS = "too_many_calls"
TOOL_ERROR = "tool_error"  # the tool raised livekit-agents' ToolError: its message is for the model
TOOL_FAILED = "tool_failed"  # any other exception: the model is told only that it failed
TOOL_TIMEOUT = "tool_timeout"
CALLER_INTERRUPTED = "caller_interrupted"
TOOL_CANCELLED = "tool_cancelled"  # the call's transport went away while the tool ran (a resume may follow)
REASONS = (UNKNOWN_TOOL, INVALID_ARGUMENTS, TOO_MANY_CALLS, TOOL_ERROR, TOOL_FAILED, TOOL_TIMEOUT, CALLER_INTERRUPTED,
           TOOL_CANCELLED)


class ToolCallRefused(Exception):
    """A call that gets an error output; ``str(exc)`` is a sentence the model can act on."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    def output(self) -> str:
        return error_output(self.code, str(self))


@dataclass(frozen=True, slots=True)
class ToolAnswer:
    """What goes back to the model as the call's ``function_call_output``."""

    output: str
    #: False: the tool asked for no spoken reply (livekit-agents' ``StopResponse``, or a
    #: ``ToolResult`` with ``reply_required=False``); the output still goes into the history.
    reply_required: bool = True
