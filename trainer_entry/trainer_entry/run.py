"""`python -m trainer_entry run`: the job spec becomes a verl run on the Ray cluster this pod is in.

Steps: translate the spec, write the generated files into a Ray working_dir (so every node sees
them), compose and check verl's config, wait for the tool pool, read the tools it serves and write the
tool config from them, start the metrics hub on this node, and hand the config to verl's `run_ppo` with
our task runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainer_entry import cpu_platform
from trainer_entry.node_watch import NodeWatch, PlacementWatch
from trainer_entry.pool_client import PoolClient
from trainer_entry.progress import SA_DIR
from trainer_entry.spec import SEPARATE_TRAINER_MODE, Job, SpecError, cpu_only
from trainer_entry.translate import (
    AGENT_LOOPS_FILE,
    CUSTOM_REWARD_FILE,
    DEFAULT_POOL_WAIT_SECONDS,
    LOGICAL_CPUS_PER_CPU_WORKER,
    TOOL_CONFIG_FILE,
    Translation,
    mcp_tools,
    ray_gpus,
    ray_nodes,
    tool_config,
    tool_schema,
    translate,
)
from trainer_entry.verl_config import first_line

CUSTOM_REWARD_DIR = Path("/etc/toolrl/reward")
DEFAULT_METRICS_PORT = 9400
# Ray gives a starting node a fixed 30 s to register; on an overloaded machine that fails (seen
# at load 15 on 2 cores), and a second start usually succeeds.
LOCAL_RAY_ATTEMPTS = 3
EXIT_NODE_LOST = 1  # as any TrainingError (__main__)
# how long a failed actor call waits for Ray to say whether the actor's node died (its health checks
# marked a crashed node dead within ~50 s here)
ACTOR_LOSS_GRACE_SECONDS = 90.0
LOCAL_RAY_REGISTER_SECONDS = 180


@dataclass(frozen=True)
class Environment:
    """What the operator puts in the Ray head's environment (docs/contracts.md)."""

    pool_url: str
    job_name: str
    namespace: str
    metrics_port: int
    pool_wait_seconds: float
    service_account_dir: str
    custom_reward_dir: Path = CUSTOM_REWARD_DIR

    @classmethod
    def from_env(cls, job: Job) -> Environment:
        url = os.environ.get("TOOLRL_TOOL_POOL_URL", "")
        if not url:
            raise SpecError("TOOLRL_TOOL_POOL_URL is not set: the trainer needs the tool pool's Service URL")
        return cls(
            pool_url=url,
            job_name=os.environ.get("TOOLRL_JOB_NAME", job.name),
            namespace=os.environ.get("TOOLRL_JOB_NAMESPACE", job.namespace),
            metrics_port=_env_number("TOOLRL_METRICS_PORT", DEFAULT_METRICS_PORT, int, 1, 65535),
            pool_wait_seconds=_env_number("TOOLRL_POOL_WAIT_SECONDS", DEFAULT_POOL_WAIT_SECONDS, float, 0),
            service_account_dir=os.environ.get("TOOLRL_SERVICE_ACCOUNT_DIR", SA_DIR),
            custom_reward_dir=Path(os.environ.get("TOOLRL_CUSTOM_REWARD_DIR", str(CUSTOM_REWARD_DIR))),
        )


def _env_number(name: str, default: float, kind: type, low: float, high: float | None = None) -> Any:
    """A numeric environment variable, or a SpecError that names it and says what it must be."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return kind(default)
    what = "an integer" if kind is int else "a number"
    bounds = f" in [{low}, {high}]" if high is not None else f" >= {low}"
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or value != value or value < low or (high is not None and value > high):
        raise SpecError(
            f"environment variable {name}={raw!r}: must be {what}{bounds} (unset it for {default})"
        )
    return value


def generated_files(translation: Translation, tools: dict[str, Any]) -> dict[str, str]:
    """Name → text of every file the run writes for verl (`tools`: translate.tool_config)."""
    return {TOOL_CONFIG_FILE: _yaml(tools), AGENT_LOOPS_FILE: _yaml(translation.agent_loops)}


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def write_workdir(
    job: Job, translation: Translation, workdir: Path, reward_dir: Path = CUSTOM_REWARD_DIR
) -> None:
    """Write what the spec alone decides into `workdir`: the agent-loop YAML and the custom reward
    (from its ConfigMap). The tool config follows once the pool's tools are read (write_tool_config)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / AGENT_LOOPS_FILE).write_text(_yaml(translation.agent_loops))
    custom = job.custom_reward
    if custom is not None:
        key = custom.key
        source = reward_dir / key
        if not source.is_file():
            raise SpecError(
                f"spec.reward.custom: {source} not found; the ConfigMap "
                f"{custom.config_map!r} must hold the key {key!r}"
            )
        shutil.copyfile(source, workdir / CUSTOM_REWARD_FILE)


