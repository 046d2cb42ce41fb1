"""`python -m trainer_entry run --dry-run --spec job.yaml [--compare verl-command]`: a job checked, and its
verl config shown, before `kubectl apply`.

It reads the manifest as applied (YAML or JSON; the whole ToolRLJob or its bare spec; `-` for stdin), applies
the CRD's defaults and validation as the apiserver would, runs every start-up check of `run` that needs no
cluster (each reported on stderr: done, or skipped and why), and prints the fully composed verl config
(verl's `ppo_trainer` with the job's overrides, resolved, as YAML) and the files the run generates. With
`--compare`, the key-by-key difference from a verl command line or overrides file, with where each of the
job's values comes from.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml
from toolrl_api import API_VERSION, KIND

from trainer_entry.spec import SPEC_SCHEMA, Job, SpecError, parse_job

BARE_SPEC_NAME = "dry-run"
DRY_RUN_POOL_URL = "http://<tool-pool>:8080"
ENTRYPOINT = "verl.trainer.main_ppo.run_ppo(config, task_runner_class=trainer_entry.runner.ToolRLTaskRunner)"


def read_manifest(path: str) -> dict[str, Any]:
    """The ToolRLJob in `path` (`-`: stdin): YAML or JSON, one document or a stream holding one ToolRLJob;
    a bare spec becomes a job named `dry-run` in `default`."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            raise SpecError(f"{path}: neither JSON nor YAML: {' '.join(str(exc).split())}") from None
    jobs = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if len(jobs) > 1 or (not jobs and len(docs) != 1):
        raise SpecError(f"{path}: holds {len(docs)} documents and {len(jobs)} ToolRLJobs: give it one")
    doc = jobs[0] if jobs else docs[0]
    if not isinstance(doc, dict):
        raise SpecError(f"{path}: expected a ToolRLJob (or its spec) as a mapping")
    if "kind" in doc and doc["kind"] != KIND:
        raise SpecError(f"{path}: kind {doc['kind']!r}, not {KIND}")
    if "apiVersion" in doc and doc["apiVersion"] != API_VERSION:
        raise SpecError(f"{path}: apiVersion {doc['apiVersion']!r}: the CRD serves {API_VERSION}")
    if "spec" not in doc and not {"apiVersion", "kind", "metadata"} & set(doc):
        unknown = sorted(set(doc) - set(SPEC_SCHEMA["properties"]))
        if unknown:
            raise SpecError(f"{path}: neither a ToolRLJob nor its spec (unknown fields {', '.join(unknown)})")
        doc = {"spec": doc}
    metadata = dict(doc.get("metadata") or {})
    metadata.setdefault("name", metadata.get("generateName") or BARE_SPEC_NAME)
    metadata.setdefault("namespace", "default")
    return {**doc, "metadata": metadata}


def load(path: str) -> Job:
    return parse_job(read_manifest(path))


def report(kind: str, what: str) -> None:
    print(f"{kind}: {what}", file=sys.stderr, flush=True)


def local_file(path: str) -> bool:
    return "://" not in path and Path(path).exists()


