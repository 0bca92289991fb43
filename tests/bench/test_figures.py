"""bench.figures renders results files into docs/figures.md and the README's block, and refuses half-known records."""

from __future__ import annotations

import json

import pytest

from bench import figures
from bench.report import RecordError, Report, read, validate


def record(**changes: object) -> dict:
    base = {"figure": "direct.bargein_heard_p95", "title": "barge-in as heard, p95", "area": "barge-in",
            "value": 120.0, "floor": 100.0, "beyond_floor": 20.0, "unit": "ms", "n": 30,
            "command": "python -m bench.direct_heard --quick", "date": "2026-12-04 20:00 UTC",
            "cpu_model": "Test CPU", "load": [0.5, 1.25], "quick": True, "bench": "direct_heard"}
    return {**base, **changes}


def write(folder, name: str, records: list[dict]) -> None:
    (folder / f"{name}.json").write_text(json.dumps(records))


def test_a_results_file_renders_into_the_expected_rows(tmp_path):
    write(tmp_path, "direct_heard", [record()])
    write(tmp_path, "livekit_vs_direct", [record(
        figure="livekit.cpu_per_call", title="CPU per call", area="CPU", value=5.0, floor=4.0, ratio=1.25,
        beyond_floor=None, unit="% of a core", n=2, quick=False, command="python -m bench.livekit_vs_direct",
        bench="livekit_vs_direct")])
    records = figures.load(tmp_path)

    assert figures.readme_rows(records) == [
        "| figure | value | floor | beyond floor / ratio |",
        "|---|---|---|---|",
        "| [barge-in heard, direct WebRTC, p95](docs/figures.md#barge-in) | 120 ms | 100 ms | +20 ms |",
        "| [worker CPU per call, LiveKit](docs/figures.md#cpu) | 5 % of a core | 4 % of a core | 1.25x |",
    ]
    page = figures.render_figures_md(records, missing=["lossy_network"])
    assert page.index("## barge-in") < page.index("## CPU")  # areas in their fixed order
    assert ("| barge-in as heard, p95 `direct.bargein_heard_p95` | 120 ms | 100 ms | +20 ms | 30 | "
            "2026-12-04 20:00 UTC, load 0.5-1.25, quick | `python -m bench.direct_heard --quick` |") in page
    assert "- `bench.lossy_network`" in page


def test_the_readme_block_is_replaced_and_nothing_else(tmp_path):
    text = "# Title\n\nprose\n<!-- figures:begin -->\n| old | table |\n<!-- figures:end -->\n\nmore prose\n"
    out = figures.replace_block(text, ["| new |"])
    assert out == "# Title\n\nprose\n<!-- figures:begin -->\n| new |\n<!-- figures:end -->\n\nmore prose\n"
    with pytest.raises(ValueError):
        figures.replace_block("no markers", ["| new |"])


def test_a_record_missing_a_required_field_is_refused(tmp_path):
    broken = record()
    del broken["floor"]
    write(tmp_path, "direct_heard", [broken])
    with pytest.raises(RecordError, match="lacks floor"):
        figures.load(tmp_path)
    with pytest.raises(RecordError, match="neither beyond_floor nor ratio"):
        validate({k: v for k, v in record().items() if k != "beyond_floor"})
    readme = tmp_path / "README.md"
    readme.write_text("<!-- figures:begin -->\nkept\n<!-- figures:end -->\n")
    assert figures.main(["--results", str(tmp_path), "--docs", str(tmp_path / "f.md"), "--readme", str(readme)]) == 1
    assert readme.read_text() == "<!-- figures:begin -->\nkept\n<!-- figures:end -->\n"  # nothing half-rendered
    assert not (tmp_path / "f.md").exists()


def test_a_report_writes_records_the_generator_reads(tmp_path):
    report = Report("some_bench", quick=True, command="python -m bench.some_bench --quick")
    report.add("x.latency", "a latency", 12.5, floor=10.0, unit="ms", n=4, area="turn")
    report.add("x.cost", "a cost", 3.0, floor=2.0, unit="%", n=4, compare="ratio", area="CPU")
    report.add("x.unmeasured", "nothing came back", float("nan"), floor=1.0, unit="ms", n=0)
    written = read(report.write(tmp_path))
    assert [(r["figure"], r.get("beyond_floor"), r.get("ratio")) for r in written] == [
        ("x.latency", 2.5, None), ("x.cost", None, 1.5), ("x.unmeasured", None, None)]
    assert written[0]["command"] == "python -m bench.some_bench --quick" and written[0]["quick"] is True
    assert len(written[0]["load"]) == 2 and written[0]["cpu_model"]


def test_the_suite_names_real_benches_and_skips_one_that_needs_root_without_it(monkeypatch):
    from pathlib import Path

    from bench import __main__ as suite

    folder = Path(suite.__file__).parent
    assert all((folder / f"{b.name}.py").exists() for b in suite.SUITE)
    assert len({b.name for b in suite.SUITE}) == len(suite.SUITE)
    lossy = next(b for b in suite.SUITE if b.name == "lossy_network")
    monkeypatch.setattr(suite.os, "geteuid", lambda: 1000)
    assert "needs root" in suite.unmet(lossy)
