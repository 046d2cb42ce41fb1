"""The ToolRLJob spec as the trainer reads it: loading, defaults, and the value checks verl does not do.

The CRD (crds/toolrl.dev_toolrljobs.yaml) is the one home of defaults: the operator writes `job.json`
with them applied. `DEFAULTS` are the CRD's, derived at import from the copy of its schema generated
from it (toolrl_api.crd_schema, by `make chart-generate`; toolrl_api.defaulting), applied the way the
apiserver would, so a hand-written spec means the same as one that went through the cluster. A field without a
CRD default must be in the spec.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from toolrl_api.crd_schema import SPEC_SCHEMA
from toolrl_api.defaulting import defaults_when_present, object_defaults
from toolrl_api.errors import field_errors
from toolrl_api.spec_types import RewardCustom, Spec

ENGINES = ("vllm", "hf")  # both run without GPUs too (gpusPerWorker 0): vllm as vLLM's CPU build
# spec.trainer.mode: the CRD's enum. The code names the modes it branches on (each checked against the enum
# by tests/unit/trainer_entry/test_spec.py; verl_entry_points.TRAINER_MODES maps each to our trainer).
TRAINER_MODES: tuple[str, ...] = tuple(SPEC_SCHEMA["properties"]["trainer"]["properties"]["mode"]["enum"])
SYNC_TRAINER_MODE = "sync"
COLOCATE_TRAINER_MODE = "colocate-async"
SEPARATE_TRAINER_MODE = "separate-async"
# The estimators of verl's AdvantageEstimator that need no extra config: the CRD's enum (tested against
# verl's enum).
ESTIMATORS: tuple[str, ...] = tuple(
    SPEC_SCHEMA["properties"]["algorithm"]["properties"]["advantageEstimator"]["enum"]
)
# The tool types: the CRD's enum.
TOOL_TYPES: tuple[str, ...] = tuple(SPEC_SCHEMA["properties"]["tools"]["items"]["properties"]["type"]["enum"])

DEFAULTS: dict[str, Any] = object_defaults(SPEC_SCHEMA)
"""`spec` as defaulting fills it: every default outside arrays and optional objects."""
DEFAULTS_WHEN_PRESENT: dict[str, dict[str, Any]] = defaults_when_present(SPEC_SCHEMA)
"""Defaults of an array's items (`tools[]`) and of an optional object (`reward.custom`), by path in spec:
applied to each one given."""
SAVE_FREQ_WITH_VOLUME = 20
"""`checkpoint.saveFreq` when unset and a checkpoint volume is given (the CRD has no default: without a
volume nothing is saved, as /checkpoints is then neither writable nor kept)."""
NEVER = -1
TOOL_DEFAULTS: dict[str, Any] = DEFAULTS_WHEN_PRESENT["tools[]"]
"""CRD defaults of each `spec.tools[]` entry."""
CUSTOM_REWARD_DEFAULTS: dict[str, Any] = DEFAULTS_WHEN_PRESENT["reward.custom"]
"""CRD defaults of `spec.reward.custom` (when it is given)."""
ROLLOUT_WORKERS_DEFAULTS: dict[str, Any] = DEFAULTS_WHEN_PRESENT["cluster.rolloutWorkers"]
"""CRD defaults of `spec.cluster.rolloutWorkers` (when it is given: separate-async)."""


def cpu_only(spec: dict[str, Any]) -> bool:
    """Whether the job trains on CPUs (verl's `cpu` platform): workers without GPUs."""
    return spec["cluster"]["workers"]["gpusPerWorker"] == 0


class SpecError(ValueError):
    """A spec value the trainer cannot run with; the message names the field to fix."""


@dataclass(frozen=True)
class Job:
    """The parts of `job.json` the trainer uses: `spec` as data (what translate.py maps, path by path,
    onto verl's keys) and `typed`, the same spec as the API's classes (what the rest reads)."""

    name: str
    namespace: str
    uid: str
    spec: dict[str, Any]

    @cached_property
    def typed(self) -> Spec:
        """The (defaulted) spec as `toolrl_api.spec_types.Spec`; a field the CRD lacks is a SpecError."""
        try:
            return Spec.model_validate(self.spec)
        except ValidationError as exc:
            raise SpecError("\n".join(field_errors(exc))) from None

    @property
    def custom_reward(self) -> RewardCustom | None:
        """`spec.reward.custom` when the job scores with it (`reward.preset: custom`), else None."""
        reward = self.typed.reward
        return reward.custom if reward.preset == "custom" else None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def with_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with the CRD defaults filled in where the apiserver would fill them."""
    out = _merge(DEFAULTS, spec)
    if isinstance(out.get("tools"), list):
        out["tools"] = [_merge(TOOL_DEFAULTS, t) if isinstance(t, dict) else t for t in out["tools"]]
    if isinstance(out["reward"].get("custom"), dict):
        out["reward"]["custom"] = _merge(CUSTOM_REWARD_DEFAULTS, out["reward"]["custom"])
    if isinstance(out["cluster"].get("rolloutWorkers"), dict):
        out["cluster"]["rolloutWorkers"] = _merge(ROLLOUT_WORKERS_DEFAULTS, out["cluster"]["rolloutWorkers"])
    checkpoint = out["checkpoint"]
    if isinstance(checkpoint, dict) and "saveFreq" not in checkpoint:
        checkpoint["saveFreq"] = SAVE_FREQ_WITH_VOLUME if checkpoint.get("volume") else NEVER
    return out


def parse_job(doc: dict[str, Any]) -> Job:
    """Build a Job from the ConfigMap document, applying defaults and checking values."""
    if not isinstance(doc, dict) or not isinstance(doc.get("spec"), dict):
        raise SpecError("job.json: expected an object with 'spec' (the ToolRLJob written by the operator)")
    meta = doc.get("metadata") or {}
    if not meta.get("name"):
        raise SpecError("job.json: metadata.name is missing")
    job = Job(
        name=str(meta["name"]),
        namespace=str(meta.get("namespace") or "default"),
        uid=str(meta.get("uid") or ""),
        spec=with_defaults(doc["spec"]),
    )
    check_spec(job.spec)
    job.typed  # noqa: B018  # the typed spec, checked once here: a field the CRD lacks stops the load
    return job


def load_job(path: str | Path) -> Job:
    """Read and check `job.json`."""
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(
            f"{path}: job spec not found (the operator mounts it from the J-config ConfigMap)"
        ) from None
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path}: not valid JSON: {exc}") from None
    return parse_job(doc)


def _get(spec: dict[str, Any], field: str) -> Any:
    node: Any = spec
    for part in field.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _need(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise SpecError(f"spec.{field}: {message}")


def check_spec(spec: dict[str, Any]) -> None:
    """Reject a (defaulted) spec the CRD rejects, with the CRD's own messages.

    Every bound, enum and cross-field rule the CRD expresses is applied from the CRD itself
    (toolrl_api.validation: its schema and CEL rules, generated into toolrl_api.crd_schema), with its
    messages: one SpecError lists them all, a line each. The trainer keeps no bound of its own: one it
    needs goes into the CRD, so the apiserver refuses a job the trainer would.
    """
    from toolrl_api.validation import crd_validator  # here: cel-python's import takes a second, once per job

    errors = crd_validator().errors(spec)
    if errors:
        raise SpecError("\n".join(errors))


def mini_batch_size(spec: dict[str, Any]) -> int:
    """verl's `ppo_mini_batch_size`: `algorithm.ppoMiniBatchSize`, else one update per sync interval
    (the whole batch; in separate-async the batch over `trainer.async.parameterSyncStep`)."""
    given = _get(spec, "algorithm.ppoMiniBatchSize")
    if given is not None:
        return given
    batch = _get(spec, "algorithm.trainBatchSize")
    if _get(spec, "trainer.mode") == SEPARATE_TRAINER_MODE:
        return batch // _get(spec, "trainer.async.parameterSyncStep")
    return batch
