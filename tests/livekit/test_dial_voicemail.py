"""A dial request that screens for voicemail: a voicemail box is hung up on within seconds of its
greeting's start; a person who answers is left to talk, and one who answers and says nothing is
spoken to first."""

from __future__ import annotations

import re

import numpy as np

from devtools.livekit_server.sip import Phone
from devtools.phone_greetings import MACHINE_GREETINGS, beep, quiet
from devtools.speech import espeak, speak
from duplex_agent.agent.telephony.amd import NO_GREETING_S
from duplex_agent.agent.telephony.dial_request import DialRequest
from tests.livekit.conftest import AGENT_NAME
from tests.support.heard import heard_to_the_end, loud_since, phone_heard, replied_and_quiet, spoken_to_first
from tests.support.waits import until

MACHINE = "+15551230003"
PERSON = "+15551230004"
SAYS_NOTHING = "+15551230007"


async def test_voicemail_is_hung_up_on_and_a_person_is_not_even_one_who_says_nothing(livekit_server, ready_worker):
    worker = await ready_worker()
    trunk = await livekit_server.add_sip_trunk()
    greeting = np.concatenate([quiet(0.3), espeak(MACHINE_GREETINGS[2], 48000), quiet(0.4), beep(), quiet(2.0)])
    await livekit_server.add_phone(MACHINE, Phone(rings_for_s=0.5, greeting=greeting, noise_dbfs=-50.0))
    await livekit_server.add_phone(PERSON, Phone(rings_for_s=0.5, greeting=speak("Hello?", 48000), noise_dbfs=-45.0))

    await livekit_server.create_dispatch("vm-call", AGENT_NAME, DialRequest(MACHINE, trunk, voicemail="hang_up").to_metadata())
    await until(lambda: (c := livekit_server.sip_call_to(MACHINE)) is not None and c.ended_at is not None, 60,
                "the agent to hang up on the voicemail box")
    call = livekit_server.sip_call_to(MACHINE)
    assert call.ended_by == "room" and call.answered_at is not None
    # Told on the audio's own clock within 3 s of the greeting's first word, and hung up on long
    # before the greeting (about 10 s) and its beep were over.
    decided = re.search(r"machine answered \(.*; decided ([0-9.]+) s into the greeting\)", worker.log())
    assert decided and float(decided.group(1)) <= 3.0, worker.log()[-1500:]
    first_word = next(h.at for h in call.said if float(np.abs(h.samples).max()) > 0.05)
    assert call.ended_at - first_word < 8.0, call.ended_at - first_word

    await livekit_server.create_dispatch("person-call", AGENT_NAME, DialRequest(PERSON, trunk, voicemail="hang_up").to_metadata())
    await until(lambda: "human answered" in worker.log(), 60, "the person to be told from a machine")
    person = livekit_server.sip_call_to(PERSON)
    assert person is not None and person.ended_at is None
    await livekit_server.phone_hang_up(person.call_id)

    # A person who answers and says nothing: screened as a person once the line was quiet for
    # the screen's wait, which is longer than the request's, so the agent speaks at once.
    request = DialRequest(SAYS_NOTHING, trunk, voicemail="hang_up", quiet_answer_s=2.0)
    await livekit_server.add_phone(SAYS_NOTHING, Phone(rings_for_s=0.5, noise_dbfs=-45.0))
    await livekit_server.create_dispatch("says-nothing-call", AGENT_NAME, request.to_metadata())
    await until(lambda: replied_and_quiet(livekit_server.sip_call_to(SAYS_NOTHING)), 60, "the agent to speak first")
    spoken_to_first(livekit_server.sip_call_to(SAYS_NOTHING), NO_GREETING_S)
    await livekit_server.phone_hang_up(livekit_server.sip_call_to(SAYS_NOTHING).call_id)
    assert "Traceback" not in worker.log()


LEAVES_MESSAGE = "+15551230005"
SILENT = "+15551230006"
MESSAGE = "This is the dental office. Please call us back about your appointment tomorrow."
GREETING = "Hello, this is the pharmacy calling about your prescription."


async def test_voicemail_gets_the_message_after_the_beep_and_a_silent_person_is_greeted(
        livekit_server, ready_worker):
    worker = await ready_worker()
    trunk = await livekit_server.add_sip_trunk()
    greeting = np.concatenate([quiet(0.3), espeak(MACHINE_GREETINGS[2], 48000), quiet(0.4), beep(), quiet(1.0)])
    await livekit_server.add_phone(LEAVES_MESSAGE, Phone(rings_for_s=0.5, greeting=greeting, noise_dbfs=-50.0))
    await livekit_server.add_phone(SILENT, Phone(rings_for_s=0.5))

    request = DialRequest(LEAVES_MESSAGE, trunk, voicemail="leave_message", voicemail_message=MESSAGE)
    await livekit_server.create_dispatch("vm-message", AGENT_NAME, request.to_metadata())
    await until(lambda: (c := livekit_server.sip_call_to(LEAVES_MESSAGE)) is not None and c.ended_at is not None,
                120, "the agent to leave its message and hang up")
    call = livekit_server.sip_call_to(LEAVES_MESSAGE)
    assert call.ended_by == "room", call.ended_by
    # The beep: the last loud stretch the phone said; the agent said nothing until it was over.
    said_loud = [h.at for h in call.said if float(np.abs(h.samples).max()) > 0.05]
    beep_over = said_loud[-1]
    assert not loud_since(call, 0.0) or loud_since(call, 0.0)[0] > beep_over, "the agent spoke over the greeting"
    # the message, to its last word, before the hang-up (Whisper through the line misses a word now and then)
    after_beep = phone_heard(call, since=beep_over)
    assert heard_to_the_end(after_beep, MESSAGE), after_beep
    assert "voicemail message was left" in worker.log()

    # A person who answers and waits: the agent speaks first, its greeting word for word.
    request = DialRequest(SILENT, trunk, agent_speaks_first=True, greeting=GREETING)
    await livekit_server.create_dispatch("greet-call", AGENT_NAME, request.to_metadata())

    await until(lambda: replied_and_quiet(livekit_server.sip_call_to(SILENT)), 120, "the agent's greeting, said to its end")
    person = livekit_server.sip_call_to(SILENT)
    heard = phone_heard(person)
    assert heard_to_the_end(heard, GREETING), heard
    await livekit_server.phone_hang_up(person.call_id)

    assert "Traceback" not in worker.log()
