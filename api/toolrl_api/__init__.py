"""The ToolRLJob API, shared by the operator, the trainer and the tool pool (api/pyproject.toml)."""

GROUP = "toolrl.dev"
VERSION = "v1alpha1"
KIND = "ToolRLJob"
PLURAL = "toolrljobs"
API_VERSION = f"{GROUP}/{VERSION}"
