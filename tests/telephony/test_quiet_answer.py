"""An answered call where no one speaks: ``QuietLine`` on a virtual clock says when the agent
should speak first, and that anyone speaking (the called party, or the agent's own reply) means it
should not."""

from __future__ import annotations

import asyncio

from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.telephony.quiet_answer import QuietLine
from tests.support.virtual_time import run_virtual


def line() -> QuietLine:
    return QuietLine(lambda: asyncio.get_running_loop().time())


def test_a_quiet_line_is_told_quiet_when_the_wait_is_over_and_not_before():
    async def main() -> tuple[bool, float]:
        quiet = line()
        quiet.observe(p.ResponseAudioDone("resp_1", "item_1"))  # not speech: the line stays quiet
        told = await quiet.quiet_for(4.0, since=1.5)
        return told, asyncio.get_running_loop().time()

    assert run_virtual(main()) == (True, 5.5)


def test_the_called_party_speaking_in_the_wait_ends_it_at_once():
    async def main() -> tuple[bool, float]:
        quiet = line()
        loop = asyncio.get_running_loop()
        loop.call_later(2.0, quiet.observe, p.SpeechStarted(2000, "item_1"))
        told = await quiet.quiet_for(4.0, since=0.0)
        return told, loop.time()

    assert run_virtual(main()) == (False, 2.0)


def test_speech_before_the_answer_does_not_count_but_a_reply_after_it_does():
    async def main() -> list[bool]:
        quiet = line()
        loop = asyncio.get_running_loop()
        quiet.observe(p.SpeechStarted(0, "item_1"))  # ringing: not the called party's greeting
        await asyncio.sleep(1.0)
        before = await quiet.quiet_for(2.0, since=1.0)
        quiet.observe(p.ResponseCreated("resp_1", "item_2"))  # the agent answered: the line is not quiet
        after = await quiet.quiet_for(2.0, since=loop.time())
        already = await quiet.quiet_for(2.0, since=1.0)
        return [before, after is False and loop.time() == 3.0, already]

    assert run_virtual(main()) == [True, True, False]