def write_tool_config(workdir: Path, tools: dict[str, Any]) -> None:
    """Write the tool-config YAML (`tools`: translate.tool_config) into `workdir`, where verl's config
    names it (translate.TOOL_CONFIG_FILE)."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / TOOL_CONFIG_FILE).write_text(_yaml(tools))


def describe(job: Job, translation: Translation, tools: dict[str, Any], spec_path: str) -> str:
    """The dry-run text: the exact verl call with its overrides, and the generated files."""
    lines = [
        "# entrypoint: verl.trainer.main_ppo.run_ppo(config,"
        " task_runner_class=trainer_entry.runner.ToolRLTaskRunner)",
        "# config: verl's ppo_trainer composed with these overrides (equivalent command line):",
        "python -m verl.trainer.main_ppo \\",
    ]
    lines += [f"  {shlex.quote(o)} \\" for o in translation.overrides[:-1]]
    lines.append(f"  {shlex.quote(translation.overrides[-1])}")
    for name, text in generated_files(translation, tools).items():
        lines += ["", f"# --- {name} (in the Ray working_dir) ---", text.rstrip()]
    lines += ["", f"# spec: {spec_path}; job {job.namespace}/{job.name}"]
    return "\n".join(lines)


async def wait_for_pool(url: str, timeout: float, interval: float = 2.0) -> None:
    """Return when the pool answers `/readyz`; raise after `timeout` seconds with what to check."""
    client = PoolClient(url)
    deadline = time.monotonic() + timeout
    try:
        while not await client.ready():
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"tool pool at {url} not ready after {timeout:.0f}s: check the J-tools Deployment "
                    "(kubectl get deploy,pods -l app.kubernetes.io/component=tool-pool) and its /readyz"
                )
            await asyncio.sleep(interval)
    finally:
        await client.close()


async def read_pool_tools(url: str) -> list[dict[str, Any]]:
    client = PoolClient(url)
    try:
        return await client.tools()
    finally:
        await client.close()


def check_pool_tools(job: Job, pool_tools: list[dict[str, Any]]) -> None:
    """The pool serves the job's tools (GET /v1/tools): each entry under its name and type, and each
    mcp entry at least one tool of its server (the pool lists the server's at start)."""
    served = {t["name"]: t.get("type") for t in pool_tools}
    for tool in job.spec["tools"]:
        if tool["type"] == "mcp" and not mcp_tools(tool, pool_tools):
            raise SpecError(
                f"spec.tools {tool['name']!r}: the tool pool serves no tool of the MCP server"
                f" {tool['mcp']['url']}; served: {', '.join(t['name'] for t in pool_tools)}"
            )
        if tool["type"] != "mcp" and served.get(tool["name"]) != tool["type"]:
            raise SpecError(
                f"spec.tools {tool['name']!r}: the tool pool serves no {tool['type']} tool of that name"
                f" (served: {', '.join(f'{n} ({k})' for n, k in served.items())}); its tools.yaml is not"
                " this job's spec.tools: check the pool's ConfigMap"
            )


def check_model(path: str) -> None:
    """Fail early, with the cause, when the model's config cannot be loaded from `path`."""
    from transformers import AutoConfig

    local = path.startswith(("/", "./", "../")) or Path(path).exists()
    if local and not Path(path).exists():
        raise SpecError(f"spec.model.path: {path} does not exist; mount the volume that holds the model")
    try:
        AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        where = "the directory holds no loadable model" if local else "a hub id needs access to the hub"
        raise SpecError(f"spec.model.path: cannot load {path!r} ({where}): {first_line(exc)}") from exc


def check_engine(job: Job) -> None:
    """Fail early, saying what to do, when this image cannot run the job's rollout engine: on CPUs,
    `vllm` needs vLLM's CPU build (a GPU build, or none, fails only inside a Ray worker)."""
    from importlib import metadata

    from trainer_entry.verl_plugin import VLLM_CPU_LABEL, VLLM_VERSION

    if not cpu_only(job.spec) or job.typed.rollout.engine != "vllm":
        return
    try:
        installed = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        installed = None
    if installed != VLLM_VERSION + VLLM_CPU_LABEL:
        have = f"vllm {installed}" if installed else "no vLLM"
        raise SpecError(
            "spec.rollout.engine: vllm with cluster.workers.gpusPerWorker 0 runs vLLM's CPU build "
            f"(vllm-cpu {VLLM_VERSION}, installed as vllm {VLLM_VERSION}{VLLM_CPU_LABEL}) and this "
            f"environment has {have}: run it with a trainer image that has vLLM's CPU build, or use "
            "rollout.engine hf"
        )


def start_ray(job: Job, runtime_env: dict[str, Any]) -> None:
    """Join the Ray cluster named by RAY_ADDRESS (a RayJob's driver has it; `auto` joins one started
    with `ray start` on this machine); without it, start a local one for this run. On CPUs each
    worker process gets one logical GPU, which is what verl's resource pools ask Ray for."""
    import ray

    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, runtime_env=runtime_env)
        return
    # "local": a new Ray of its own even when another runs on the machine (without it, ray.init joins
    # the newest one it finds, and refuses the CPU and GPU counts below: seen beside a test's Ray)
    kwargs: dict[str, Any] = {"address": "local", "runtime_env": runtime_env, "include_dashboard": False}
    if cpu_only(job.spec):
        # verl schedules its actors by logical CPUs; the processes themselves share the machine
        num_cpus = max(LOGICAL_CPUS_PER_CPU_WORKER, os.cpu_count() or 1)
        kwargs.update(num_cpus=num_cpus, num_gpus=ray_gpus(job))
    print("trainer_entry: RAY_ADDRESS is unset: starting a local Ray for this run", flush=True)
    # How long Ray's core waits for a starting node to register (its own error names this setting);
    # the default 30 s is missed on a loaded machine.
    os.environ.setdefault("RAY_raylet_start_wait_time_s", str(LOCAL_RAY_REGISTER_SECONDS))
    for attempt in range(1, LOCAL_RAY_ATTEMPTS + 1):
        try:
            ray.init(**kwargs)
            return
        except Exception as exc:  # Ray raises a bare Exception for this
            if "timed out during startup" not in str(exc):
                raise
            ray.shutdown()
            _stop_children()  # the failed attempt's GCS and raylet outlive ray.shutdown()
            if attempt == LOCAL_RAY_ATTEMPTS:
                raise TrainingError(
                    f"a local Ray did not start in {LOCAL_RAY_ATTEMPTS} attempts (its node did not register "
                    "in time; the machine is too loaded): retry when it is quieter, or raise "
                    "RAY_raylet_start_wait_time_s"
                ) from exc
            print(f"trainer_entry: local Ray start {attempt} timed out; retrying", flush=True)


