"""The caller-heard turn figures of ``bench.caller_turn_latency``, from constructed turns."""

import math

import numpy as np

from bench.caller_turn_latency import Said, Utterance, mode_figures


def said(*, paused: bool, sent: float, heard: float | None, commits: int = 0, worker: float | None = None) -> Said:
    utterance = Utterance("Where is the nearest pharmacy?", np.zeros(480, np.float32), paused)
    return Said(utterance, last_sent_at=sent, heard_at=heard, commits_before_end=commits, worker_turn_ms=worker)


def test_finished_sentences_are_measured_beyond_the_floor_and_paused_ones_counted_for_cut_ins():
    turns = [said(paused=False, sent=10.0, heard=10.5, worker=420.0),
             said(paused=False, sent=20.0, heard=20.7),
             said(paused=False, sent=30.0, heard=30.6, worker=510.0),
             said(paused=True, sent=40.0, heard=40.9, commits=1, worker=300.0),
             said(paused=True, sent=50.0, heard=None)]
    figures = mode_figures(turns, floor_ms=100.0)
    assert [round(ms) for ms in figures.finished_ms] == [500, 700, 600]  # paused sentences left out
    assert math.isclose(figures.beyond_floor_p50_ms, 500.0)
    assert (figures.cut_ins, figures.paused, figures.unanswered) == (1, 2, 1)
    assert figures.worker_turn_ms == [420.0, 510.0]


def test_no_answered_sentence_gives_no_figure():
    figures = mode_figures([said(paused=False, sent=10.0, heard=None)], floor_ms=100.0)
    assert figures.finished_ms == [] and math.isnan(figures.beyond_floor_p50_ms) and figures.unanswered == 1
