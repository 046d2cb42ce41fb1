"""`python -m localcluster {build,up,down,status}`: the commands behind `make cluster-up/down`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .build import BuildError, ensure_built
from .cluster import ClusterError, LocalCluster

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_ROOT = REPO_ROOT / ".local-cluster"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    parser.add_argument("command", choices=["build", "up", "down", "status"])
    parser.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        help="where the cluster keeps its state, logs and kubeconfig",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            ensure_built()
            return 0
        recorded = LocalCluster.recorded(args.root)
        running = recorded if recorded and recorded.is_running() else None
        if args.command == "up":
            if running:
                print(f"localcluster: already up; reusing it (KUBECONFIG={running.kubeconfig})")
                return 0
            if recorded:
                recorded.down()
            LocalCluster(args.root).up()
        elif args.command == "down":
            if recorded is None:
                print("localcluster: no cluster recorded; nothing to stop")
                return 0
            recorded.down()
            print("localcluster: stopped")
        else:
            print(f"localcluster: {'up, KUBECONFIG=' + str(running.kubeconfig) if running else 'down'}")
            return 0 if running else 1
    except (BuildError, ClusterError) as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