def check_verl_internals(job: Job) -> None:
    """Fail at once, with the list, when the installed verl (Ray, vLLM) moved an internal this job's run
    relies on (verl_internals.probe), instead of mid-training."""
    from trainer_entry import verl_internals

    contexts = [verl_internals.ALWAYS]
    if cpu_only(job.spec):
        contexts.append(verl_internals.CPU)
        if job.typed.rollout.engine == "vllm":
            contexts.append(verl_internals.VLLM_CPU)
    if job.typed.trainer.mode == SEPARATE_TRAINER_MODE:
        contexts.append(verl_internals.SEPARATE)
    try:
        verl_internals.check(contexts)
    except verl_internals.InternalsMoved as exc:
        raise TrainingError(str(exc)) from None


def run(job: Job, env: Environment, workdir: Path) -> None:
    """Train: everything from here on runs on the Ray cluster (RAY_ADDRESS, or a local one)."""
    if cpu_only(job.spec):
        use_cpu_platform()
    check_engine(job)
    check_verl_internals(job)  # before anything imports what may have moved
    import ray
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
    from verl.trainer.main_ppo import run_ppo

    from trainer_entry import verl_config
    from trainer_entry.hub import HubSettings, start_hub
    from trainer_entry.runner import ToolRLTaskRunner

    translation = translate(job, env.pool_url, env.pool_wait_seconds)
    write_workdir(job, translation, workdir, env.custom_reward_dir)  # all but the tool config
    config, warnings = verl_config.compose_job(job, translation)
    for warning in warnings:
        print(f"trainer_entry: warning: {warning}", flush=True)
    check_model(job.typed.model.path)
    verl_config.check(config)
    check_data(job)
    cut = prompt_length_warning(job, config)
    if cut:
        print(f"trainer_entry: warning: {cut}", flush=True)
    check_checkpoint_dir(int(config.trainer.save_freq), str(config.trainer.default_local_dir))
    check_custom_reward(job, workdir)
    asyncio.run(wait_for_pool(env.pool_url, env.pool_wait_seconds))
    # the tools' schemas as the ready pool serves them (an mcp entry's tools are known only there)
    pool_tools = asyncio.run(read_pool_tools(env.pool_url))
    check_pool_tools(job, pool_tools)
    write_tool_config(workdir, tool_config(job, env.pool_url, pool_tools))

    runtime_env = dict(get_ppo_ray_runtime_env(config))
    runtime_env["working_dir"] = str(workdir)
    if cpu_only(job.spec):
        runtime_env.setdefault("env_vars", {})[cpu_platform.PLATFORM_ENV] = cpu_platform.PLATFORM
    start_ray(job, runtime_env)
    storage_units = int(config.transfer_queue.backend.SimpleStorage.num_data_storage_units)
    check_placement(job, storage_units)
    if not cpu_only(job.spec):
        check_gpu_drivers()
    algo = job.typed.algorithm
    hub = start_hub(
        HubSettings(
            port=env.metrics_port,
            trajectories_per_step=algo.train_batch_size * algo.rollouts_per_prompt,
            expected_calls_per_trajectory=float(job.typed.rollout.max_tool_turns),
            job_name=env.job_name,
            namespace=env.namespace,
            report_progress=True,
            service_account_dir=env.service_account_dir,
            job_uid=job.uid,
        )
    )
    watch = NodeWatch(ray.nodes, lambda message: end_attempt(hub, message)).start()
    placement_watch = PlacementWatch(
        ray.util.placement_group_table,
        ray.nodes,
        lambda message: end_attempt(hub, message, event="placement_pending"),
        timeout=float(job.typed.run_policy.placement_timeout_seconds),
        advice=lambda nodes: placement_problem(job, storage_units, nodes),
    ).start()
    try:
        run_ppo(config, task_runner_class=ToolRLTaskRunner)
    except ray.exceptions.RayError as exc:
        print(f"trainer_entry: the run failed; Ray's report:\n{exc}", file=sys.stderr, flush=True)
        if actor_lost(exc):
            # an actor unreachable (seen: its node crashed, the call failed 20 s before Ray marked the
            # node dead): if its node died, the attempt ends saying so, as the watch would have
            lost = watch.loss_within(ACTOR_LOSS_GRACE_SECONDS)
            if lost:
                end_attempt(hub, lost)
        raise TrainingError(explain_ray_failure(exc)) from exc
    finally:
        watch.stop()
        placement_watch.stop()
        ray.get(hub.finish.remote())
        ray.shutdown()


