"""bench.onset_delay's measures on the real Silero onset detector and gate: no clock, so exact."""

from bench.livekit_callers import INTERRUPTIONS, SAMPLE_RATE
from bench.onset_delay import floor_ms, main, pause_ms
from devtools.speech import speak

FRAME_40_MS = SAMPLE_RATE * 40 // 1000


def test_a_lower_pause_threshold_pauses_no_later_and_sooner_somewhere():
    leads = [SAMPLE_RATE // 2 + 160 * k for k in range(4)]  # 10 ms steps against the frames and windows
    speech = {text: speak(text, SAMPLE_RATE) for text in INTERRUPTIONS}
    pauses = [(pause_ms(audio, lead, FRAME_40_MS, 0.5), pause_ms(audio, lead, FRAME_40_MS, 0.3))
              for audio in speech.values() for lead in leads]
    assert all(lower <= at_threshold for at_threshold, lower in pauses), pauses
    assert sum(lower for _, lower in pauses) < sum(at for at, _ in pauses), pauses
    # every pause is decided on a frame the floor's energy rule has also heard
    floors = [floor_ms(audio, lead) for audio in speech.values() for lead in leads]
    assert all(lower >= floor for (_, lower), floor in zip(pauses, floors)), (pauses, floors)


def test_the_bench_prints_each_threshold_and_frame_size(capsys):
    assert main(["--alignments", "1", "--frame-ms", "40", "--pause-thresholds", "0.5,0.3"]) == 0
    out = capsys.readouterr().out
    assert "pause at 0.50, 40 ms frames" in out and "pause at 0.30, 40 ms frames" in out
