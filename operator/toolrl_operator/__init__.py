"""Kubernetes operator that turns a ToolRLJob into a KubeRay RayJob plus a sandboxed tool pool."""
