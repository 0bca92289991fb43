"""Transfer targets and DTMF pacing, without a room."""

from __future__ import annotations

import pytest

from duplex_agent.agent.tools.call_control import CallControlError
from duplex_agent.webrtc.livekit.sip_actions import KEY_GAP_S, KEY_TONE_S, send_paced_dtmf, transfer_target


@pytest.mark.parametrize(("given", "target"), [
    ("+15551234567", "tel:+15551234567"),
    ("tel:+15551234567", "tel:+15551234567"),
    ("sip:frontdesk@pbx.example.com", "sip:frontdesk@pbx.example.com"),
])
def test_transfer_targets(given, target):
    assert transfer_target(given) == target


@pytest.mark.parametrize("given", ["5551234567", "tel:555", "frontdesk", "sip:nohost", ""])
def test_a_bad_target_is_refused_with_a_sentence(given):
    with pytest.raises(CallControlError) as refused:
        transfer_target(given)
    assert refused.value.code == "invalid_target" and "E.164" in str(refused.value)


class _Participant:
    def __init__(self, clock: list[float]) -> None:
        self.sent: list[tuple[float, int, str]] = []
        self._clock = clock

    async def publish_dtmf(self, *, code: int, digit: str) -> None:
        self.sent.append((self._clock[0], code, digit))


async def test_keys_are_paced_one_tone_and_gap_apart():
    clock = [0.0]

    async def sleep(seconds: float) -> None:
        clock[0] += seconds

    participant = _Participant(clock)
    await send_paced_dtmf(participant, "1*#D", sleep=sleep)  # type: ignore[arg-type]
    assert [(code, digit) for _, code, digit in participant.sent] == [(1, "1"), (10, "*"), (11, "#"), (15, "D")]
    times = [at for at, _, _ in participant.sent]
    assert all(b - a == pytest.approx(KEY_TONE_S + KEY_GAP_S) for a, b in zip(times, times[1:]))


async def test_bad_digits_send_nothing():
    participant = _Participant([0.0])
    with pytest.raises(CallControlError) as refused:
        await send_paced_dtmf(participant, "12x")  # type: ignore[arg-type]
    assert refused.value.code == "invalid_digits" and participant.sent == []
