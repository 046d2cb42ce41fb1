"""Compose our overrides with verl's own `ppo_trainer` config and let verl check the result.

Composition runs in struct mode, so a misspelled key fails here, before any Ray actor starts.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig


def verl_config_dir() -> str:
    """The directory of verl's Hydra configs inside the installed package."""
    import verl

    return str(Path(verl.__file__).parent / "trainer" / "config")


def compose(overrides: list[str]) -> DictConfig:
    """verl's `ppo_trainer` config with `overrides` applied, exactly as `main_ppo` would build it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def model_load_failure(exc: BaseException) -> OSError | None:
    """The OSError behind `exc` if it is a model or tokenizer that could not be loaded (no network
    to the hub, a missing path), else None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def check(config: DictConfig) -> list[str]:
    """Run verl's own validation and dataclass conversion on the sections it can convert.

    verl reads the model's config while it validates a critic. When the model cannot be loaded
    here (a hub id without network, a path only the cluster has), everything else is still
    checked; the returned notes say what was skipped.
    """
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    notes = []
    use_reference = need_reference_policy(config)
    try:
        validate_config(config, use_reference_policy=use_reference, use_critic=need_critic(config))
    except Exception as exc:
        cause = model_load_failure(exc)
        if cause is None:
            raise
        notes.append(
            f"model {config.critic.model.path!r} cannot be loaded here ({first_line(cause)}); "
            "verl's critic checks, which read the model's config, were skipped"
        )
        validate_config(config, use_reference_policy=use_reference, use_critic=False)
    rollout = config.actor_rollout_ref.rollout
    for section in (
        rollout,
        rollout.multi_turn,
        rollout.agent,
        config.algorithm,
        config.actor_rollout_ref.actor,
    ):
        omega_conf_to_dataclass(section)
    return notes


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (or its type), for messages that name a cause."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
