"""The operator knows the tool types by the capabilities the pool's registry declares (its copy,
toolrl_api.tool_types), not by lists of names: a type that runs code gets its share of the pool's
/tmp, a type that needs egress gets it opened to the address its entry names."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from toolrl_api.spec_types import Tool
from toolrl_api.tool_types import TOOL_TYPES
from toolrl_operator.job import Job
from toolrl_operator.settings import Settings
from toolrl_operator.toolpool import EGRESS_ADDRESS, TMP_HEADROOM_MIB, build_network_policy, tmp_size_mib

SETTINGS = Settings(trainer_image="trainer:test", tool_sandbox_image="sandbox:test")
TOOLS = [
    {"name": "python", "type": "python", "diskLimitMiB": 64},
    {"name": "find", "type": "search", "corpus": "/data/c.jsonl", "diskLimitMiB": 512},
    {"name": "api", "type": "http", "url": "https://10.1.2.3/x"},
]


def _declare(monkeypatch: pytest.MonkeyPatch, kind: str, **capabilities: bool) -> None:
    monkeypatch.setitem(TOOL_TYPES, kind, dataclasses.replace(TOOL_TYPES[kind], **capabilities))


def test_the_pools_tmp_holds_the_disk_of_the_types_that_run_code(
    make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(tools=TOOLS)
    slots = job.spec.tool_pool.capacity_per_replica + job.spec.tool_pool.max_sessions_per_replica
    assert tmp_size_mib(job.spec) == 64 * slots + TMP_HEADROOM_MIB  # search runs no code
    _declare(monkeypatch, "search", runs_code=True)
    assert tmp_size_mib(job.spec) == 512 * slots + TMP_HEADROOM_MIB


def test_egress_opens_for_the_types_that_need_it(
    make_job: Callable[..., Job], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job(tools=TOOLS)
    pinned = {"ports": [{"protocol": "TCP", "port": 443}], "to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]}
    assert pinned in build_network_policy(job, SETTINGS)["spec"]["egress"]
    _declare(monkeypatch, "http", needs_egress=False)
    assert "egress" not in build_network_policy(job, SETTINGS)["spec"]  # all egress denied
    _declare(monkeypatch, "search", needs_egress=True)  # a type whose address field the operator lacks
    with pytest.raises(ValueError, match=r"tool type 'search' needs egress.*toolpool\.EGRESS_ADDRESS"):
        build_network_policy(job, SETTINGS)


def test_each_type_that_needs_egress_names_a_field_of_the_entry() -> None:
    for kind in (name for name, declared in TOOL_TYPES.items() if declared.needs_egress):
        assert EGRESS_ADDRESS[kind] in Tool.model_fields, kind
