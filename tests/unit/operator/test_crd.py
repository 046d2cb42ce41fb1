"""The CRD file itself: names, printer columns, defaults, and that every rule explains itself."""

from __future__ import annotations

from typing import Any

from toolrl_operator import naming


def _walk(schema: dict[str, Any], path: str = ""):
    yield path, schema
    for key, prop in schema.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{key}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_names_match_the_api_contract(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == f"{naming.PLURAL}.{naming.GROUP}"
    assert spec["group"] == naming.GROUP
    assert spec["names"]["kind"] == naming.KIND
    assert spec["names"]["shortNames"] == ["trj"]
    assert "categories" not in spec["names"]
    assert [v["name"] for v in spec["versions"]] == [naming.VERSION]


def test_status_subresource_and_printer_columns(crd: dict[str, Any]) -> None:
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Step": ".status.progress.step",
        "Reward": ".status.progress.rewardMean",
        "Restarts": ".status.restarts",
        "Tools": ".status.toolPool.summary",
        "Age": ".metadata.creationTimestamp",
    }


def test_every_rule_has_a_message_that_names_what_to_change(schema: dict[str, Any]) -> None:
    rules = [(path, r) for path, node in _walk(schema) for r in node.get("x-kubernetes-validations", [])]
    assert len(rules) >= 12
    for path, rule in rules:
        assert len(rule.get("message", "")) > 20, f"rule at {path or '<root>'} lacks a helpful message"


def test_immutable_fields_use_transition_rules(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]
    model_rules = [r["rule"] for r in spec["properties"]["model"]["x-kubernetes-validations"]]
    spec_rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert "self.path == oldSelf.path" in model_rules
    assert "self.cluster.workers.gpusPerWorker == oldSelf.cluster.workers.gpusPerWorker" in spec_rules


def test_defaulted_objects_carry_no_rules(schema: dict[str, Any]) -> None:
    """The apiserver checks a `default: {}` against its object's rules without nested defaults,
    so cross-field rules of defaulted objects must live on `spec`."""
    for path, node in _walk(schema["properties"]["spec"], ".spec"):
        if "default" in node and node.get("type") == "object":
            assert "x-kubernetes-validations" not in node, path


def test_objects_with_defaulted_children_default_to_empty(schema: dict[str, Any]) -> None:
    """A nested default only applies if its parent exists, so such parents default to {} (objects
    the user must write anyway, those with required fields, are exempt)."""
    for path, node in _walk(schema["properties"]["spec"], ".spec"):
        children = node.get("properties", {}).values()
        if node.get("type") == "object" and any("default" in c for c in children):
            assert "required" in node or node.get("default") == {}, f"{path} needs default: {{}}"


def test_status_enums_match_the_operator(schema: dict[str, Any]) -> None:
    from toolrl_operator import status

    phases = schema["properties"]["status"]["properties"]["phase"]["enum"]
    assert set(phases) == {rule.phase for rule in status.RAYJOB_PHASES} | {status.PENDING}
    assert set(phases) == {"Pending", "Provisioning", "Running", "Succeeded", "Failed", "Suspended"}


def test_example_is_defaulted_like_the_apiserver_does(make_job_object) -> None:
    job = make_job_object()
    spec = job["spec"]
    assert spec["suspend"] is False
    assert spec["toolPool"]["scaleDownDelaySeconds"] == 120
    assert spec["rollout"]["toolCall"] == {
        "timeoutSeconds": 30,
        "maxRetries": 3,
        "retryDelaySeconds": 1.0,
        "maxConcurrency": 256,
        "maxInfraFailureRatio": 0.2,
    }
    assert spec["runPolicy"]["activeDeadlineSeconds"] == 0
    assert spec["tools"][0]["maxOutputBytes"] == 4096