def startup_checks(job: Job, reward_file: Path | None) -> None:
    """`run`'s start-up checks that need no cluster, each reported; one that fails raises (SpecError or
    TrainingError) with its message."""
    from trainer_entry import run

    report("check", "spec: the CRD's defaults and validation: ok")
    run.check_engine(job)
    report("check", f"rollout engine {job.typed.rollout.engine}: ok")
    run.check_verl_internals(job)
    report("check", "the verl internals the job relies on (verl_internals.probe): ok")

    model = job.typed.model.path
    if local_file(model) or model.startswith(("./", "../")):
        run.check_model(model)
        report("check", f"model {model}: loadable")
    elif model.startswith("/"):
        report("skipped", f"model {model}: not on this machine (a volume's path in the cluster)")
    else:
        report("skipped", f"model {model}: a hub id; the pods download it (check_model runs there)")

    data = job.spec["data"]
    files = [*data["trainFiles"], *(data.get("valFiles") or [])]
    here = [f for f in files if local_file(f)]
    for path in sorted(set(files) - set(here)):
        report("skipped", f"data {path}: not on this machine (spec.data.volume is mounted at /data)")
    if here:
        run.check_data(
            Job(
                job.name,
                job.namespace,
                job.uid,
                {**job.spec, "data": {**data, "trainFiles": here, "valFiles": []}},
            )
        )
        report("check", f"data {', '.join(here)}: readable, columns and protocol: ok")

    custom = job.custom_reward
    if custom is None:
        report("check", f"reward preset {job.typed.reward.preset}: built in")
    else:
        mounted = Path(os.environ.get("TOOLRL_CUSTOM_REWARD_DIR", run.CUSTOM_REWARD_DIR)) / custom.key
        reward_file = reward_file or mounted
        if not reward_file.is_file():
            report(
                "skipped",
                f"reward: {reward_file} not found (the key {custom.key!r} of ConfigMap "
                f"{custom.config_map!r}): give the file with --reward-file to call it here",
            )
        elif not local_file(data["trainFiles"][0]):
            from trainer_entry.rewards import RewardLoadError, load_function

            try:
                load_function(str(reward_file), custom.function)
            except RewardLoadError as exc:
                raise run.TrainingError(f"spec.reward.custom ({reward_file}): {exc}") from None
            report("check", f"reward {custom.function}() of {reward_file}: imports (no data here to call)")
        else:
            run.check_custom_reward(job, reward_file.parent, reward_file)
            report(
                "check",
                f"reward {custom.function}() of {reward_file}: scored the first training example as verl "
                "calls it in training",
            )
    report("skipped", "tool pool: in the cluster (run waits for its /readyz)")
    if (job.typed.checkpoint.save_freq or 0) > 0:
        report("skipped", "checkpoint directory: on the checkpoint volume in the cluster")


def composed_yaml(config: Any) -> str:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_yaml(config, resolve=True)
    except Exception as exc:  # an interpolation verl resolves only at run time
        report("note", f"the config is shown unresolved: {exc}")
        return OmegaConf.to_yaml(config)


def dry_run(
    job: Job,
    spec_path: str,
    *,
    compare: str | None = None,
    reward_file: Path | None = None,
    overrides_only: bool = False,
) -> int:
    from trainer_entry import run, verl_config
    from trainer_entry.translate import tool_config, translate

    with contextlib.redirect_stdout(sys.stderr):  # what verl prints as it checks; stdout is the config
        startup_checks(job, reward_file)
        pool_url = os.environ.get("TOOLRL_TOOL_POOL_URL", DRY_RUN_POOL_URL)
        translation = translate(job, pool_url)
        tools = tool_config(job, pool_url)  # from the copy of the pool's registry: no pool is asked
        config, warnings = verl_config.compose_job(job, translation)
        for warning in warnings:
            report("warning", warning)
        cut = run.prompt_length_warning(job, config)
        if cut:
            report("warning", cut)
        elif run.prompts_here(job) is not None:
            report("check", "prompts: the first rows of each training file fit the rollout's prompt length")
        for note in verl_config.check(config):
            report("note", note)
    report("check", "verl's config: composed and checked by verl (validate_config, its dataclasses): ok")
    if overrides_only:
        print(run.describe(job, translation, tools, spec_path))
        return 0
    out = [
        f"# verl config of ToolRLJob {job.namespace}/{job.name} ({spec_path}): verl's ppo_trainer composed",
        f"# with the job's overrides, resolved; the run calls {ENTRYPOINT}",
        composed_yaml(config).rstrip(),
    ]
    for name, text in run.generated_files(translation, tools).items():
        out += ["---", f"# {name} (written into the Ray working_dir)", text.rstrip()]
    print("\n".join(out))
    if compare is not None:
        print(comparison(job, translation, config, compare))
    return 0


# --- --compare: a verl command line or overrides file, key by key ---

OVERRIDE = re.compile(r"[+~]{0,2}[A-Za-z_][\w.\-@]*(=|$)")
ASSIGNMENT = re.compile(r"(?:export\s+)?([A-Za-z_]\w*)=(.*)")