def actor_lost(exc: BaseException) -> bool:
    """An actor of the run unreachable or dead, raised as is or as the cause of an actor's task (verl's
    task runner is an actor: the workers' failures reach the driver inside its RayTaskError)."""
    import ray

    for _ in range(4):
        if isinstance(exc, ray.exceptions.RayActorError):
            return True
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException):
            return False
        exc = cause
    return False


def end_attempt(
    hub: Any, message: str, exit: Callable[[int], Any] = os._exit, event: str = "node_lost"
) -> None:
    """A Ray node died mid-run (NodeWatch), or verl's placement stayed pending (PlacementWatch): post the
    Event (the hub's `event` method), write the status as it stands (the hub's finish, as a run that ends
    normally does: the trajectory counts of the steps done), and end this process, which fails the Ray job
    and so ends the attempt; verl would wait forever. The main thread is blocked in verl's ray.get, so the
    process ends from here."""
    import ray

    for report in (lambda: getattr(hub, event).remote(message), hub.finish.remote):
        with contextlib.suppress(Exception):  # best effort: the message is in the log anyway
            ray.get(report(), timeout=30)
    print(f"error: {message}", file=sys.stderr, flush=True)
    exit(EXIT_NODE_LOST)


def _stop_children(grace: float = 10.0) -> None:
    """Stop every process this one started (here: what a failed local Ray start left behind)."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def check_data(job: Job) -> None:
    """Refuse data prepared for another tool-call protocol than the job's (data.check_protocol)."""
    from trainer_entry.data import DataError, check_protocol

    data = job.typed.data
    files = [*data.train_files, *(data.val_files or [])]
    try:
        notes = check_protocol(files, job.typed.rollout.protocol)
    except DataError as exc:
        raise SpecError(f"spec.data: {exc}") from None
    for path in files:
        check_columns(path)
    for note in notes:
        print(f"trainer_entry: note: {note}", flush=True)


