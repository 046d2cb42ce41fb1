"""bench/cpu_training's jobs: one per trainer mode, each a job the trainer accepts (the bench compares
them on the same toy task)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from trainer_entry.spec import TRAINER_MODES, parse_job

BENCH = Path(__file__).resolve().parents[3] / "bench" / "cpu_training"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))  # the script imports its sibling `generation`
    try:
        import run

        yield run
    finally:
        sys.path.remove(str(BENCH))
        sys.modules.pop("run", None)


def test_the_bench_compares_every_trainer_mode_on_the_same_job(bench):
    assert bench.MODES == TRAINER_MODES
    specs = {
        mode: parse_job(bench.job(Path("/m"), Path("/d.parquet"), 2, "hf", mode)).spec for mode in bench.MODES
    }
    assert {mode: spec["trainer"]["mode"] for mode, spec in specs.items()} == {m: m for m in TRAINER_MODES}
    assert specs["separate-async"]["cluster"]["rolloutWorkers"] == {"replicas": 1, "gpusPerWorker": 0}
    # the rest of the job is the same in every mode
    for spec in specs.values():
        assert spec["algorithm"] == specs["sync"]["algorithm"] and spec["rollout"] == specs["sync"]["rollout"]
    assert [bench.run_name("hf", m) for m in bench.MODES] == ["hf", "hf-colocate-async", "hf-separate-async"]