def command_overrides(text: str) -> tuple[list[str], list[str]]:
    """The Hydra overrides of a verl command line or script (`python3 -m verl.trainer.main_ppo k=v ...`) or
    of an overrides file (one a line), as the shell hands them to verl: quotes removed, variables the text
    assigns (or the environment has) expanded. Returns them and notes on what was not used."""
    text = re.sub(r"\\\r?\n", " ", text)
    env = dict(os.environ)
    overrides, notes = [], []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        assignment = ASSIGNMENT.fullmatch(line)
        if assignment and len(words) <= 2 and "." not in assignment.group(1):
            env[assignment.group(1)] = _expand(words[-1].split("=", 1)[1], env)
            continue
        for word in words:
            if word.startswith("--config-") or word in ("--config-path", "--config-name", "-cp", "-cn"):
                notes.append(
                    f"{_expand(word, env)}: not read; verl's ppo_trainer is the base here: give that "
                    "config's settings as overrides"
                )
            elif "=" in word and OVERRIDE.match(word):
                overrides.append(_expand(word, env))
    return overrides, notes


def _expand(word: str, env: dict[str, str]) -> str:
    return re.sub(
        r"\$(\w+)|\$\{(\w+)\}",
        lambda m: env.get(m.group(1) or m.group(2), m.group(0)),
        word,
    )


def compose_lenient(overrides: list[str]) -> tuple[Any, list[str]]:
    """verl's ppo_trainer with `overrides`, leaving out (and naming) those verl's config refuses."""
    from hydra.errors import ConfigCompositionException

    from trainer_entry import verl_config

    left_out = []
    todo = list(overrides)
    while True:
        try:
            return verl_config.compose(todo), left_out
        except ConfigCompositionException as exc:
            bad = _refused(str(exc), todo)
            if bad is None:
                raise SpecError(f"--compare: verl cannot compose it: {verl_config.first_line(exc)}") from None
            todo.remove(bad)
            left_out.append(f"{bad}: {verl_config.first_line(exc)}")


def _refused(message: str, overrides: list[str]) -> str | None:
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if f"'{key}'" in message:
            return override
    return None


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def plain(config: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    try:
        return flatten(OmegaConf.to_container(config, resolve=True, throw_on_missing=False))
    except Exception:
        return flatten(OmegaConf.to_container(config, resolve=False, throw_on_missing=False))


ABSENT = "<absent>"


def _same(key: str, mine: dict[str, Any], other: dict[str, Any]) -> bool:
    """Equal values; a file given as a string or a one-file list is the same to verl; an empty dict on one
    side where the other has keys under it is not a difference of its own."""
    a, b = mine.get(key, ABSENT), other.get(key, ABSENT)
    if a == b or [a] == b or a == [b]:
        return True
    if a in ({}, ABSENT) and b in ({}, ABSENT):
        side = other if a == {} else mine
        return any(k.startswith(key + ".") for k in side)
    return False


def show(value: Any) -> str:
    return json.dumps(value, default=str)


def comparison(job: Job, translation: Any, config: Any, compare: str) -> str:
    """The key-by-key difference between the job's config and a verl command's (both composed on verl's
    ppo_trainer), with where each of the job's values comes from."""
    from trainer_entry.translate import override_key, source_of

    source = Path(compare)
    try:
        given_file = source.is_file()
    except OSError:  # a command line longer than a file name may be (ENAMETOOLONG)
        given_file = False
    text = source.read_text() if given_file else compare
    overrides, notes = command_overrides(text)
    theirs, left_out = compose_lenient(overrides)
    mine, other = plain(config), plain(theirs)
    set_by_them = {override_key(o) for o in overrides}
    extra = list(job.spec["trainer"].get("extraArgs") or [])

    def theirs_from(key: str) -> str:
        return "set" if any(key == k or key.startswith(k + ".") for k in set_by_them) else "verl's default"

    differ = [k for k in sorted(set(mine) | set(other)) if not _same(k, mine, other)]
    same = [k for k in sorted(set_by_them) if k in mine and k not in differ]
    label = str(source) if given_file else "the command line"
    lines = [
        "---",
        f"# --compare {label}: {len(overrides)} overrides; {len(differ)} keys differ, {len(same)} keys it "
        "sets are the same",
        "# key: the job's value (where it comes from) | the command's value (set by it, or verl's default)",
    ]
    lines += [f"# not compared: {n}" for n in notes + [f"left out, {e}" for e in left_out]]
    lines.append("differ:")
    for key in differ:
        lines.append(
            f"  {key}: {show(mine.get(key, ABSENT))} ({source_of(key, translation, extra)}) | "
            f"{show(other.get(key, ABSENT))} ({theirs_from(key)})"
        )
    lines.append("same:")
    lines += [f"  {key}: {show(mine[key])} ({source_of(key, translation, extra)})" for key in same]
    return "\n".join(lines)
