"""`python -m trainer_entry run --spec job.json [--dry-run [--compare verl-command]]`."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from trainer_entry.dry_run import dry_run
from trainer_entry.dry_run import load as load_dry_run
from trainer_entry.placement import PlacementError, check_cluster
from trainer_entry.run import Environment, TrainingError, run, use_cpu_platform
from trainer_entry.spec import SpecError, cpu_only, load_job
from trainer_entry.translate import translate

# What a command's error exits with: 2 the input is wrong (the spec, a bound it set), 1 the run or the
# cluster failed (what the RayJob's retries are for)
INPUT_ERRORS = (SpecError, TimeoutError)
RUN_ERRORS = (TrainingError, PlacementError)


def exit_code(command: Callable[[], int]) -> int:
    """Run a command; its errors as one line on stderr and their exit code."""
    try:
        return command()
    except INPUT_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RUN_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_entry")
    sub = parser.add_subparsers(dest="command", required=True)
    run_cmd = sub.add_parser("run", help="run the verl training a ToolRLJob describes")
    run_cmd.add_argument("--spec", default=os.environ.get("TOOLRL_JOB_SPEC", "/etc/toolrl/job.json"))
    run_cmd.add_argument(
        "--dry-run",
        action="store_true",
        help="check the job (--spec: its manifest as applied, YAML or JSON, or its spec; - for stdin) as far "
        "as it can without a cluster and print the composed verl config and generated files, then exit",
    )
    run_cmd.add_argument(
        "--compare",
        default=None,
        help="with --dry-run: a verl command line or overrides file; print the key-by-key difference",
    )
    run_cmd.add_argument(
        "--reward-file", type=Path, default=None, help="with --dry-run: the custom reward's file, to call it"
    )
    run_cmd.add_argument(
        "--overrides", action="store_true", help="with --dry-run: the overrides, not the composed config"
    )
    run_cmd.add_argument("--workdir", type=Path, default=None, help="where to write the generated files")
    tiny = sub.add_parser("tiny-model", help="write a tiny local Qwen2 model for CPU runs (no hub)")
    tiny.add_argument("dir", type=Path, help="the model directory to write (use it as spec.model.path)")
    tiny.add_argument(
        "--spec",
        default=None,
        help="the job (its manifest as applied, YAML or JSON, or a job.json): warm up on its own prompts "
        "(its first training file), protocol and tools instead of the toy task's, and measure the model as "
        "the job's training samples it",
    )
    tiny.add_argument(
        "--protocol", default=None, help="tool-call protocol of the warm-up without --spec (python-tags)"
    )
    tiny.add_argument("--warm-up-seconds", type=float, default=300.0, help="upper bound of the warm-up")
    tiny.add_argument("--no-warm-up", action="store_true", help="leave the weights random")
    tiny.add_argument(
        "--toy-data", type=Path, default=None, help="also write the toy task's train.parquet here"
    )
    check = sub.add_parser(
        "placement-check",
        help="check that verl can place the job on a Ray cluster (fails in seconds, saying what to change)",
    )
    check.add_argument(
        "--spec",
        default=os.environ.get("TOOLRL_JOB_SPEC", "/etc/toolrl/job.json"),
        help="the job: its manifest as applied (YAML or JSON) or its spec",
    )
    check.add_argument("--ray-address", default=None, help="the Ray cluster (default: $RAY_ADDRESS)")
    args = parser.parse_args(argv)
    if args.command == "tiny-model":
        return tiny_model(args)
    if args.command == "placement-check":
        return exit_code(lambda: placement_check(args))
    return exit_code(lambda: run_command(args))


def placement_check(args: argparse.Namespace) -> int:
    """`placement-check --spec job.yaml --ray-address HOST:6379`: whether verl can place the job (the
    manifest as applied, YAML or JSON, or its spec, as the dry run reads it) on the Ray cluster, said in
    seconds; SpecError or PlacementError otherwise."""
    job = load_dry_run(args.spec)
    print(check_cluster(job, translate(job, "http://<tool-pool>:8080").overrides, args.ray_address))
    return 0


def run_command(args: argparse.Namespace) -> int:
    """`run`: the dry run, or the training itself."""
    job = load_dry_run(args.spec) if args.dry_run else load_job(args.spec)
    if cpu_only(job.spec):
        use_cpu_platform()
    if args.dry_run:
        return dry_run(
            job,
            args.spec,
            compare=args.compare,
            reward_file=args.reward_file,
            overrides_only=args.overrides,
        )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"toolrl-{job.name}-"))
    run(job, Environment.from_env(job), workdir)
    return 0


def tiny_model(args: argparse.Namespace) -> int:
    from trainer_entry import tiny_model as tm

    try:
        job = load_dry_run(args.spec) if args.spec else None
        protocol = job.typed.rollout.protocol if job else (args.protocol or "python-tags")
        if job and args.protocol and args.protocol != protocol:
            raise ValueError(f"--protocol {args.protocol} is not the job's spec.rollout.protocol {protocol}")
        tools = job.spec["tools"] if job else [tm.TOY_TOOL]
        if args.toy_data is not None:
            tool = tm.episode_for(protocol, tools).tool["name"]
            tm.write_toy_data(args.toy_data, tool=tool, protocol=protocol)
            print(f"toy task data: {args.toy_data / 'train.parquet'} ({protocol})")
        prompts = tm.job_prompts(Path(job.typed.data.train_files[0])) if job else None
        extra = tm.prompt_texts(prompts, tools) if prompts else None
        path = tm.build_tiny_model(args.dir.parent, args.dir.name, hidden=64, layers=2, extra_texts=extra)
        print(f"tiny model: {path}")
        if not args.no_warm_up:
            sampling = tm.Sampling.of_job(job) if job else None
            result = tm.warm_up(
                path,
                protocol,
                seconds=args.warm_up_seconds,
                prompts=prompts,
                tools=tools,
                min_copy_rate=0.0 if prompts else 0.5,  # a job's answers are beyond a tiny model
                sampling=sampling,
            )
            on = f"the job's prompts ({job.typed.data.train_files[0]})" if prompts else "the toy task"
            bound = "" if result.goal_met else ", stopped at its time bound"
            print(
                f"warm-up on {on}, protocol {protocol}: {result.steps} supervised steps in "
                f"{result.seconds:.0f}s (loss {result.loss:.3f}){bound}"
            )
            print(f"held-out prompts, {tm.describe_sampling(sampling)}: {tm.describe_behaviour(result)}")
            if result.prompts_cut:
                print(f"warning: {tm.cut_prompts_message(result.prompts_cut, sampling)}", file=sys.stderr)
    except (ValueError, SpecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
