"""bench.onset_delay's measures on the real Silero onset detector and gate: no clock, so exact."""

from bench.livekit_callers import INTERRUPTIONS, SAMPLE_RATE
from bench.onset_delay import floor_ms, main, pause_ms
from devtools.speech import speak

FRAME_40_MS = SAMPLE_RATE * 40 // 1000


def test_a_lower_pause_threshold_pauses_no_later_and_sooner_somewhere():
    leads = [SAMPLE_RATE // 2 + 160 * k for k in range(4)]  # 10 ms steps against the frames and windows
    speech = {text: speak(text, SAMPLE_RATE) for text in INTERRUPTIONS}
    pauses = [(pause_ms(audio, lead, FRAME_40_MS, 0.5, by_level=False),
               pause_ms(audio, lead, FRAME_40_MS, 0.3, by_level=False))
              for audio in speech.values() for lead in leads]
    assert all(lower <= at_threshold for at_threshold, lower in pauses), pauses
    assert sum(lower for _, lower in pauses) < sum(at for at, _ in pauses), pauses
    # every pause is decided on a frame the floor's energy rule has also heard
    floors = [floor_ms(audio, lead) for audio in speech.values() for lead in leads]
    assert all(lower >= floor for (_, lower), floor in zip(pauses, floors)), (pauses, floors)


def test_the_level_rule_pauses_no_later_than_the_vad_alone_and_where_the_floor_does_with_its_frames():
    leads = [SAMPLE_RATE // 2 + 160 * k for k in range(4)]
    speech = [speak(text, SAMPLE_RATE) for text in INTERRUPTIONS]
    for frame in (FRAME_40_MS, SAMPLE_RATE // 100):
        pauses = [(pause_ms(audio, lead, frame, 0.3, by_level=False), pause_ms(audio, lead, frame, 0.3, by_level=True))
                  for audio in speech for lead in leads]
        assert all(by_level <= vad for vad, by_level in pauses), pauses
        assert sum(by_level for _, by_level in pauses) < sum(vad for vad, _ in pauses), pauses
    # with the floor's own 10 ms frames the level rule hears each onset in the floor's frame
    floors = [floor_ms(audio, lead) for audio in speech for lead in leads]
    assert [by_level for _, by_level in pauses] == floors


def test_the_bench_prints_each_threshold_and_frame_size(capsys):
    assert main(["--alignments", "1", "--frame-ms", "40", "--pause-thresholds", "0.5,0.3"]) == 0
    out = capsys.readouterr().out
    assert "two grids alone      , pause at 0.50, 40 ms frames" in out and "pause at 0.30, 40 ms frames" in out
    assert "level rise + two grids, pause at 0.50, 40 ms frames" in out
