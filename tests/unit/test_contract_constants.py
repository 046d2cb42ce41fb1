"""The contract constants the three distributions share (separate images: they cannot import one
another) are written once in each; this is where they are checked against each other
(docs/contracts.md describes them)."""

from __future__ import annotations

from pathlib import Path

from tool_sandbox.config import ServerSettings
from toolrl_operator import naming

from trainer_entry import run, translate


def test_paths_the_operator_mounts_are_where_the_trainer_looks() -> None:
    assert naming.CHECKPOINT_MOUNT == translate.CHECKPOINT_ROOT
    assert Path(naming.CONFIG_MOUNT) / naming.REWARD_DIR == run.CUSTOM_REWARD_DIR


def test_ports_the_operator_opens_are_the_ones_served() -> None:
    assert naming.TRAINER_METRICS_PORT == run.DEFAULT_METRICS_PORT
    assert ServerSettings().port == naming.TOOL_POOL_PORT
