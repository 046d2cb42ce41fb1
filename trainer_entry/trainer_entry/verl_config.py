"""Compose our overrides with verl's own `ppo_trainer` config and let verl check the result.

Composition runs in struct mode, so a misspelled key fails here, before any Ray actor starts.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from trainer_entry.spec import SpecError


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


# --- the job's config as a whole: extraArgs vetted, the composed config checked --------------------------

EXTRA_ARGS = "spec.trainer.extraArgs"

# verl keys the job itself must own: an extraArgs entry that sets (or deletes) one is refused, with why and
# what to use instead. By key prefix (the key itself or anything under it).
JOB_OWNED: tuple[tuple[str, str], ...] = (
    (
        "data.custom_cls",
        "the job's dataset class (trainer_entry.dataset.JobDataset) rolls every row out with "
        "spec.rollout.protocol; another class would run the rows' own agent loops: drop the entry",
    ),
    (
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",
        "the job's tools are spec.tools, run by its tool pool; a tool config of your own would replace "
        "them all: declare the tools in spec.tools",
    ),
    (
        "actor_rollout_ref.rollout.agent.agent_loop_config_path",
        "spec.rollout.protocol picks the job's agent loop: set it there",
    ),
    (
        "actor_rollout_ref.rollout.agent.default_agent_loop",
        "spec.rollout.protocol picks the job's agent loop: set it there",
    ),
    (
        "actor_rollout_ref.rollout.multi_turn.enable",
        "the job's agent loops are multi-turn tool loops; they need it on",
    ),
    ("actor_rollout_ref.rollout.mode", "the job's agent loops run on verl's async rollout servers"),
    (
        "trainer.v1.sampler.custom_sampler",
        "the job's sampler is the tool pool's circuit breaker (spec.rollout.toolCall.maxInfraFailureRatio)",
    ),
    (
        "trainer.v1.sampler.sampler_kwargs",
        "they are the circuit breaker's settings (spec.rollout.toolCall.maxInfraFailureRatio)",
    ),
    (
        "reward.custom_reward_function",
        "spec.reward chooses the reward (a preset, or custom: a function from a ConfigMap)",
    ),
    ("trainer.v1.trainer_mode", "spec.trainer.mode chooses the trainer: set it there"),
)
# Dicts verl hands on as they are (a model's config, an engine's arguments): any key may be added there.
FREE_FORM = (
    "actor_rollout_ref.model.override_config",
    "critic.model.override_config",
    "actor_rollout_ref.rollout.engine_kwargs",
    "reward.custom_reward_function.reward_kwargs",
    "reward.reward_kwargs",  # handed to the reward manager (verl's dapo manager reads two keys)
)


def _present(config: DictConfig, key: str) -> bool:
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent) if parent else config
    return isinstance(node, DictConfig) and leaf in node


def _keys(config: DictConfig, prefix: str = "") -> list[str]:
    """Every key of `config`, dotted, without resolving a value."""
    out = []
    for name in config:
        key = f"{prefix}{name}"
        out.append(key)
        node = config._get_node(name)
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none():
            out += _keys(node, key + ".")
    return out


def _closest(key: str, config: DictConfig) -> str | None:
    """The key of `config` most like `key` (a misspelling), if one is close."""
    import difflib

    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(config, parent) if parent else config
    if isinstance(node, DictConfig):  # a sibling first: `trainer.total_epoch` -> `trainer.total_epochs`
        near = difflib.get_close_matches(leaf, [str(k) for k in node], n=1, cutoff=0.75)
        if near:
            return f"{parent}.{near[0]}" if parent else near[0]
    near = difflib.get_close_matches(key, _keys(config), n=1, cutoff=0.85)
    return near[0] if near else None


def _verl_mentions(name: str) -> bool:
    """Whether verl's source (or ours) uses `name` anywhere: a key nothing mentions is read by nothing."""
    import re

    return bool(re.search(rf"\b{re.escape(name)}\b", _sources()))


@functools.cache
def _sources() -> str:
    import verl

    roots = [Path(verl.__file__).parent, Path(__file__).parent]
    return "\n".join(p.read_text(errors="replace") for root in roots for p in root.rglob("*.py"))


