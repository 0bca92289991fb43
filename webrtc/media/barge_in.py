"""When caller sound over the agent pauses it, cancels it, or lets it go on: window by window.

The edge reacts at the first VAD window (32 ms) over the pause threshold by pausing the
agent, then waits for the verdict the session's own VAD would give, by its settings (threshold,
release threshold, minimum speech): the candidate holds once its windows over the
threshold reach the minimum speech (a barge-in: the call path cancels), and is dropped at
the first window below the release threshold (a cough, a knock, a short "mm-hm": the call
path resumes, nothing skipped). Windows in between neither add nor drop, as in ``VadStream``.
The pause threshold sits under the session's (``pause_threshold``): a false pause costs the
caller a few tens of ms of the agent, a late one lets the agent talk over them, and Silero
often scores a speech onset's first window (an "s", a breath before a vowel) between the two.
Windows of the onset detector's offset grid (``half_step``, 16 ms after each main one) only
pause sooner. Both kinds of window that may pause but not count as speech start a candidate
while the agent plays, with no speech counted; the main grid's windows over the session's
threshold alone grow it and confirm it, as the session's VAD sees them: those within
``SPEECH_LEVEL_SPAN_DB`` of the candidate's loudest window (Silero scores a codec's ring-down
after a short sound as speech; the VAD scores digital silence 0).
A pause lasts at most ``max_pause_ms`` unconfirmed, or until the speech growing at its end
confirms; the candidate may still confirm after it.

A dropped candidate resumes the agent only after ``release_hold_ms`` with no new sound: a stop
consonant's closure (the "t" of "stop", the "k" of "excuse") is a few tens of ms of quiet inside a
word, and a resume there lets a blip of the agent's voice out between the word's sounds, after which
the next sound pauses it again. Sound within the hold goes on with the same pause and its onset.

Sooner still, a rise in the caller's level (``level_onset.py``, 10 ms blocks, as the bare echo
peers hear an onset) pauses the agent before any window is scored (``push_level_onset``). Silero
scores the first windows of many onsets low (an "s", a breath), so such a pause is not dropped by
windows under the release threshold while they are loud (over the level rule's ``ONSET_DBFS``)
and younger than ``level_grace_ms``: a knock that has died away resumes at its first quiet
window, an "s" before a vowel holds the pause until the vowel's windows count as speech.

Continuous noise must not make the agent stutter: after ``max_false_pauses`` false pauses in
one reply, onsets over that reply no longer pause it (``WITHHELD``); held speech still cancels
it. A reply the caller was already talking over when it began (the caller's speech had not
ended) is neither paused nor cancelled: the model started it over the caller.

Models that handle overlap themselves (``handles_overlap``, Moshi): under overlap policy
"listen" the call path never consults the gate, so the model's audio, its own backchannels
over the caller included, goes out untouched. Under "barge_in" they are paused like any model;
a sound that does not hold gives the model its audio back where it stopped, with what it
produced meanwhile queued behind it (a frame-synchronous model's reply runs late by the pause,
at most max_false_pauses x max_pause_ms per reply, and nothing is skipped), and the model,
which hears every frame of the caller, decides itself what to make of the sound.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from duplex_agent.agent.models.vad import VAD_RATE, WINDOW_SAMPLES, OnsetLevel
from duplex_agent.webrtc.media.level_onset import ONSET_DBFS

#: Pauses a reply may have for sounds that did not hold, before onsets stop pausing it.
MAX_FALSE_PAUSES = 3
#: The longest an unconfirmed pause holds the agent: a false pause is heard as at most this.
MAX_PAUSE_MS = 256.0
#: How far under the session's threshold a window pauses the agent: Silero often scores a word's
#: first window between the two, so pausing lower hears onsets sooner; lower still gains little
#: and pauses on more that is not speech (python -m bench.onset_delay --pause-thresholds weighs
#: the first, python -m bench.false_pauses the second).
PAUSE_MARGIN = 0.2
#: How long a pause outlives a dropped candidate before the agent resumes: one window, longer than
#: a stop consonant's closure takes to end in the next sound's first window.
RELEASE_HOLD_MS = 32.0
#: How long a pause the caller's level began holds against windows Silero scores as not speech
#: while the sound stays loud: three windows, past the 75 ms "s" of "Sorry" (bench.onset_delay).
LEVEL_GRACE_MS = 96.0


def pause_threshold(threshold: float) -> float:
    """The probability at which a window over the agent pauses it, for the session VAD's ``threshold``."""
    return max(threshold - PAUSE_MARGIN, 0.01)


