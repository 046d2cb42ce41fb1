"""What `import verl` loads from this distribution (entry point group `verl.plugins`), in every
process of a run: the driver, the task runner and every Ray worker, with no environment to set.

It registers the `cpu` platform (used when `VERL_PLATFORM=cpu`) and the `hf` rollout engine.
verl logs a plugin that fails to load only at debug level, so failures are logged here, loudly.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def register() -> None:
    """Register with verl's registries (idempotent)."""
    from verl.workers.rollout import base, replica

    from trainer_entry import cpu_platform, hf_rollout

    cpu_platform.install()
    replica.RolloutReplicaRegistry.register(hf_rollout.ENGINE, lambda: hf_rollout.HFReplica)
    adapter = hf_rollout.HFServerAdapter
    base._ROLLOUT_REGISTRY[(hf_rollout.ENGINE, "async")] = f"{adapter.__module__}.{adapter.__qualname__}"


try:
    register()
except Exception:  # verl would swallow it: say what broke
    log.exception("trainer_entry: registering the cpu platform and the hf rollout with verl failed")
    raise