def vet_extra_args(extra_args: list[str], base: DictConfig) -> None:
    """Refuse, one line each (one SpecError), the `spec.trainer.extraArgs` entries that would be ignored,
    would replace what the job must own, or name no key of verl's config. `base` is the job's config
    composed without them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    errors = []
    parser = OverridesParser.create()
    for i, text in enumerate(extra_args):
        where = f"{EXTRA_ARGS}[{i}] {text!r}"
        try:
            (override,) = parser.parse_overrides([text])
        except HydraException as exc:
            errors.append(f"{where}: not a verl override (key=value): {first_line(exc)}")
            continue
        key = override.key_or_group
        if override.package is not None or "/" in key:
            errors.append(f"{where}: config groups cannot be chosen here; set the keys themselves")
            continue
        owned = next((why for k, why in JOB_OWNED if key == k or key.startswith(k + ".")), None)
        if owned:
            errors.append(f"{where}: refused: {key} is set by the job; {owned}")
            continue
        present = _present(base, key)
        if override.type == OverrideType.CHANGE and not present:
            near = _closest(key, base)
            hint = (
                f"did you mean {near}=...?"
                if near
                else "check the spelling against the composed config (python -m trainer_entry run --dry-run)"
            )
            errors.append(
                f"{where}: verl's config has no key {key}: {hint} (a leading '+' would add it, but verl "
                "reads only the keys its config declares, and a few more by name)"
            )
        elif override.type == OverrideType.ADD and present:
            errors.append(f"{where}: {key} is already in verl's config: drop the '+' ({text.lstrip('+')})")
        elif override.type in (OverrideType.ADD, OverrideType.FORCE_ADD) and not present:
            if any(key.startswith(p + ".") for p in FREE_FORM):
                continue
            near = _closest(key, base)
            leaf = key.rpartition(".")[2]
            if near and near.rpartition(".")[2] != leaf:
                errors.append(f"{where}: verl's config has no key {key}: did you mean {near} (without '+')?")
            elif key.startswith("trainer.") and not _verl_mentions(leaf):
                errors.append(
                    f"{where}: nothing in verl {_verl_version()} reads a key {leaf!r}, so {key} would be "
                    "ignored: check the spelling against the composed config (python -m trainer_entry "
                    "run --dry-run)"
                )
        elif override.type == OverrideType.DEL and not present:
            errors.append(f"{where}: verl's config has no key {key} to delete")
    if errors:
        raise SpecError("\n".join(errors))


def _verl_version() -> str:
    import verl

    return str(getattr(verl, "__version__", "?"))


def compose_job(job: Any, translation: Any) -> tuple[DictConfig, list[str]]:
    """The job's verl config (verl's `ppo_trainer` with the translation's overrides) and its warnings.

    `spec.trainer.extraArgs` are vetted first against the config the job composes without them
    (vet_extra_args: refused with the reason, one line each, instead of Hydra's traceback); an entry that
    replaces a value a spec field sets is composed and warned about. Then the composed config is
    checked for settings verl would accept and not apply (config_problems)."""
    from trainer_entry.translate import COVERED_WHEN_UNSET, override_key, spec_source

    extra = list(job.spec["trainer"].get("extraArgs") or [])
    own = translation.overrides[: len(translation.overrides) - len(extra)]
    base = compose(own)
    warnings: list[str] = []
    config = base
    if extra:
        vet_extra_args(extra, base)
        config = compose_or_explain(translation.overrides)
        for text in extra:
            key = text.split("=", 1)[0].lstrip("+~")
            field = spec_source(key)
            if field and any(key == k or key.startswith(k + ".") for k in map(override_key, own)):
                warnings.append(
                    f"{EXTRA_ARGS} {text!r} replaces what {field} sets "
                    f"({_show(OmegaConf.select(base, key))}): set the field instead"
                )
            elif field and any(key == k or key.startswith(k + ".") for k in COVERED_WHEN_UNSET):
                warnings.append(f"{EXTRA_ARGS} {text!r} sets what {field} covers: set the field instead")
    config_problems(job, config)
    data = job.spec["data"]
    if data.get("valFiles") and "valFreq" not in data and int(config.trainer.test_freq) <= 0:
        warnings.append(
            "spec.data.valFiles are validated before training only (verl's trainer.test_freq is "
            f"{config.trainer.test_freq}): set spec.data.valFreq to validate every N steps as well"
        )
    return config, warnings


def _show(value: Any) -> str:
    if isinstance(value, DictConfig | ListConfig):
        value = OmegaConf.to_container(value, resolve=True)
    return repr(value)


def compose_or_explain(overrides: list[str]) -> DictConfig:
    """compose(), with Hydra's composition error as one SpecError line."""
    from hydra.errors import ConfigCompositionException

    try:
        return compose(overrides)
    except ConfigCompositionException as exc:
        raise SpecError(f"{EXTRA_ARGS}: verl cannot compose the config: {first_line(exc)}") from None


def config_problems(job: Any, config: DictConfig) -> None:
    """Refuse a composed config with a setting that verl would accept and then not apply, or that
    cannot work with what the job forces; each message says why and what to do."""
    errors = []
    sampler = config.trainer.v1.sampler.get("custom_sampler")
    filter_groups = config.algorithm.get("filter_groups")
    dynamic = job.typed.algorithm.dynamic_sampling.enabled
    by_extra_args = filter_groups is not None and filter_groups.get("enable") and not dynamic
    if by_extra_args and sampler and sampler.get("path"):
        errors.append(
            "algorithm.filter_groups.enable=true (DAPO's dynamic sampling) would do nothing: verl "
            f"{_verl_version()} applies it only in its own replay buffer and skips it when "
            "trainer.v1.sampler.custom_sampler is set (verl/trainer/ppo/v1/trainer_base.py, "
            "_build_replay_buffer), as every job does (its circuit breaker, "
            f"{sampler.get('name')}, which applies spec.algorithm.dynamicSampling): remove it from "
            f"{EXTRA_ARGS} and set spec.algorithm.dynamicSampling instead (enabled, metric,"
            " maxGenerationBatches)"
        )
    errors += overlong_problems(job, config)
    for section in ("actor_rollout_ref", "critic"):
        model = config[section].model
        attention = (model.get("override_config") or {}).get("attn_implementation")
        if attention == "sdpa" and model.get("use_remove_padding"):
            errors.append(
                f"{section}.model.use_remove_padding=true with attn_implementation sdpa cannot work: verl "
                "packs the batch's sequences into one and keeps them apart only in flash-attention "
                "(verl/models/transformers/monkey_patch.py), so with SDPA each would attend to the ones "
                f"before it: in an image with flash-attn set {section}.model.override_config."
                "attn_implementation=flash_attention_2 too (images/README.md), else drop it"
            )
    if errors:
        raise SpecError("\n".join(errors))


def overlong_problems(job: Any, config: DictConfig) -> list[str]:
    """DAPO's overlong penalty takes effect only in verl's dapo reward manager: refuse the penalty's settings
    where another manager would ignore them, and a spec.reward.overlongPenalty whose manager extraArgs
    replaced."""
    from trainer_entry.translate import DAPO_REWARD_MANAGER

    manager = config.reward.reward_manager
    dapo = manager.get("source") == "register" and manager.get("name") == DAPO_REWARD_MANAGER
    buffer = (config.reward.get("reward_kwargs") or {}).get("overlong_buffer_cfg") or {}
    if dapo or not buffer.get("enable"):
        return []
    if job.typed.reward.overlong_penalty.enabled:
        return [
            f"spec.reward.overlongPenalty needs verl's {DAPO_REWARD_MANAGER} reward manager, the only one "
            f"that applies it, and {EXTRA_ARGS} replaces it (reward.reward_manager: {manager.get('source')} "
            f"{manager.get('name')}): drop that entry, or disable spec.reward.overlongPenalty"
        ]
    return [
        "reward.reward_kwargs.overlong_buffer_cfg.enable=true (DAPO's overlong penalty) would do nothing: "
        f"verl {_verl_version()} applies it only in its {DAPO_REWARD_MANAGER} reward manager, and this "
        f"job's is {manager.get('name')}: set spec.reward.overlongPenalty {{enabled: true, bufferLength: N}} "
        f"instead and remove the reward_kwargs from {EXTRA_ARGS}"
    ]
