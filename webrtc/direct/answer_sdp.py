"""What our SDP answer asks of the caller's Opus sender beyond what aiortc writes.

aiortc answers Opus with a bare ``a=rtpmap`` and no ``a=fmtp`` line. A libwebrtc caller
(Chrome, Safari, Firefox's WebRTC, phone apps) sets its encoder from the answer's format
parameters (RFC 7587): without ``useinbandfec=1`` it sends no in-band FEC, and the
receive buffer can only conceal a lost packet, never recover it from the next one.
"""

from __future__ import annotations

import re

#: RFC 7587 format parameters for the Opus we receive: in-band FEC on, 10 ms the shortest packet.
OPUS_FORMAT = {"minptime": "10", "useinbandfec": "1"}

_OPUS_RTPMAP = re.compile(r"^a=rtpmap:(\d+) opus/48000(?:/2)?$", re.IGNORECASE | re.MULTILINE)


def ask_for_opus_fec(sdp: str) -> str:
    """``sdp`` with each Opus payload type's ``a=fmtp`` carrying ``OPUS_FORMAT`` (added or merged)."""
    newline = "\r\n" if "\r\n" in sdp else "\n"
    lines = sdp.split(newline)
    for payload_type in _OPUS_RTPMAP.findall(sdp.replace("\r\n", "\n")):
        prefix = f"a=fmtp:{payload_type} "
        at = next((i for i, text in enumerate(lines) if text.startswith(prefix)), None)
        if at is None:
            rtpmap = next(i for i, text in enumerate(lines) if text.lower().startswith(f"a=rtpmap:{payload_type} "))
            lines.insert(rtpmap + 1, prefix + _format(OPUS_FORMAT))
        else:
            present = dict(_pair(p) for p in lines[at][len(prefix):].split(";") if p.strip())
            lines[at] = prefix + _format({**present, **OPUS_FORMAT})
    return newline.join(lines)


def _pair(parameter: str) -> tuple[str, str]:
    key, _, value = parameter.strip().partition("=")
    return key, value


def _format(parameters: dict[str, str]) -> str:
    return ";".join(f"{key}={value}" if value else key for key, value in parameters.items())
