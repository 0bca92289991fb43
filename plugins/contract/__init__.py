"""The model-plugin contract for full-duplex models.

Follows vLLM-Omni's duplex plugin contract member by member (names and meaning),
so that an author of a vLLM-Omni plugin finds the same hooks here. One
``DuplexModelPlugin`` subclass describes one model: its engine policy (how input
becomes stage requests, what stage outputs mean) and its session policy
(capabilities, runtime configuration, per-session state, event projection).
The session runner in ``agent/`` drives it; a plugin never sees a transport.

The contract is split by role: ``types`` (values and errors), ``buffers`` (append
buffer), ``state`` (per-session model state), ``data_plane``, ``plugin`` and
``loading``, ``options`` (a plugin's own flags) and ``tools`` (where a session's tools
reach a plugin), ``say`` (a response that says a given text); everything is importable from this package.
"""

from duplex_agent.plugins.contract.buffers import PcmAppendBuffer, PcmAppendReservation
from duplex_agent.plugins.contract.data_plane import (
    FUNCTION_CALL,
    FUNCTION_CALL_DONE,
    DuplexDataPlane,
    EncodeAudio,
    project_function_call,
)
from duplex_agent.plugins.contract.loading import (
    PluginNotFoundError,
    duplex_plugin_type,
    load_duplex_plugin,
    validate_duplex_plugin_sampling,
)
from duplex_agent.plugins.contract.options import option
from duplex_agent.plugins.contract.plugin import DuplexModelPlugin, PartialStageForward
from duplex_agent.plugins.contract.say import RESPONSE_SAY, text_to_say
from duplex_agent.plugins.contract.state import DefaultDuplexModelSessionState, DuplexModelSessionState
from duplex_agent.plugins.contract.tools import (
    REALTIME_RESPONSE_TOOL_CHOICE,
    REALTIME_RESPONSE_TOOLS,
    REALTIME_TOOL_CHOICE,
    REALTIME_TOOLS,
    tools_in_effect,
)
from duplex_agent.plugins.contract.types import (
    DuplexAppendPlan,
    DuplexCapabilities,
    DuplexFence,
    DuplexOutputDecision,
    DuplexRuntimeConfigError,
    DuplexSessionConfig,
    PrivateRuntimeKeyError,
    coerce_int,
    payload_turn_id,
    reject_changed_runtime_value,
    reject_private_runtime_keys,
)

__all__ = [
    "FUNCTION_CALL",
    "FUNCTION_CALL_DONE",
    "REALTIME_RESPONSE_TOOLS",
    "REALTIME_RESPONSE_TOOL_CHOICE",
    "REALTIME_TOOLS",
    "REALTIME_TOOL_CHOICE",
    "RESPONSE_SAY",
    "DefaultDuplexModelSessionState",
    "DuplexAppendPlan",
    "DuplexCapabilities",
    "DuplexDataPlane",
    "DuplexFence",
    "DuplexModelPlugin",
    "DuplexModelSessionState",
    "DuplexOutputDecision",
    "DuplexRuntimeConfigError",
    "DuplexSessionConfig",
    "EncodeAudio",
    "PartialStageForward",
    "PcmAppendBuffer",
    "PcmAppendReservation",
    "PluginNotFoundError",
    "PrivateRuntimeKeyError",
    "coerce_int",
    "duplex_plugin_type",
    "load_duplex_plugin",
    "option",
    "payload_turn_id",
    "project_function_call",
    "reject_changed_runtime_value",
    "reject_private_runtime_keys",
    "text_to_say",
    "tools_in_effect",
    "validate_duplex_plugin_sampling",
]
