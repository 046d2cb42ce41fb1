"""The test and demo harness: the local control plane (`harness.localcluster`, also
`python -m harness.localcluster`), the operator and the tool sandbox as host processes
(`operator_process`, `sandbox_process`) and the training cluster the e2e tests and the demo
share (`training_cluster`). Installed editable: it reads the repository it lives in."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The repository's root (crds/, examples/, images/, charts/)."""
