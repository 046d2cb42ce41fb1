"""`python -m harness.localcluster {build,up,down,status,images}`: the commands behind `make cluster-up/down`
and `make images`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness import REPO

from .build import BuildError, ensure_built, ensure_kube_router_built, ensure_node_built
from .cluster import ClusterError, LocalCluster
from .images import ALL_IMAGES, ImageError, ensure_image
from .node import NodeError, RealNode, claim_owner

# imported by `up` (the trainer's ~6 GB only by `make images`: it is built on demand)
NODE_IMAGES = ["tool-sandbox", "operator"]

DEFAULT_ROOT = REPO / ".local-cluster"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.localcluster", description=__doc__)
    parser.add_argument("command", choices=["build", "up", "down", "status", "images"])
    parser.add_argument("names", nargs="*", help="images: which (default: all of images/)")
    parser.add_argument(
        "--root",
        type=Path,
        default=DEFAULT_ROOT,
        help="where the cluster keeps its state, logs and kubeconfig",
    )
    parser.add_argument(
        "--no-real-node",
        dest="real_node",
        action="store_false",
        help="`up` without the real CPU node (kwok's fake CPU nodes instead; no root needed)",
    )
    parser.add_argument(
        "--network-policy",
        action="store_true",
        help="`up` with the real node's NetworkPolicy enforcer (kube-router's firewall; test-only)",
    )
    parser.add_argument(
        "--real-nodes",
        type=int,
        default=1,
        help="`up` with this many real nodes (node 0 in the host's network namespace, each other in one of "
        "its own; at most 3)",
    )
    args = parser.parse_args(argv)
    if args.network_policy and not args.real_node:
        parser.error("--network-policy needs the real node (kwok's fake pods send no packets)")
    try:
        if args.command == "build":
            ensure_built()
            if args.real_node:
                ensure_node_built()
                ensure_kube_router_built()
            return 0
        if args.command == "images":
            for name in args.names or ALL_IMAGES:
                image = ensure_image(name)
                print(f"{image.ref}: {image.archive} ({image.archive.stat().st_size >> 20} MiB)")
                running = LocalCluster.recorded(args.root)
                if running and running.real_node and running.is_running():
                    running.import_image(image.archive, image.ref)
                    print(f"  imported into the real nodes of {args.root}")
            return 0
        recorded = LocalCluster.recorded(args.root)
        running = recorded if recorded and recorded.is_running() else None
        if args.command == "up":
            kind = (args.real_node, args.network_policy, args.real_nodes if args.real_node else 0)
            if running and (running.real_node, running.network_policy, len(running.nodes)) != kind:
                have = (
                    f"with {len(running.nodes)} real node(s)" if running.real_node else "without a real node"
                )
                enforcer = " and NetworkPolicy enforcer" if running.network_policy else ""
                print(
                    f"localcluster: a cluster {have}{enforcer} is up at {args.root}; "
                    "`make cluster-down` first to start the other kind",
                    file=sys.stderr,
                )
                return 1
            if running:
                print(f"localcluster: already up; reusing it (KUBECONFIG={running.kubeconfig})")
                return 0
            if recorded:
                recorded.down()
            cluster = LocalCluster(
                args.root,
                real_node=args.real_node,
                network_policy=args.network_policy,
                real_nodes=args.real_nodes,
            )
            cluster.up()
            for name in NODE_IMAGES if args.real_node else []:  # what the operator's pods run, at once
                image = ensure_image(name)
                cluster.import_image(image.archive, image.ref)
                print(f"localcluster: {image.ref} imported into {', '.join(n.name for n in cluster.nodes)}")
        elif args.command == "down":
            if recorded is None:
                if os.geteuid() == 0 and claim_owner() is None:  # no node of any cluster runs here
                    RealNode.remove_leftover_rules()
                print("localcluster: no cluster recorded; nothing to stop")
                return 0
            recorded.down()
            print("localcluster: stopped")
        else:
            print(f"localcluster: {'up, KUBECONFIG=' + str(running.kubeconfig) if running else 'down'}")
            return 0 if running else 1
    except (BuildError, ClusterError, NodeError, ImageError) as exc:
        print(f"localcluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
