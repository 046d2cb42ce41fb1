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


def check(config: DictConfig) -> None:
    """Run verl's own validation and dataclass conversion on the sections it can convert."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    rollout = config.actor_rollout_ref.rollout
    for section in (
        rollout,
        rollout.multi_turn,
        rollout.agent,
        config.algorithm,
        config.actor_rollout_ref.actor,
    ):
        omega_conf_to_dataclass(section)
