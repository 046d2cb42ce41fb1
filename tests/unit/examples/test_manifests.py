"""The example manifests train as written (issue 23): every ToolRLJob passes the trainer's checks, and
examples/toolrljob.yaml reads what examples/data-prep-job.yaml writes, prompted for its protocol."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from trainer_entry.data import check_protocol
from trainer_entry.data import main as prepare_data
from trainer_entry.spec import parse_job

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


JOBS = [
    (p.name, d) for p in sorted(EXAMPLES.glob("*.yaml")) for d in documents(p) if d["kind"] == "ToolRLJob"
]


@pytest.mark.parametrize("job", [d for _, d in JOBS], ids=[name for name, _ in JOBS])
def test_every_example_job_passes_the_trainers_checks(job):
    parse_job(job)


def test_the_gpu_example_reads_what_the_data_prep_job_writes(tmp_path):
    job = documents(EXAMPLES / "toolrljob.yaml")[0]["spec"]
    prep = documents(EXAMPLES / "data-prep-job.yaml")
    claims = {d["metadata"]["name"] for d in prep if d["kind"] == "PersistentVolumeClaim"}
    assert job["data"]["volume"]["persistentVolumeClaim"]["claimName"] in claims
    assert job["checkpoint"]["volume"]["persistentVolumeClaim"]["claimName"] in claims
    assert job["model"]["cache"]["volume"]["persistentVolumeClaim"]["claimName"] in claims
    (batch,) = [d for d in prep if d["kind"] == "Job"]
    pod = batch["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    argv = container["command"][3:] + container["args"]  # after `python -m trainer_entry.data`
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert (
        volumes[mounts["/data"]]["persistentVolumeClaim"]["claimName"]
        == (job["data"]["volume"]["persistentVolumeClaim"]["claimName"])
    )
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["fsGroup"] == 1000
    # run the Job's command here: /data and /input moved under tmp_path, the shipped sample as input
    local = [a.replace("/input/sample.jsonl", str(EXAMPLES / "gsm8k" / "sample.jsonl")) for a in argv]
    local = [a.replace("/data/", f"{tmp_path}/data/") for a in local]
    assert prepare_data(local) == 0
    files = [
        f.replace("/data/", f"{tmp_path}/data/") for f in job["data"]["trainFiles"] + job["data"]["valFiles"]
    ]
    assert all(Path(f).is_file() for f in files), files
    assert check_protocol(files, job["rollout"]["protocol"]) == []
    import pyarrow.parquet as pq

    rows = pq.read_metadata(files[0]).num_rows
    assert job["algorithm"]["trainBatchSize"] <= rows, f"{rows} training rows do not fill one batch"
