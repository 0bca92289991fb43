"""The docs' claims name their tests and benchmarks: each one named must exist, or a claim
outlives the test behind it (a renamed or removed test leaves the docs pointing at nothing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?")
BENCH_REF = re.compile(r"`python -m (bench\.\w+)")


def _refs(pattern: re.Pattern[str]) -> list[tuple[str, tuple[str, ...]]]:
    return [(doc.name, match.groups()) for doc in DOCS for match in pattern.finditer(doc.read_text())]


@pytest.mark.parametrize(("doc", "ref"), _refs(TEST_REF), ids=lambda value: str(value))
def test_each_test_the_docs_name_exists(doc, ref):
    path, name = ref
    assert (REPO / path).is_file(), f"{doc} names {path}, which does not exist"
    if name is not None:
        assert re.search(rf"^(async )?def {name}\(", (REPO / path).read_text(), re.MULTILINE), \
            f"{doc} names {path}::{name}, which is not defined there"


@pytest.mark.parametrize(("doc", "ref"), _refs(BENCH_REF), ids=lambda value: str(value))
def test_each_benchmark_the_docs_name_exists(doc, ref):
    (module,) = ref
    assert (REPO / (module.replace(".", "/") + ".py")).is_file(), f"{doc} names {module}, which does not exist"
