"""Issue 32's GPU defaults, as the CRD (applied by the trainer too) and the translation hold them."""

from __future__ import annotations

from toolrl_api.validation import crd_validator
from trainer_entry.spec import parse_job, with_defaults
from trainer_entry.translate import STORAGE_UNITS_KEY, translate

from .test_placement import example


def errors(doc: dict) -> list[str]:
    return crd_validator().errors(with_defaults(doc["spec"]))


def test_gpu_memory_utilization_is_bounded_where_vllm_shares_the_gpu_with_training():
    doc = example()
    doc["spec"]["rollout"]["gpuMemoryUtilization"] = 0.9
    (error,) = errors(doc)
    assert error.startswith(
        "spec.rollout.gpuMemoryUtilization: rollout.gpuMemoryUtilization above 0.85 leaves"
    )
    doc["spec"]["rollout"]["gpuMemoryUtilization"] = 0.85
    assert errors(doc) == []


def test_checkpoint_retention_reaches_verl_and_unset_keeps_all():
    doc = example()
    overrides = translate(parse_job(doc), "http://pool").overrides
    assert not [o for o in overrides if "ckpt_to_keep" in o]
    doc["spec"]["checkpoint"]["maxToKeep"] = 2
    overrides = translate(parse_job(doc), "http://pool").overrides
    assert (
        "trainer.max_actor_ckpt_to_keep=2" in overrides and "trainer.max_critic_ckpt_to_keep=2" in overrides
    )


def test_a_gpu_job_gets_one_storage_unit_per_ray_node_and_the_short_ttl():
    job = parse_job(example())
    assert f"{STORAGE_UNITS_KEY}=3" in translate(job, "http://pool").overrides  # head + 2 workers
    assert job.spec["runPolicy"]["ttlSecondsAfterFinished"] == 300
