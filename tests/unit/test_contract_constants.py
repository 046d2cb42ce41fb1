"""The contract constants the three distributions share (separate images: they cannot import one
another) are written once in each; this is where they are checked against each other
(docs/contracts.md describes them)."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import yaml
from tool_sandbox.config import ServerSettings
from tool_sandbox.tools import TOOL_TYPES
from toolrl_api import spec_types, tool_types
from toolrl_operator import naming

from trainer_entry import run, spec, translate

REPO = Path(__file__).resolve().parents[2]


def test_paths_the_operator_mounts_are_where_the_trainer_looks() -> None:
    assert naming.CHECKPOINT_MOUNT == translate.CHECKPOINT_ROOT
    assert Path(naming.CONFIG_MOUNT) / naming.REWARD_DIR == run.CUSTOM_REWARD_DIR


def test_ports_the_operator_opens_are_the_ones_served() -> None:
    assert naming.TRAINER_METRICS_PORT == run.DEFAULT_METRICS_PORT
    assert ServerSettings().port == naming.TOOL_POOL_PORT
    assert ServerSettings().metrics_port == naming.TOOL_POOL_METRICS_PORT


def test_tool_types_agree_across_the_pool_the_api_and_the_crd() -> None:
    """The pool's registry is the home of the tool types; the API package holds its generated copy
    (tests/unit/test_tool_types.py: the copy is the registry's), and the CRD's enum names them (the API's
    typed spec and the trainer's spec.TOOL_TYPES are generated from, or read, the CRD)."""
    crd = yaml.safe_load((REPO / "crds" / "toolrl.dev_toolrljobs.yaml").read_text())
    spec_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec_schema["properties"]["tools"]["items"]["properties"]["type"]["enum"]) == set(TOOL_TYPES)
    assert set(spec.TOOL_TYPES) == set(TOOL_TYPES) == set(tool_types.TOOL_TYPES)
    assert set(get_args(spec_types.Tool.model_fields["type"].annotation)) == set(TOOL_TYPES)


def test_the_pool_reads_a_function_tool_as_the_operator_writes_it() -> None:
    """The operator adds `source` (where it mounts the ConfigMap's key) to a function tool's entry
    of tools.yaml; the pool takes the entry as it is and finds its source there."""
    from tool_sandbox.tools import parse_tools
    from toolrl_operator.configmap import tools_yaml

    tool = {
        "name": "lookup",
        "type": "function",
        "description": "Find a word",
        "function": {"configMap": {"name": "my-tools", "key": "tools.py"}, "name": "find"},
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        "timeoutSeconds": 5,
    }
    (parsed,) = parse_tools(tools_yaml({"tools": [tool]}))
    assert parsed.source == f"{naming.CONFIG_MOUNT}/{naming.FUNCTIONS_DIR}/lookup.py"
    assert (parsed.type, parsed.parameters, parsed.function["name"]) == (
        "function",
        tool["parameters"],
        "find",
    )
    assert translate.tool_schema(tool)["function"]["parameters"] == tool["parameters"]
