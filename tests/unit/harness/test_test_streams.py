"""`make test`'s two pytest processes side by side: each stream's lines come prefixed with its
name, one report reads every stream's JUnit file, and the run fails when any stream failed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from harness import test_streams
from harness.test_streams import REAL_NODE_MODULES, STREAMS, Stream

REPO = Path(__file__).resolve().parents[3]


def _modules(tmp_path: Path, failing: bool) -> tuple[Stream, ...]:
    (tmp_path / "test_first.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    (tmp_path / "test_second.py").write_text(f"def test_two():\n    assert {not failing}, 'broke'\n")
    first = str(tmp_path / "test_first.py")
    return (Stream("a", (first,)), Stream("b", (str(tmp_path),), ignored=(first,)))


def test_every_streams_tests_are_reported_and_a_failure_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert test_streams.run(_modules(tmp_path, failing=True), ["-p", "no:cacheprovider"], tmp_path) == 1
    out = capsys.readouterr().out
    assert re.search(r"^   a \| .*test_first\.py \.", out, re.M), out
    assert re.search(r"^   b \| .*test_second\.py F", out, re.M), out  # the other stream ran it, not a
    assert "test_first" not in "".join(ln for ln in out.splitlines() if ln.startswith("   b |"))
    assert "FAILED test_second::test_two: AssertionError: broke" in out
    assert "== 1 failed, 1 passed in" in out
    assert "streams that failed: b (exit 1)" in out


def test_a_run_whose_streams_pass_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert test_streams.run(_modules(tmp_path, failing=False), ["-p", "no:cacheprovider"], tmp_path) == 0
    assert "== 2 passed in" in capsys.readouterr().out


def test_the_streams_cover_the_suite_once_with_every_real_node_module_in_one() -> None:
    """A module that claims the machine's one real node in the other stream would wait for the
    claim (up to 30 min) instead of running beside it."""
    claims = {
        f"tests/e2e/{path.name}"
        for path in (REPO / "tests" / "e2e").glob("test_*.py")
        if re.search(r"\b(real_node_cluster|training_cluster)\(", path.read_text())
    }
    assert claims and claims == set(REAL_NODE_MODULES)
    node, rest = STREAMS
    assert node.paths[: len(REAL_NODE_MODULES)] == REAL_NODE_MODULES and not node.ignored
    assert rest.paths == ("tests",) and rest.ignored == node.paths
    assert all((REPO / path).is_file() for path in node.paths)
