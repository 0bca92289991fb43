"""The level rule that pauses the agent at the first rise in the caller's level (level_onset.py)."""

import numpy as np

from duplex_agent.webrtc.media.level_onset import LevelOnset
from tests.support.audio import tone

RATE = 48000
BLOCK = RATE // 100


def tone_at(ms: float, dbfs: float) -> np.ndarray:
    """A tone whose RMS is ``dbfs``."""
    return tone(ms, rate=RATE, level=float(np.sqrt(2) * 10 ** (dbfs / 20)))


def onsets(level: LevelOnset, audio: np.ndarray, frame: int) -> list[int]:
    """Indexes of the frames ``push`` called onsets."""
    return [k for k in range(audio.size // frame) if level.push(audio[k * frame : (k + 1) * frame], RATE)]


def test_a_sound_over_minus_40_dbfs_rising_15_db_over_the_background_is_one_onset_in_its_first_block():
    audio = np.concatenate([tone_at(500, -60), tone_at(300, -20), tone_at(100, -60)])
    assert onsets(LevelOnset(), audio, BLOCK) == [50]  # the first block of the sound, not one per block
    assert onsets(LevelOnset(), audio, 4 * BLOCK) == [12]  # 40 ms frames: the frame that holds it
    # in frames that split a block, the block is judged once it is whole
    assert onsets(LevelOnset(), audio, 700) == [34]  # 23 800 samples in: block 50 ends at 24 480


def test_a_sound_under_the_rule_is_no_onset():
    assert onsets(LevelOnset(), np.concatenate([tone_at(500, -80), tone_at(300, -45)]), BLOCK) == []  # under -40 dBFS
    # over -40 dBFS but only 10 dB over a loud room's background
    assert onsets(LevelOnset(), np.concatenate([tone_at(2000, -45), tone_at(300, -35)]), BLOCK) == []
    assert onsets(LevelOnset(), np.concatenate([tone_at(2000, -45), tone_at(300, -25)]), BLOCK) == [200]  # 20 dB over it


def test_steady_noise_is_an_onset_when_it_starts_and_not_again_and_a_sound_over_it_is_one():
    level = LevelOnset()
    room = tone_at(5000, -30)
    assert onsets(level, np.concatenate([tone_at(300, -70), room]), BLOCK) == [30]
    assert level.background_db is not None and level.background_db > -60  # it follows the room up, slowly
    assert onsets(level, np.concatenate([tone_at(300, -30), tone_at(200, -5)]), BLOCK) == [30]  # a shout over the room


def test_sounds_with_quiet_between_them_are_an_onset_each():
    burst = np.concatenate([tone_at(48, -20), tone_at(112, -70)])
    assert onsets(LevelOnset(), np.concatenate([tone_at(300, -70), np.tile(burst, 3)]), BLOCK) == [30, 46, 62]


def test_noise_that_wavers_around_the_rule_is_one_onset():
    wavering = np.concatenate([np.concatenate([tone_at(10, -38), tone_at(10, -43)])] * 100)  # 2 s
    assert onsets(LevelOnset(), np.concatenate([tone_at(300, -80), wavering]), BLOCK) == [30]
