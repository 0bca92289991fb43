"""What the runner puts on each append payload for the plugin."""

from __future__ import annotations

from duplex_agent.agent.protocol.audio import as_float32_audio
from duplex_agent.plugins.contract import payload_turn_id
from duplex_agent.plugins.scripted import Script, ScriptedPlugin
from tests.support.audio import tone


async def test_each_append_payload_tells_the_plugin_its_user_turn(open_driver):
    """``payload["duplex_turn_id"]``, read with the contract's ``payload_turn_id``: the turn the audio is in."""
    seen: list[tuple[int | None, bool]] = []

    class Recording(ScriptedPlugin):
        async def prepare_append_plan(self, **kwargs):  # noqa: ANN003, ANN201
            seen.append((payload_turn_id(kwargs["payload"]), kwargs["final"]))
            return await super().prepare_append_plan(**kwargs)

    driver, _, _ = await open_driver(plugin=Recording(as_float32_audio, Script()))
    await driver.send({"type": "session.update", "session": {"turn_detection": None, "input_sample_rate": 16000}})
    await driver.until("session.created")
    for _ in range(2):
        await driver.append(tone(300))
        await driver.send({"type": "input_audio_buffer.commit"})
        await driver.until("response.done", timeout=30)
    finals = [i for i, (_, final) in enumerate(seen) if final]
    assert len(finals) == 2
    assert {turn for turn, _ in seen[: finals[0] + 1]} == {1}
    assert {turn for turn, _ in seen[finals[0] + 1:]} == {2}