def prompts_here(job: Job) -> tuple[str, list[str]] | None:
    """The job's model directory and its training files on this machine, or None when either is not
    here (a hub id, a volume's path in the cluster): what the prompt-length check reads."""
    model = job.typed.model.path
    files = [f for f in job.typed.data.train_files if "://" not in f and Path(f).is_file()]
    return (model, files) if files and Path(model).is_dir() else None


def prompt_length_warning(job: Job, config: Any, sample: int = 64) -> str | None:
    """What a user must hear when prompts are longer than the rollout's prompt length (the composed
    `config`'s, from `spec.data.maxPromptLength` unless `extraArgs` change it): verl's agent loop keeps
    only a longer prompt's last tokens (a warning per prompt in a worker's log), so the start of the
    conversation goes, the system prompt that teaches the tool-call protocol first. Measured on the
    first `sample` rows of each local training file, rendered with the model's tokenizer as the agent
    loop renders them (hermes with the tools' schemas); None when they fit, when verl drops long prompts
    instead (`data.filter_overlong_prompts`, which says so itself) or when nothing local can be read."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    here = prompts_here(job)
    if here is None or config.data.get("filter_overlong_prompts"):
        return None
    model, files = here
    tokenizer = AutoTokenizer.from_pretrained(model)
    schemas = None
    if job.typed.rollout.protocol == "hermes":  # mcp tools are listed by the pool, not known here
        schemas = [tool_schema(t) for t in job.spec["tools"] if t["type"] != "mcp"]
    limit, lengths = int(config.actor_rollout_ref.rollout.prompt_length), []
    for path in files:
        batch = next(pq.ParquetFile(path).iter_batches(batch_size=sample, columns=[PROMPT_COLUMN]), None)
        for row in batch.to_pylist() if batch is not None else []:
            text = tokenizer.apply_chat_template(
                list(row[PROMPT_COLUMN]), tools=schemas, add_generation_prompt=True, tokenize=False
            )
            lengths.append(len(tokenizer.encode(text, add_special_tokens=False)))
    long = [n for n in lengths if n > limit]
    if not long:
        return None
    return (
        f"spec.data: {len(long)} of the first {len(lengths)} prompts are longer than the rollout's "
        f"prompt length (spec.data.maxPromptLength: {limit} tokens; the longest {max(long)}): verl keeps "
        f"only their last {limit} tokens, so their start, the system prompt that teaches the tool-call "
        "protocol, is cut and the model is not told how to call its tools; set spec.data.maxPromptLength "
        f"to at least {max(long)} or shorten the prompts"
    )


# The columns verl reads from every row: the prompt (`data.prompt_key`, which the job leaves at verl's
# `prompt`), and for the reward `data_source` and `reward_model.ground_truth` (NaiveRewardManager).
PROMPT_COLUMN = "prompt"


def check_columns(path: str) -> None:
    """A local parquet file has the columns verl reads (a remote one is not read here)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if "://" in path:
        return
    schema = pq.read_schema(path)
    missing = [c for c in (PROMPT_COLUMN, "data_source", "reward_model") if c not in schema.names]
    if not missing:
        reward = schema.field("reward_model").type
        if not pa.types.is_struct(reward) or reward.get_field_index("ground_truth") < 0:
            missing = ["reward_model.ground_truth"]
    if missing:
        raise SpecError(
            f"spec.data: {path}: no column {', '.join(missing)} (verl reads the prompt from 'prompt' and "
            "scores with 'data_source' and 'reward_model.ground_truth'): prepare the data with `python -m "
            "trainer_entry.data` or verl's data_preprocess scripts"
        )