class Verdict(enum.Enum):
    PAUSE = "pause"  # caller sound began over the agent: pause it now
    RESUME = "resume"  # the sound did not hold (or the pause ran out): go on where it stopped
    CONFIRM = "confirm"  # the speech held over the agent: a barge-in
    WITHHELD = "withheld"  # an onset the bound kept from pausing this reply


@dataclass(frozen=True, slots=True)
class BargeInRules:
    """The session VAD's settings as the gate applies them: the call path builds them from the
    session's turn detection."""

    threshold: float = 0.5  # a window at or over it is speech: a candidate starts or grows
    pause_threshold: float = 0.3  # while the agent plays, a window at or over it pauses (pause_threshold(threshold))
    release_threshold: float = 0.35  # under it the candidate is dropped (release_threshold(threshold))
    min_speech_ms: float = 100.0  # the candidate's speech that makes a barge-in
    silence_ms: float = 300.0  # caller silence that ends their speech over the agent (a new onset may follow); the gate's own
    window_ms: float = 1000.0 * WINDOW_SAMPLES / VAD_RATE  # the onset detector's window (32 ms)
    pause: bool = True  # False: no pause, only the cancel on held speech
    max_false_pauses: int = MAX_FALSE_PAUSES
    max_pause_ms: float = MAX_PAUSE_MS
    release_hold_ms: float = RELEASE_HOLD_MS
    level_onset: bool = True  # False: only Silero's windows pause
    level_grace_ms: float = LEVEL_GRACE_MS


