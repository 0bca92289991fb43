"""``--tools``: the peer's Qwen3-Omni plugin taught to call tools, at the hooks vLLM-Omni 0.30.0 has for them.

vLLM-Omni 0.30.0 carries tools on its wire for every plugin, but only Nemotron VoiceChat's
calls them (its frame-locked, resumable stage 0 cannot be scripted here); Qwen3-Omni's refuses
them at ``session.update``. So with ``--tools`` the scripted model's plugin takes them, through
the plugin interface vLLM-Omni defines, and nothing else changes:

- ``validate_client_extra_body`` lets ``realtime_tools`` through (its other refusals stay);
- ``runtime_config_for_update`` keeps the session's tools and ``tool_choice`` in the runtime
  config, and ``runtime_config_for_function_output`` (the hook vLLM-Omni calls for a client's
  ``function_call_output``, as Nemotron's plugin uses it) adds each output there;
- ``plan_append`` hands them to the scripted thinker beside the rendered prompt, with the calls
  per reply a session's ``metadata`` may ask for (``scripted_calls_per_reply``);
- the data plane's ``project`` turns a thinker's call text (``scripted_calls``) into
  vLLM-Omni's ``function_call`` model results, the ones Nemotron's data plane yields.

From there on it is vLLM-Omni's own path: ``model_channel`` emits ``function_call.done``,
``realtime_events`` projects it into the call's response and checks the outputs, and
``control`` spawns its continuation after an output.
"""

from __future__ import annotations

from vllm_omni.model_executor.models.qwen3_omni.duplex.plugin import Qwen3OmniDuplexPlugin, QwenDataPlane

from devtools.omni_peer.scripted_calls import (
    CALLS_KEY,
    CALLS_METADATA,
    OUTPUTS_KEY,
    TOOL_CHOICE_KEY,
    TOOLS_KEY,
    decode_calls,
)

_RUNTIME_TOOLS = "scripted_tools"
_RUNTIME_TOOL_CHOICE = "scripted_tool_choice"
_RUNTIME_OUTPUTS = "scripted_tool_outputs"
_RUNTIME_CALLS = "scripted_calls_per_reply"


def install() -> None:
    """Patch the plugin's hooks (process-wide: this process serves only the peer)."""
    validate = Qwen3OmniDuplexPlugin.validate_client_extra_body
    for_update = Qwen3OmniDuplexPlugin.runtime_config_for_update
    plan_append = Qwen3OmniDuplexPlugin.plan_append
    project = QwenDataPlane.project

    def validate_client_extra_body(self, extra_body):
        if isinstance(extra_body, dict):
            extra_body = {key: value for key, value in extra_body.items() if key != "realtime_tools"}
        return validate(self, extra_body)

    def runtime_config_for_update(self, config, current):
        runtime = for_update(self, config, current)
        runtime[_RUNTIME_TOOLS] = config.extra_body.get("realtime_tools")
        runtime[_RUNTIME_TOOL_CHOICE] = config.extra_body.get("realtime_tool_choice")
        runtime[_RUNTIME_OUTPUTS] = list(current.get(_RUNTIME_OUTPUTS) or [])
        metadata = config.extra_body.get("realtime_metadata")
        runtime[_RUNTIME_CALLS] = metadata.get(CALLS_METADATA) if isinstance(metadata, dict) else None
        return runtime

    def runtime_config_for_function_output(self, config, current, item):
        del config
        outputs = [*(current.get(_RUNTIME_OUTPUTS) or []), {"call_id": item.get("call_id"),
                                                            "output": item.get("output")}]
        return {**current, _RUNTIME_OUTPUTS: outputs}

    def scripted_plan_append(self, *, runtime_config, **kwargs):
        plan = plan_append(self, runtime_config=runtime_config, **kwargs)
        plan.prompt[TOOLS_KEY] = runtime_config.get(_RUNTIME_TOOLS)
        plan.prompt[TOOL_CHOICE_KEY] = runtime_config.get(_RUNTIME_TOOL_CHOICE)
        plan.prompt[OUTPUTS_KEY] = runtime_config.get(_RUNTIME_OUTPUTS)
        plan.prompt[CALLS_KEY] = runtime_config.get(_RUNTIME_CALLS)
        return plan

    def project_calls(self, result, *, context=None):
        for model_result in project(self, result, context=context):
            calls = decode_calls(str(model_result.get("text") or ""))
            if calls is None:
                yield model_result
                continue
            for call in calls:
                yield {"stage_role": "function", "data_plane_request_id": model_result["data_plane_request_id"],
                       "function_call": True, **call.as_dict()}

    Qwen3OmniDuplexPlugin.validate_client_extra_body = validate_client_extra_body
    Qwen3OmniDuplexPlugin.runtime_config_for_update = runtime_config_for_update
    Qwen3OmniDuplexPlugin.runtime_config_for_function_output = runtime_config_for_function_output
    Qwen3OmniDuplexPlugin.plan_append = scripted_plan_append
    QwenDataPlane.project = project_calls

