"""--tools at start-up: a module's tools and instructions, its schemas from livekit-agents' builder,
and a clear start error (exit 2) for a module that cannot serve or a model that cannot call tools."""

from __future__ import annotations

from dataclasses import replace

import pytest

from duplex_agent.agent.app.cli import main
from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.app.tools_setup import load_edge_tools, require_tool_calls
from duplex_agent.agent.models.model_errors import ModelStartError
from duplex_agent.agent.tools.loading import ToolModuleError, load_tool_module
from duplex_agent.plugins.contract import DuplexCapabilities

CAPS = DuplexCapabilities(plugin_id="reference", input_sample_rate=16000, unit_samples=1280,
                          output_sample_rate=22050, max_sessions=1)


def test_a_module_gives_its_tools_with_their_schemas_and_instructions():
    module = load_tool_module("tests.tools.toolkit")
    names = [schema["name"] for schema in module.schemas]
    assert names[:3] == ["get_weather", "slow_lookup", "wait_for_release"]
    assert "lookup_order" in names and "transfer" in names
    weather = module.schemas[0]
    assert weather["type"] == "function" and weather["description"] == "The weather in a city now."
    assert weather["parameters"]["required"] == ["city"]
    assert weather["parameters"]["properties"]["city"]["description"] == "the city's name"
    # The context a tool asks for is no parameter the model fills.
    transfer = next(s for s in module.schemas if s["name"] == "transfer")
    assert list(transfer["parameters"]["properties"]) == ["to"]
    raw = next(s for s in module.schemas if s["name"] == "lookup_order")
    assert raw["parameters"]["required"] == ["number"]
    assert module.instructions.startswith("Look things up")


def test_a_module_that_does_not_import_is_named_with_the_reason():
    with pytest.raises(ToolModuleError) as caught:
        load_tool_module("tests.tools.broken_tools")
    message = str(caught.value)
    assert "tests.tools.broken_tools" in message and "does not import" in message
    assert "duplex_agent_no_such_dependency" in message


@pytest.mark.parametrize(("name", "says"), [
    ("tests.tools.no_tools", "holds no function tools"),
    ("tests.tools.sync_tools", "is not an async function"),
    ("tests.tools.there_is_no_such_module", "does not import"),
    ("tests/tools/toolkit.py", "not a module name"),
])
def test_a_module_that_cannot_serve_tools_says_why(name, says):
    with pytest.raises(ToolModuleError, match=says):
        load_tool_module(name)


def test_the_cli_stops_with_exit_2_naming_the_module(capsys):
    assert main(["serve", "--tools", "tests.tools.broken_tools", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--tools 'tests.tools.broken_tools'" in err and "does not import" in err


def test_settings_give_the_toolbox_its_timeout_and_hold_delay():
    box = load_edge_tools(replace(Settings(), tools="tests.tools.weather_tools", tool_timeout=3.0, hold_after=0.5))
    assert box is not None
    assert (box.options.timeout_s, box.options.hold_after_s) == (3.0, 0.5)
    assert box.names == ["get_weather"]
    assert load_edge_tools(Settings()) is None
    with pytest.raises(ValueError, match="tool timeout"):
        load_edge_tools(replace(Settings(), tools="tests.tools.weather_tools", tool_timeout=0.0))


def test_a_model_that_cannot_call_tools_refuses_the_start_and_says_what_would():
    box = load_edge_tools(replace(Settings(), tools="tests.tools.weather_tools"))
    with pytest.raises(ModelStartError) as caught:
        require_tool_calls(box, CAPS)
    assert "cannot call tools" in str(caught.value) and "--responder openai" in str(caught.value)
    with pytest.raises(ModelStartError, match="'moshi' cannot call tools$"):
        require_tool_calls(box, replace(CAPS, plugin_id="moshi"))
    require_tool_calls(box, replace(CAPS, supports_tools=True))
    require_tool_calls(None, CAPS)