class BargeInGate:
    """One call's barge-in state; ``push`` one window's speech probability at a time."""

    def __init__(self, rules: BargeInRules | None = None) -> None:
        self.rules = rules or BargeInRules()
        self._candidate_ms: float | None = None  # speech in the candidate so far; None: no candidate
        self._candidate_age_ms = 0.0
        self._candidate_level = OnsetLevel()
        self._over_agent = False  # the candidate began while the agent's audio played
        self._by_level = False  # the candidate began at a rise in the caller's level
        self._speech_silence_ms: float | None = None  # in the caller's held speech: its silence so far
        self.paused = False
        self._pause_ms = 0.0  # how long the pause has held, across the candidates that kept it
        self._holding_ms: float | None = None  # the pause outlives a dropped candidate: quiet so far
        self.onset_at: float | None = None  # the candidate's first window (the caller's clock)
        self._reply: str | None = None
        self._false_pauses = 0  # in _reply

    def push(self, probability: float, *, at: float, agent_playing: bool, reply: str | None,
             half_step: bool = False, level_db: float | None = None) -> Verdict | None:
        """One window: its speech probability, when it arrived, whether the agent's audio plays
        (and barge-in applies), the reply being heard, whether it is an offset grid's window, and
        its level (dBFS; None: every window over the threshold counts)."""
        rules = self.rules
        self._follow_reply(reply)
        if half_step:
            return self._early_pause(probability, at, agent_playing)
        if self._speech_silence_ms is not None:  # the caller is talking: nothing starts until they stop
            self._speech_silence_ms = 0.0 if probability >= rules.release_threshold else (
                self._speech_silence_ms + rules.window_ms)
            if self._speech_silence_ms >= rules.silence_ms:
                self._speech_silence_ms = None
            return None
        if self._holding_ms is not None and probability < rules.pause_threshold:
            self._holding_ms += rules.window_ms
            self._pause_ms += rules.window_ms
            return self._false_pause() if self._holding_ms >= rules.release_hold_ms else None
        if self._candidate_ms is None:
            if probability < rules.threshold:
                return self._early_pause(probability, at, agent_playing)
            held = self._take_hold()
            self._candidate_ms = self._candidate_age_ms = rules.window_ms
            self._by_level = False
            self._candidate_level.reset()
            if level_db is not None:
                self._candidate_level.counts(level_db)
            if held:
                self._pause_ms += rules.window_ms
            else:
                self._over_agent = agent_playing
                self.onset_at = at
            if self._candidate_ms >= rules.min_speech_ms:
                return self._confirm()
            if held or not agent_playing or not rules.pause:
                return None
            if self._false_pauses >= rules.max_false_pauses:
                return Verdict.WITHHELD
            self._pause()
            return Verdict.PAUSE
        self._candidate_age_ms += rules.window_ms
        self._pause_ms += rules.window_ms
        if probability >= rules.threshold:
            if level_db is None or self._candidate_level.counts(level_db):
                self._candidate_ms += rules.window_ms
                if self._candidate_ms >= rules.min_speech_ms:
                    return self._confirm()
                return None  # speech that grows confirms within the minimum: the bound waits for it
        elif probability < rules.release_threshold and not self._level_grace(level_db):
            self._candidate_ms = None
            if self.paused and rules.release_hold_ms > 0 and self._pause_ms < rules.max_pause_ms:
                self._holding_ms = 0.0
                return None
            return self._false_pause()
        elif level_db is not None:
            self._candidate_level.hear(level_db)
        if self.paused and self._pause_ms >= rules.max_pause_ms:
            return self._false_pause()
        return None

    def push_level_onset(self, *, at: float, agent_playing: bool, reply: str | None) -> Verdict | None:
        """A rise in the caller's level (``LevelOnset``) that arrived ``at``: a pause, at most."""
        if not self.rules.level_onset:
            return None
        self._follow_reply(reply)
        holding = self._holding_ms is not None
        verdict = self._early_pause(1.0, at, agent_playing)
        if verdict is Verdict.PAUSE or (holding and self._holding_ms is None):
            self._by_level = True
        return verdict

    def _follow_reply(self, reply: str | None) -> None:
        """A new reply gets its false pauses back."""
        if reply != self._reply and reply is not None:
            self._reply, self._false_pauses = reply, 0

    def _level_grace(self, level_db: float | None) -> bool:
        """Whether a window under the release threshold leaves a pause the caller's level began alone."""
        return (self._by_level and self._candidate_age_ms < self.rules.level_grace_ms
                and (level_db is None or level_db >= ONSET_DBFS))

    def _early_pause(self, probability: float, at: float, agent_playing: bool) -> Verdict | None:
        """A window that may pause but not count as speech (the offset grid's, or one between the
        pause threshold and the threshold): a pause, at most, with no speech in the candidate yet."""
        rules = self.rules
        if self._holding_ms is not None and probability >= rules.pause_threshold:
            self._take_hold()  # sound again within the hold: the same pause, from the same onset
            self._by_level = False
            self._candidate_ms = self._candidate_age_ms = 0.0
            self._candidate_level.reset()
            return None
        if (self._speech_silence_ms is not None or self._candidate_ms is not None or probability < rules.pause_threshold
                or not agent_playing or not rules.pause or self._false_pauses >= rules.max_false_pauses):
            return None  # the main grid's windows judge these as before (and count a withheld onset once)
        self._by_level = False
        self._candidate_ms = self._candidate_age_ms = 0.0
        self._candidate_level.reset()
        self._over_agent = True
        self.onset_at = at
        self._pause()
        return Verdict.PAUSE

    def _pause(self) -> None:
        self.paused = True
        self._pause_ms = self._candidate_age_ms

    def _take_hold(self) -> bool:
        """End a hold, if one runs, for new sound: whether it did (the pause goes on)."""
        held, self._holding_ms = self._holding_ms is not None, None
        return held

    def release(self) -> None:
        """The playout was cleared or stopped being ours to pause: forget the pause (not the speech)."""
        self.paused = False
        self._holding_ms = None

    def _confirm(self) -> Verdict | None:
        over_agent, self._over_agent = self._over_agent, False
        self._candidate_ms = None
        self._speech_silence_ms = 0.0
        self.paused = False
        self._holding_ms = None
        return Verdict.CONFIRM if over_agent else None

    def _false_pause(self) -> Verdict | None:
        self._holding_ms = None
        if not self.paused:
            return None
        self.paused = False
        self._false_pauses += 1
        return Verdict.RESUME
