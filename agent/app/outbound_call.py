"""An outbound call in a LiveKit job: the job's room is served while the call is placed.

The room call starts first, serving only the dialled party: LiveKit puts them in the room
while it dials, so the agent is listening before they answer. Answered, the call ends when
they hang up, and the agent may say a greeting first; it speaks first anyway when no one has
spoken for a while after the answer. A voicemail box is hung up on, or left
the request's message after its beep. The model says a greeting or a message itself (its
``speaks_given_text``); a model that cannot has the call refused before anyone is dialled.
Not answered (busy, declined, no answer, an unknown trunk...), the reason goes to the log as one line, to /metrics
(``duplex_dial_outcomes``) and to the room as an ``error`` event on ``duplex.events``
(code ``dial_<reason>``), and the job ends cleanly.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from livekit import api

from duplex_agent.agent import metrics
from duplex_agent.agent.app.voicemail_screen import GREETING_LIMIT_S, VoicemailScreen
from duplex_agent.agent.protocol import events as p
from duplex_agent.agent.telephony.amd import Verdict
from duplex_agent.agent.telephony.dial_outcome import DialFailed
from duplex_agent.agent.telephony.dial_request import DialRequest
from duplex_agent.agent.telephony.quiet_answer import PROMPT
from duplex_agent.webrtc.livekit.room import LiveKitRoomCall
from duplex_agent.webrtc.livekit.sip_dial import place_call

log = logging.getLogger("duplex_agent.livekit")


async def dial_out(lkapi: api.LiveKitAPI, call: LiveKitRoomCall, request: DialRequest) -> None:
    """Place ``request`` into ``call``'s room while ``call`` serves it; end ``call`` if no one answers."""
    room = call.room.name
    unsaid = unsayable(call, request)
    if unsaid is not None:
        metrics.DIAL_OUTCOMES.labels("invalid_request").inc()
        log.error("room %s: not dialing %s: %s", room, request.number, unsaid)
        call.tell_room(p.ErrorEvent.of("dial_invalid_request", unsaid, error_type="call_error"))
        await call.close("dial_invalid_request")
        return
    log.info("room %s: dialing %s through trunk %s", room, request.number, request.trunk)
    placed = time.monotonic()
    try:
        info = await place_call(lkapi, room, request)
    except DialFailed as exc:
        metrics.DIAL_OUTCOMES.labels(exc.reason).inc()
        log.warning("room %s: %s", room, exc)
        call.tell_room(p.ErrorEvent.of(f"dial_{exc.reason}", str(exc), error_type="call_error"))
        await call.close(f"dial_{exc.reason}")
        return
    metrics.DIAL_OUTCOMES.labels("answered").inc()
    log.info("room %s: %s answered after %.1f s (SIP call %s)", room, request.number,
             time.monotonic() - placed, info.sip_call_id)
    answered = asyncio.get_running_loop().time()  # the loop's clock, which the quiet-line wait reads too

    def far_end_left(during_greeting: bool) -> None:
        if not during_greeting:  # the call's own end: "caller ... left" says it
            return
        after = asyncio.get_running_loop().time() - answered
        # A hang-up before the greeting was heard whole is an outcome of its own: a dashboard
        # tells it from calls that were answered and talked.
        metrics.DIAL_OUTCOMES.labels("hung_up_during_greeting").inc()
        message = f"{request.number} hung up {after:.1f} s after answering, during the agent's greeting"
        log.warning("room %s: %s", room, message)
        call.tell_room(p.ErrorEvent.of("dial_hung_up_during_greeting", message, error_type="call_error"))

    call.on_wanted_caller_left = far_end_left
    call.end_once_served()
    if request.voicemail:
        await screen_for_voicemail(lkapi, call, request, answered)
    elif request.agent_speaks_first:
        call.speak_first(request.greeting)
    else:
        speak_into_quiet(call, request, answered)


def speak_into_quiet(call: LiveKitRoomCall, request: DialRequest, answered: float) -> None:
    """The agent speaks first if the answered line stays quiet (``quiet_answer.py``), when the
    request allows it and the model can say a given text (one that cannot answers when spoken to)."""
    if request.quiet_answer_s > 0 and call.backend.capabilities.speaks_given_text:
        call.speak_if_quiet(request.greeting or PROMPT, request.quiet_answer_s, since=answered)


def unsayable(call: LiveKitRoomCall, request: DialRequest) -> str | None:
    """Why the call's model cannot say what ``request`` asks it to say (a greeting, a voicemail
    message), checked before anyone is called; None when it can, or nothing is asked."""
    asks = [what for what, asked in (("--agent-speaks-first", request.agent_speaks_first),
                                     ("--voicemail leave_message", request.voicemail == "leave_message")) if asked]
    if not asks or call.backend.capabilities.speaks_given_text:
        return None
    return (f"the model {call.backend.capabilities.plugin_id!r} cannot say a given text, which "
            f"{' and '.join(asks)} need")


async def screen_for_voicemail(lkapi: api.LiveKitAPI, call: LiveKitRoomCall, request: DialRequest,
                               answered: float) -> None:
    """Tell a person from a voicemail box, then follow the request's policy (``answered``: the
    answer's loop time)."""
    screen = VoicemailScreen()
    call.caller_audio_tap = screen.push
    room = call.room.name
    decision = await screen.decided()
    if decision is None:
        return
    log.info("room %s: %s answered (%s; decided %.1f s into the greeting)", room, decision.verdict.value,
             decision.reason, decision.after_greeting_s)
    if decision.verdict is Verdict.HUMAN:
        call.caller_audio_tap = None
        if request.agent_speaks_first:
            call.speak_first(request.greeting)
        else:
            speak_into_quiet(call, request, answered)
        return
    left = "hung up"
    if request.voicemail == "leave_message":
        call.mute_caller()  # the model is not to answer the greeting
        if await screen.greeting_over():
            if await call.say(request.voicemail_message):
                await call.let_voice_arrive()
                left = "left its message after the beep and hung up"
                log.info("room %s: the voicemail message was left", room)
            else:
                log.warning("room %s: the voicemail message was not played to its end", room)
        else:
            log.warning("room %s: the voicemail greeting did not end in %g s; hanging up without a message", room,
                        GREETING_LIMIT_S)
    call.caller_audio_tap = None
    metrics.DIAL_OUTCOMES.labels("voicemail").inc()
    call.tell_room(p.ErrorEvent.of("dial_voicemail", f"voicemail answered the call to {request.number}; the agent "
                                   f"{left}", error_type="call_error"))
    try:
        await lkapi.room.remove_participant(api.RoomParticipantIdentity(room=room, identity=request.participant_identity))
    except (api.ServerError, aiohttp.ClientError, TimeoutError) as exc:
        log.warning("room %s: hanging up on voicemail failed (%s); the agent leaves the call", room, exc)
    await call.close("voicemail")
