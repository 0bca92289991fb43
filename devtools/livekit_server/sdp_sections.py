"""SDP as lines per media section, for the codec settings the server writes into its SDP."""

from __future__ import annotations

import re

Section = list[str]  # an m= line and the lines under it; the first "section" is the session part


def split(sdp: str) -> list[Section]:
    sections: list[Section] = [[]]
    for line in sdp.split("\r\n"):
        if line.startswith("m="):
            sections.append([])
        sections[-1].append(line)
    return sections


def join(sections: list[Section]) -> str:
    return "\r\n".join(line for section in sections for line in section)


def is_live_audio(section: Section) -> bool:
    return bool(section) and section[0].startswith("m=audio") and "a=inactive" not in section


def mid(section: Section) -> str | None:
    return next((line[len("a=mid:"):] for line in section if line.startswith("a=mid:")), None)


def payload_type(section: Section, codec: str) -> int | None:
    """The first payload type ``section`` maps to ``codec`` (``opus``, ``red``)."""
    rtpmap = re.compile(rf"a=rtpmap:(\d+) {re.escape(codec)}/", re.IGNORECASE)
    return next((int(m[1]) for line in section if (m := rtpmap.match(line))), None)


def fmtp(section: Section, pt: int) -> str | None:
    prefix = f"a=fmtp:{pt} "
    return next((line[len(prefix):] for line in section if line.startswith(prefix)), None)


def formats(section: Section) -> list[str]:
    """The payload types of the m= line, in order of preference."""
    return section[0].split(" ")[3:]


def with_codec_first(section: Section, pt: int, rtpmap: str, format_parameters: str) -> Section:
    """``section`` with codec ``pt`` added before the others: first in the m= line, its
    rtpmap and fmtp lines before the first rtpmap."""
    m_line = section[0].split(" ")
    head = [" ".join(m_line[:3] + [str(pt)] + [f for f in m_line[3:] if f != str(pt)])]
    rest = [line for line in section[1:] if not line.startswith((f"a=rtpmap:{pt} ", f"a=fmtp:{pt} "))]
    at = next((i for i, line in enumerate(rest) if line.startswith("a=rtpmap:")), len(rest))
    return head + rest[:at] + [f"a=rtpmap:{pt} {rtpmap}", f"a=fmtp:{pt} {format_parameters}"] + rest[at:]


def with_fmtp(section: Section, pt: int, format_parameters: str) -> Section:
    """``section`` with ``pt``'s fmtp line set to ``format_parameters`` (added after its rtpmap)."""
    line = f"a=fmtp:{pt} {format_parameters}"
    for i, old in enumerate(section):
        if old.startswith(f"a=fmtp:{pt} "):
            return section[:i] + [line] + section[i + 1:]
    at = next(i for i, old in enumerate(section) if old.startswith(f"a=rtpmap:{pt} "))
    return section[:at + 1] + [line] + section[at + 1:]


def msid_track(section: Section) -> str | None:
    """The track id of the section's ``a=msid`` line (the SDK's cid)."""
    parts = next((line[len("a=msid:"):].split() for line in section if line.startswith("a=msid:")), [])
    return parts[1] if len(parts) >= 2 else None
