"""The one report format: each benchmark writes its figures to ``bench/results/<bench>.json``.

A results file is a JSON list of records, one per figure. Every record says what it measures from
the caller's point of view (``title``), its value beside the bare reference measured in the same
run (``floor``, null where there is none) and how they compare (``beyond_floor`` for latencies,
``ratio`` for costs), and how it was made: the exact command, the date, the CPU, the load average
at the start and end, and whether it was a ``--quick`` run. ``bench.figures`` renders these files
into docs/figures.md and the README's figures; it refuses a record that lacks a required field.

Usage in a benchmark::

    report = Report("direct_heard", quick=args.quick)
    report.add("direct.bargein_heard_p95", "barge-in ...", value=ours, floor=floor, unit="ms", n=len(heard),
               area="barge-in", compare="beyond_floor")
    report.write()
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REQUIRED = ("figure", "title", "value", "floor", "unit", "n", "command", "date", "cpu_model", "load", "quick")
COMPARISONS = ("beyond_floor", "ratio")


class RecordError(ValueError):
    """A record that the figures cannot be rendered from."""


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def load_average() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return float("nan")


def command_line(argv: Sequence[str] | None = None) -> str:
    """How this process was started, as a person would type it (``python -m bench.x ...``)."""
    argv = list(sys.argv if argv is None else argv)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        module = spec.name.removesuffix(".__main__")
        return shlex.join(["python", "-m", module, *argv[1:]])
    return shlex.join(["python", *argv])


def _number(value: float | int | None, digits: int = 3) -> float | int | None:
    """JSON has no nan: a figure that could not be measured is null."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else round(value, digits)


def validate(record: object) -> dict:
    """The record itself when it has every required field and one comparison; else RecordError."""
    if not isinstance(record, dict):
        raise RecordError(f"a record is a JSON object, not {type(record).__name__}")
    missing = [name for name in REQUIRED if name not in record]
    if missing:
        raise RecordError(f"record {record.get('figure', '?')!r} lacks {', '.join(missing)}")
    if not any(name in record for name in COMPARISONS):
        raise RecordError(f"record {record['figure']!r} has neither beyond_floor nor ratio")
    load = record["load"]
    if not (isinstance(load, list) and len(load) == 2):
        raise RecordError(f"record {record['figure']!r}: load is [start, end], not {load!r}")
    if not isinstance(record["quick"], bool):
        raise RecordError(f"record {record['figure']!r}: quick is true or false")
    return record


def read(path: Path) -> list[dict]:
    """One results file's records, each validated."""
    records = json.loads(Path(path).read_text())
    if not isinstance(records, list):
        raise RecordError(f"{path}: a results file is a JSON list of records")
    for record in records:
        try:
            validate(record)
        except RecordError as error:
            raise RecordError(f"{path}: {error}") from None
    return records


@dataclass
class Report:
    """The figures of one benchmark run, written once at the end."""

    bench: str
    quick: bool = False
    command: str = field(default_factory=command_line)
    date: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))
    load_start: float = field(default_factory=load_average)
    records: list[dict] = field(default_factory=list)

    def add(self, figure: str, title: str, value: float | None, *, unit: str, n: int,
            floor: float | None = None, compare: str = "beyond_floor", area: str = "", digits: int = 3,
            note: str = "") -> dict:
        """One figure. ``compare`` is ``beyond_floor`` (value - floor) or ``ratio`` (value / floor);
        without a floor (or with a value or floor that could not be measured) it is null."""
        if compare not in COMPARISONS:
            raise ValueError(f"compare is one of {COMPARISONS}")
        value, floor = _number(value, digits), _number(floor, digits)
        compared = None
        if value is not None and floor is not None:
            if compare == "beyond_floor":
                compared = _number(value - floor, digits)
            elif floor:
                compared = _number(value / floor, digits)
        record = {"figure": figure, "title": title, "area": area or self.bench, "value": value, "floor": floor,
                  compare: compared, "unit": unit, "n": int(n)}
        if note:
            record["note"] = note
        self.records.append(record)
        return record

    def finish(self) -> list[dict]:
        load = [self.load_start, load_average()]
        done = [{**r, "bench": self.bench, "command": self.command, "date": self.date, "cpu_model": cpu_model(),
                 "load": load, "quick": self.quick} for r in self.records]
        for record in done:
            validate(record)
        return done

    def write(self, directory: Path | None = None) -> Path:
        directory = Path(directory or os.environ.get("BENCH_RESULTS") or RESULTS)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.bench}.json"
        path.write_text(json.dumps(self.finish(), indent=1) + "\n")
        print(f"figures written to {path}", flush=True)
        return path
