"""TranscriptDeltas, the joining both transports use: nothing lost, order kept, one send per period."""

import asyncio

from duplex_agent.agent.protocol.events import ResponseTranscriptDelta
from duplex_agent.webrtc.media.transcript_deltas import TranscriptDeltas


def delta(text: str, response: str = "r1") -> ResponseTranscriptDelta:
    return ResponseTranscriptDelta(response, f"item-{response}", text)


async def test_words_of_one_response_go_out_joined_once_a_period():
    sent: list[ResponseTranscriptDelta] = []
    flushed = asyncio.Event()
    deltas = TranscriptDeltas(lambda d: (sent.append(d), flushed.set()), period_s=0.05)
    for word in ("Hello ", "there, ", "how ", "are ", "you?"):
        deltas.hold(delta(word))
    assert sent == []  # held until the period ends
    await asyncio.wait_for(flushed.wait(), 5)
    assert [(d.response_id, d.delta) for d in sent] == [("r1", "Hello there, how are you?")]


async def test_a_flush_sends_what_is_held_in_order_and_each_response_apart():
    sent: list[ResponseTranscriptDelta] = []
    deltas = TranscriptDeltas(sent.append, period_s=60)
    deltas.hold(delta("one ", "r1"))
    deltas.hold(delta("two", "r1"))
    deltas.hold(delta("three", "r2"))
    deltas.flush()  # another event is about to go out
    assert [(d.response_id, d.delta) for d in sent] == [("r1", "one two"), ("r2", "three")]
    deltas.flush()
    assert len(sent) == 2  # nothing held: nothing sent


async def test_the_next_period_starts_from_the_last_send():
    sent: list[float] = []
    loop = asyncio.get_running_loop()
    second = asyncio.Event()
    deltas = TranscriptDeltas(lambda d: (sent.append(loop.time()), len(sent) == 2 and second.set()), period_s=0.1)
    deltas.hold(delta("a"))
    deltas.flush()
    deltas.hold(delta("b"))  # right after a send: waits out the period
    await asyncio.wait_for(second.wait(), 5)
    assert sent[1] - sent[0] >= 0.1 - 0.01


async def test_cancel_keeps_what_is_held_for_the_next_flush():
    sent: list[ResponseTranscriptDelta] = []
    deltas = TranscriptDeltas(sent.append, period_s=0.01)
    deltas.hold(delta("kept"))
    deltas.cancel()
    later = asyncio.Event()  # a timer due after the cancelled one: the loop runs timers in order
    asyncio.get_running_loop().call_later(0.02, later.set)
    await asyncio.wait_for(later.wait(), 5)
    assert sent == []
    deltas.flush()
    assert [d.delta for d in sent] == ["kept"]
