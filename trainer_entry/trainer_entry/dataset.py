"""The job's dataset: verl's RLHFDataset, with the job's protocol choosing every row's agent loop.

verl's agent-loop workers run a row with the loop its `agent_name` names and fall back to
`rollout.agent.default_agent_loop` (ours: the loop of `spec.rollout.protocol`) only for rows without
one (verl 0.9.1: `AgentLoopWorker.generate_sequences`, `AgentLoopWorkerTQ.generate_sequences`). Data
prepared elsewhere (or by `trainer_entry.data` before it stopped writing the column) names a loop per
row, which would silently override the job's protocol; this dataset drops it. Selected with verl's
extension point `data.custom_cls` (translate.py); verl's workers build the same class for their own use
(`get_dataset_class`).
"""

from __future__ import annotations

from typing import Any

from verl.utils.dataset.rl_dataset import RLHFDataset

AGENT_NAME = "agent_name"


class JobDataset(RLHFDataset):
    """RLHFDataset whose rows carry no `agent_name`, so the job's protocol picks the agent loop."""

    def __getitem__(self, item: int) -> dict[str, Any]:
        row = super().__getitem__(item)
        row.pop(AGENT_NAME, None)
        return row
