"""``after_heard``: a tool whose effect cannot be taken back (a transfer, a hang-up, a payment).

The edge runner holds such a call until the caller has heard everything the agent said before it
("I'll transfer you now"), and does not make it at all when the caller talked over those words:
the model is told the caller interrupted, and can ask again.

Either order works with livekit-agents' decorator::

    @after_heard
    @function_tool
    async def hang_up(ctx: ToolContext) -> str: ...
"""

from __future__ import annotations

from typing import Any, TypeVar

_T = TypeVar("_T")
_MARK = "__duplex_after_heard__"


def after_heard(tool: _T) -> _T:
    """Mark ``tool`` (a function tool, or the function before ``@function_tool``) as after-heard."""
    setattr(tool, _MARK, True)
    # livekit-agents rebuilds a tool from its function when it is bound to an object (a method of a
    # class), copying only the function's attributes: the mark goes on the function too.
    wrapped = getattr(tool, "__wrapped__", None)
    if wrapped is not None:
        setattr(wrapped, _MARK, True)
    return tool


def is_after_heard(tool: Any) -> bool:
    return getattr(tool, _MARK, False) is True
