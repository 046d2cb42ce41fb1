"""`python -m trainer_entry run --spec job.json [--dry-run]`."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from trainer_entry.run import Environment, describe, run
from trainer_entry.spec import SpecError, load_job
from trainer_entry.translate import translate

DRY_RUN_POOL_URL = "http://<tool-pool>:8080"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_entry")
    sub = parser.add_subparsers(dest="command", required=True)
    run_cmd = sub.add_parser("run", help="run the verl training a ToolRLJob describes")
    run_cmd.add_argument("--spec", default=os.environ.get("TOOLRL_JOB_SPEC", "/etc/toolrl/job.json"))
    run_cmd.add_argument(
        "--dry-run", action="store_true", help="print the verl call and generated files, then exit"
    )
    run_cmd.add_argument("--workdir", type=Path, default=None, help="where to write the generated files")
    args = parser.parse_args(argv)
    try:
        job = load_job(args.spec)
        if args.dry_run:
            from trainer_entry import verl_config

            pool_url = os.environ.get("TOOLRL_TOOL_POOL_URL", DRY_RUN_POOL_URL)
            translation = translate(job, pool_url)
            verl_config.check(verl_config.compose(translation.overrides))
            print(describe(job, translation, args.spec))
            return 0
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"toolrl-{job.name}-"))
        run(job, Environment.from_env(job), workdir)
    except (SpecError, TimeoutError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
