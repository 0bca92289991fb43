"""``duplex-agent dial NUMBER --trunk ST_...``: an outbound call, placed by a worker.

The command creates a room, checks the trunk exists, and dispatches the worker's agent name
to the room with the call in the job's metadata (``{"dial": {...}}``); the worker that takes
the job places the call and serves it. The command returns once the job is dispatched; the
call's outcome is in the worker's log, its /metrics and the room's events.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import sys

import aiohttp

from duplex_agent.agent.app.settings import Settings
from duplex_agent.agent.telephony.dial_request import DEFAULT_RINGING_TIMEOUT_S, DialRequest, DialRequestError
from duplex_agent.agent.telephony.quiet_answer import DEFAULT_QUIET_ANSWER_S


def add_dial_arguments(parser: argparse.ArgumentParser) -> None:
    call = parser.add_argument_group("the call")
    call.add_argument("number", help="the number to call, E.164 (+15551234567)")
    call.add_argument("--trunk", required=True, help="the LiveKit outbound SIP trunk to call through (ST_...)")
    call.add_argument("--caller-id", default="", help="the number the call comes from (default: the trunk's)")
    call.add_argument("--dtmf", default="", help="keys to dial once answered, e.g. an extension (w: wait 0.5 s)")
    call.add_argument("--ringing-timeout", type=float, default=DEFAULT_RINGING_TIMEOUT_S,
                      help="seconds to let it ring (1-80); default: %(default)s")
    call.add_argument("--max-duration", type=float, default=0.0,
                      help="seconds the call may last at most (0: no limit); default: %(default)s")
    call.add_argument("--agent-speaks-first", action="store_true",
                      help="the agent says --greeting as soon as the call is answered")
    call.add_argument("--greeting", default="",
                      help="what --agent-speaks-first says, and what the agent says into a quiet line")
    call.add_argument("--quiet-answer", type=float, default=DEFAULT_QUIET_ANSWER_S,
                      help="answered, and no one speaks for this many seconds: the agent speaks first "
                           "(--greeting, or a short hello; 0: never); default: %(default)s")
    call.add_argument("--voicemail", choices=("hang_up", "leave_message"), default="",
                      help="when voicemail answers: hang up, or leave --voicemail-message after the beep "
                           "(default: talk to it as to a person)")
    call.add_argument("--voicemail-message", default="", help="what --voicemail leave_message says")
    call.add_argument("--room", default="", help="the room to call from (default: a new one, call-<random>)")


def dial_request(args: argparse.Namespace) -> DialRequest:
    return DialRequest(number=args.number, trunk=args.trunk, caller_id=args.caller_id, dtmf=args.dtmf,
                       ringing_timeout_s=args.ringing_timeout, max_duration_s=args.max_duration,
                       agent_speaks_first=args.agent_speaks_first, greeting=args.greeting,
                       quiet_answer_s=args.quiet_answer, voicemail=args.voicemail,
                       voicemail_message=args.voicemail_message)


def run_dial(settings: Settings, args: argparse.Namespace) -> int:
    """Check the request and the settings, then dispatch; a clear line and exit 2 for bad input."""
    try:
        request = dial_request(args)
    except DialRequestError as exc:
        print(f"duplex-agent dial: {exc}", file=sys.stderr)
        return 2
    from duplex_agent.agent.app.livekit_worker import CredentialsError, check_credentials

    try:
        check_credentials(settings)
    except CredentialsError as exc:
        print(f"duplex-agent dial: {exc} (dial asks the LiveKit server to place the call)", file=sys.stderr)
        return 2
    room = args.room or f"call-{secrets.token_hex(4)}"
    return asyncio.run(_dispatch(settings, request, room))


async def _dispatch(settings: Settings, request: DialRequest, room: str) -> int:
    from livekit import api
    from livekit.protocol import agent_dispatch
    from livekit.protocol import room as room_pb
    from livekit.protocol import sip as sip_pb

    try:
        async with api.LiveKitAPI(settings.livekit_url, settings.livekit_api_key, settings.livekit_api_secret) as lkapi:
            trunks = await lkapi.sip.list_outbound_trunk(sip_pb.ListSIPOutboundTrunkRequest(trunk_ids=[request.trunk]))
            if not any(t.sip_trunk_id == request.trunk for t in trunks.items):
                print(f"duplex-agent dial: LiveKit has no outbound trunk {request.trunk!r}", file=sys.stderr)
                return 2
            await lkapi.room.create_room(room_pb.CreateRoomRequest(name=room))
            dispatch = await lkapi.agent_dispatch.create_dispatch(agent_dispatch.CreateAgentDispatchRequest(
                agent_name=settings.agent_name, room=room, metadata=request.to_metadata()))
    except api.ServerError as exc:
        print(f"duplex-agent dial: LiveKit refused: {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except (aiohttp.ClientError, TimeoutError) as exc:
        print(f"duplex-agent dial: cannot reach LiveKit at {settings.livekit_url}: {exc or type(exc).__name__}",
              file=sys.stderr)
        return 1
    print(f"duplex-agent dial: calling {request.number} from room {room} (dispatch {dispatch.id} to agent "
          f"{settings.agent_name!r}); the outcome is in the worker's log and /metrics", flush=True)
    return 0