def check_checkpoint_dir(save_freq: int, directory: str) -> None:
    """A run that saves checkpoints can write them: found now, not when the first save fails."""
    if save_freq <= 0:
        return
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".toolrl-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise SpecError(
            f"spec.checkpoint.volume: {path} is not writable by uid {os.getuid()} ({exc.strerror}): the "
            "Ray pods run as uid/gid 1000 with fsGroup 1000, which makes most volumes writable; a volume "
            "that ignores fsGroup (NFS, hostPath-backed) must be writable by uid or gid 1000"
        ) from None


def placement_problem(job: Job, storage_units: int, nodes: list[dict[str, Any]]) -> str | None:
    """trainer_entry.placement's shortfall of `job` on `nodes` (`ray.nodes()`), None when it fits."""
    import ray

    from trainer_entry import placement

    alive = placement.nodes_from_ray(nodes, ray.get_runtime_context().get_node_id())
    return placement.shortfall(placement.demand(job, storage_units), alive)


def check_placement(job: Job, storage_units: int) -> None:
    """Fail in seconds, saying what to change, when verl's requests cannot be placed on this Ray
    cluster (trainer_entry.placement): verl would otherwise wait on its placement group forever. On a
    RayJob's cluster, workers that have not (re)joined yet are waited for, up to the placement bound
    (placement.await_fit); a local Ray is whole from its start."""
    import ray

    from trainer_entry import placement

    def look() -> tuple[str | None, int]:
        nodes = ray.nodes()
        return placement_problem(job, storage_units, nodes), sum(1 for n in nodes if n.get("Alive"))

    problem = placement.await_fit(
        look,
        ray_nodes(job) if os.environ.get("RAY_ADDRESS") else 1,
        float(job.typed.run_policy.placement_timeout_seconds),
        waiting=lambda message: print(f"trainer_entry: {message}", flush=True),
    )
    if problem:
        ray.shutdown()
        raise TrainingError(problem)


def check_gpu_drivers() -> None:
    """Every GPU node's NVIDIA driver runs this image's CUDA (trainer_entry.gpu_driver), checked before
    verl's workers fail on it minutes in."""
    import ray
    import torch

    from trainer_entry import gpu_driver

    try:
        print(f"trainer_entry: {gpu_driver.check(ray.nodes(), torch.version.cuda)}", flush=True)
    except gpu_driver.DriverError as exc:
        raise TrainingError(str(exc)) from None


def check_custom_reward(job: Job, workdir: Path, path: Path | None = None) -> None:
    """Call a custom reward function once before training, as verl will call it, on the first training
    example with its ground truth as the answer: a function that cannot be imported or cannot score one
    plain answer fails the job here, in seconds, instead of after verl's start-up (minutes). A function
    that raises only on some generated answers stops the run during training (rewards.compute_score).
    `path`: the function's file (default: the one written into `workdir`)."""
    import pandas as pd

    from trainer_entry.rewards import RewardLoadError, load_function

    custom = job.custom_reward
    if custom is None:
        return
    where = f"spec.reward.custom ({custom.key} of ConfigMap {custom.config_map!r})"
    try:
        score = load_function(str(path or workdir / CUSTOM_REWARD_FILE), custom.function)
    except RewardLoadError as exc:
        raise TrainingError(f"{where}: {exc}") from exc
    row = pd.read_parquet(job.typed.data.train_files[0]).iloc[0]
    truth = row["reward_model"]["ground_truth"]
    dapo = job.typed.reward.overlong_penalty.enabled
    extra = verl_extra_info(row, job.typed.rollout.protocol, dapo_manager=dapo)
    try:
        result = score(
            data_source=row["data_source"], solution_str=str(truth), ground_truth=truth, extra_info=extra
        )
        if inspect.isawaitable(result):
            asyncio.run(_await(result))
    except Exception as exc:
        raise TrainingError(
            f"{where}: {custom.function}() raised {type(exc).__name__}: {exc} when scoring the first "
            "training example with its ground truth as the answer (called as verl calls it in training, "
            f"extra_info with keys {sorted(extra)}"
            + (
                ": verl's dapo reward manager, which spec.reward.overlongPenalty uses, hands on the row's "
                "own extra_info alone, without num_turns or the tool loop's records"
                if dapo
                else ""
            )
            + "); fix the function and apply the job again"
        ) from exc