def test_pool_min_is_at_least_one_and_volumes_reject_host_paths(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    assert spec["toolPool"]["properties"]["replicas"]["properties"]["min"]["minimum"] == 1
    for volume in (spec["data"]["properties"]["volume"], spec["checkpoint"]["properties"]["volume"]):
        assert "hostPath" in volume["properties"], "CEL sees only declared fields"
        [rule] = volume["x-kubernetes-validations"]
        assert rule["rule"] == "!has(self.hostPath)"
        assert "persistentVolumeClaim" in rule["message"]


CEL_KEYWORDS = ("as", "break", "const", "continue", "else", "for", "function", "if", "import", "let", "loop")
CEL_KEYWORDS += ("package", "namespace", "return", "var", "void", "while", "in", "true", "false", "null")


def test_rules_escape_fields_named_like_cel_keywords(schema: dict[str, Any]) -> None:
    """A field named like a CEL keyword (a function tool's `function`) is `self.__function__` in a
    rule; `self.function` does not compile and the apiserver refuses the whole CRD."""
    import re

    for path, node in _walk(schema):
        for rule in node.get("x-kubernetes-validations", []):
            for keyword in CEL_KEYWORDS:
                assert not re.search(rf"\.{keyword}\b", rule["rule"]), f"{path}: {rule['rule']}"


def test_function_tools_are_checked_at_apply_time(schema: dict[str, Any]) -> None:
    tool = schema["properties"]["spec"]["properties"]["tools"]["items"]
    rules = [r["rule"] for r in tool["x-kubernetes-validations"]]
    assert "self.type != 'function' || has(self.__function__)" in rules
    assert "self.type != 'function' || has(self.parameters)" in rules
    parameters = tool["properties"]["parameters"]
    assert parameters["required"] == ["type", "properties"]
    assert parameters["properties"]["type"]["enum"] == ["object"]
    assert parameters["properties"]["properties"]["additionalProperties"]["required"] == ["type"]


def test_mcp_tools_are_checked_at_apply_time(schema: dict[str, Any]) -> None:
    tool = schema["properties"]["spec"]["properties"]["tools"]["items"]
    assert "mcp" in tool["properties"]["type"]["enum"]
    rules = {r["rule"]: r["message"] for r in tool["x-kubernetes-validations"]}
    assert "needs mcp.url" in rules["self.type != 'mcp' || has(self.mcp)"]
    assert "only used by tools of type mcp" in rules["!has(self.mcp) || self.type == 'mcp'"]
    server = tool["properties"]["mcp"]
    assert server["required"] == ["url"]
    [url_rule] = server["properties"]["url"]["x-kubernetes-validations"]
    assert "isURL(self)" in url_rule["rule"] and "startsWith('http://')" in url_rule["rule"]
    names = server["properties"]["tools"]
    assert names["x-kubernetes-list-type"] == "set", "a remote tool named twice is refused"
    assert names["items"]["x-kubernetes-validations"][0]["rule"] == "self.matches('^[A-Za-z0-9_.-]+$')"
    assert server["properties"]["targetPort"]["maximum"] == 65535


def test_the_observation_format_is_a_python_tools_and_has_no_default(schema: dict[str, Any]) -> None:
    """Unset is the default format; a CRD default would put it on every tool and fail the rule."""
    tool = schema["properties"]["spec"]["properties"]["tools"]["items"]
    field = tool["properties"]["observationFormat"]
    assert field["enum"] == ["default", "sandbox-fusion"] and "default" not in field
    assert "no stdout here" in field["description"] and "Error: " in field["description"]
    rules = {r["rule"]: r for r in tool["x-kubernetes-validations"]}
    rule = rules["!has(self.observationFormat) || self.type == 'python'"]
    assert rule["fieldPath"] == ".observationFormat"
    assert "only used by tools of type python" in rule["message"]


def test_the_status_schema_declares_every_field_the_operator_writes(
    schema: dict[str, Any], separate_async_cpu_job
) -> None:
    """The API server prunes undeclared status fields: every field of a computed status (worker
    groups included) must be in the CRD's status schema."""
    from toolrl_operator.handlers import rayjob_view
    from toolrl_operator.rayjob import build_rayjob
    from toolrl_operator.settings import Settings
    from toolrl_operator.status import compute_status

    job = separate_async_cpu_job
    running = {
        "jobDeploymentStatus": "Running",
        "jobStatus": "RUNNING",
        "rayClusterName": "c",
        "startTime": "x",
    }
    rayjob = rayjob_view({**build_rayjob(job, Settings(trainer_image="t:1")), "status": running})
    status = compute_status(job, rayjob, None, 3, "2026-01-01T00:00:00Z", ready_workers={"gpu-workers": 1})
    assert len(status["workerGroups"]) == 2

    def undeclared(value: Any, node: dict[str, Any], path: str) -> list[str]:
        if isinstance(value, dict):
            props = node.get("properties", {})
            return [
                missing
                for key, item in value.items()
                for missing in (
                    undeclared(item, props[key], f"{path}.{key}") if key in props else [f"{path}.{key}"]
                )
            ]
        if isinstance(value, list):
            return [
                m for i, item in enumerate(value) for m in undeclared(item, node["items"], f"{path}[{i}]")
            ]
        return []

    assert undeclared(status, schema["properties"]["status"], ".status") == []
