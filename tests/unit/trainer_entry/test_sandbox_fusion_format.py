"""A python tool with `observationFormat: sandbox-fusion` end to end (issue 38, item 4): the job's tools.yaml
as the operator writes it, served by a real tool pool, and the trainer's PoolTool loaded from the translated
tool config, called as verl's tool agent calls it (hermes) and as the tag protocols do. Fenced code runs, a
failure shows what was printed and then the traceback, a timeout reads `no stdout here`; the job's other
python tool keeps the default format."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
import yaml
from harness.sandbox_process import SandboxProcess
from harness.tiers import process_tier
from toolrl_operator.configmap import tools_yaml
from trainer_entry.observations import SANDBOX_FUSION_UNFINISHED
from trainer_entry.spec import Job, parse_job
from trainer_entry.tools import PoolTool
from trainer_entry.translate import tool_config
from verl.tools.schemas import OpenAIFunctionToolSchema

TOOLS = [
    {
        "name": "code_interpreter",
        "type": "python",
        "timeoutSeconds": 1,
        "observationFormat": "sandbox-fusion",
    },
    {"name": "python", "type": "python", "timeoutSeconds": 1},
]
FENCED_FAILURE = "I will check it.\n```python\nprint('partial')\n1/0\n```"


def the_job() -> Job:
    return parse_job(
        {
            "metadata": {"name": "retool", "namespace": "test"},
            "spec": {
                "model": {"path": "/models/tiny"},
                "data": {"trainFiles": ["/data/train.parquet"]},
                "algorithm": {"rolloutsPerPrompt": 2, "trainBatchSize": 2, "totalEpochs": 1},
                "tools": TOOLS,
                "reward": {"preset": "exact-match"},
                "cluster": {"workers": {"replicas": 1, "gpusPerWorker": 0}},
            },
        }
    )


@pytest.fixture(scope="module")
@process_tier
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PoolTool]]:
    """The job's tools as the trainer loads them, against a pool serving the job's tools.yaml."""
    job = the_job()
    root = tmp_path_factory.mktemp("sandbox-fusion-pool")
    config = root / "tools.yaml"
    config.write_text(tools_yaml(job.spec))  # the operator's ConfigMap key, observationFormat included
    assert [t.get("observationFormat") for t in yaml.safe_load(config.read_text())["tools"]] == [
        "sandbox-fusion",
        None,
    ]
    try:
        with SandboxProcess.start(root, config=config) as pool:
            entries = tool_config(job, pool.url)["tools"]
            yield {
                entry["tool_schema"]["function"]["name"]: PoolTool(
                    entry["config"], OpenAIFunctionToolSchema.model_validate(entry["tool_schema"])
                )
                for entry in entries
            }
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def hermes(tool: PoolTool, code: str) -> str:
    """What verl's tool agent puts in the conversation: the ToolResponse's text."""
    instance, _ = await tool.create()
    response, _, _ = await tool.execute(instance, {"code": code})
    await tool.release(instance)
    return str(response.text)


async def test_fenced_code_runs_and_a_failure_shows_stdout_then_stderr(tools: dict[str, PoolTool]) -> None:
    interpreter = tools["code_interpreter"]
    assert interpreter.observation_format == "sandbox-fusion"
    assert await hermes(interpreter, "Let me compute.\n```python\nprint(6 * 7)\n```") == "42\n"
    failed = await hermes(interpreter, FENCED_FAILURE)
    assert failed.startswith("partial\nTraceback (most recent call last):\n"), failed
    assert failed.endswith("ZeroDivisionError: division by zero\n"), failed
    # the tag protocols read the same text from the call's result
    result = await interpreter.run({"code": FENCED_FAILURE})
    assert (result.status, result.fault, result.exit_code) == ("error", "code", 1)
    assert result.observation() == result.stdout + result.stderr  # (the traceback names its own directory)
    assert result.stdout == "partial\n" and result.stderr.splitlines()[-1] == failed.splitlines()[-1]


async def test_a_timeout_reads_no_stdout_here(tools: dict[str, PoolTool]) -> None:
    result = await tools["code_interpreter"].run(
        {"code": "```python\nprint('started')\nwhile True: pass\n```"}
    )
    assert result.status == "timeout" and result.observation() == SANDBOX_FUSION_UNFINISHED


async def test_the_default_format_is_unchanged(tools: dict[str, PoolTool]) -> None:
    python = tools["python"]
    assert python.observation_format == "default"
    failed = await hermes(python, "print('partial')\n1/0")
    assert failed.startswith("Error: Traceback (most recent call last):\n") and "partial" not in failed
    # fenced code is not unwrapped: it runs as it is, a syntax error
    fenced = await hermes(python, "```python\nprint(1)\n```")
    assert fenced.startswith("Error: ") and "SyntaxError" in fenced, fenced