PLAIN_ANSWER_TURNS = 2
"""verl's `num_turns` of a trajectory that answered without a tool call: the prompt and one generation
(`tool_agent_loop`: user_turns + assistant_turns + 1; agent_loop.TagAgentLoop: generations + tool turns
+ 1)."""


def verl_extra_info(row: Any, protocol: str, dapo_manager: bool = False) -> dict[str, Any]:
    """The `extra_info` verl 0.9.1 hands a reward function in training for a data row's trajectory that
    answered without a tool call: the row's own `extra_info`, updated with the agent loop's `extra_fields`
    (`tool_extra_fields`: `raw_prompt`, which verl's `_agent_loop_postprocess` adds, and what the job's
    loop records), then `num_turns` and `rollout_reward_scores` (verl's reward loop,
    `NaiveRewardManager.run_single`). verl's dapo manager (`dapo_manager`: spec.reward.overlongPenalty)
    hands on the row's own `extra_info` alone (`DAPORewardManager.run_single`)."""
    from trainer_entry.tools import TOOL_FAULTS, TOOL_OUTCOMES

    own = row.get("extra_info")
    info: dict[str, Any] = dict(own) if isinstance(own, dict) else {}
    if dapo_manager:
        return info
    prompt = row.get("prompt")
    info["raw_prompt"] = list(prompt) if prompt is not None else []
    info.update({TOOL_OUTCOMES: [], TOOL_FAULTS: []})
    if protocol == "hermes":  # verl's ToolAgentLoop (agent_loop.HermesAgentLoop)
        info.update(turn_scores=[], tool_rewards=[])
    else:  # agent_loop.TagAgentLoop
        info.update(tool_call_counts=0, min_global_steps=0, max_global_steps=0)
    info["num_turns"] = PLAIN_ANSWER_TURNS
    info["rollout_reward_scores"] = {}
    return info


async def _await(awaitable: Any) -> Any:
    return await awaitable


class TrainingError(RuntimeError):
    """The run started but could not go on; the message names the cause."""


def explain_ray_failure(exc: BaseException) -> str:
    """One message for a Ray failure: out of memory, a lost worker, or an error raised inside one."""
    import ray

    text = str(exc)
    if isinstance(exc, ray.exceptions.OutOfMemoryError) or "OutOfMemoryError" in text:
        return (
            "out of memory: Ray killed a worker to protect the node; give the Ray pods more memory "
            "(cluster.head/workers.resources) or shrink the batch, the sequence lengths or the model. "
            + first_line(exc)
        )
    if isinstance(exc, ray.exceptions.ActorDiedError) and "because its node has died" in text:
        return (
            "a Ray node was lost (its pod deleted, evicted or its machine gone); the job's next attempt"
            " resumes from its newest checkpoint (runPolicy.backoffLimit): " + first_line(exc)
        )
    if isinstance(exc, ray.exceptions.ActorDiedError | ray.exceptions.WorkerCrashedError):
        return "a Ray worker died (its log above says why; out of memory is the usual cause): " + first_line(
            exc
        )
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        from trainer_entry.runner import CheckpointWriteError

        if isinstance(cause, CheckpointWriteError):  # its message says what and what to do
            return str(cause)
        return f"training failed in a Ray worker: {type(cause).__name__}: {_last_line(cause)}"
    return f"{type(exc).__name__}: {first_line(exc)}"


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def use_cpu_platform() -> None:
    """Select verl's cpu platform in this process (and its children) before verl picks one."""
    os.environ[cpu_platform.PLATFORM_ENV] = cpu_platform.PLATFORM
    if "verl" in sys.modules:  # imported before the choice: let the plugin adapt it now
        from trainer_entry import verl_plugin

        verl_plugin.register()
