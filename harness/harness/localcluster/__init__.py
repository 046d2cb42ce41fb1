"""A real Kubernetes control plane on 127.0.0.1, built from Go modules, for e2e tests and the demo."""

from .build import BuildError, Toolchain, ensure_built
from .cluster import ClusterError, LocalCluster, free_port

__all__ = ["BuildError", "ClusterError", "LocalCluster", "Toolchain", "ensure_built", "free_port"]
