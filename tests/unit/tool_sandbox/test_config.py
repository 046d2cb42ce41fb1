import pytest
import yaml
from tool_sandbox.config import _FIELDS, ConfigError
from tool_sandbox.crd_defaults import DEFAULTS_WHEN_PRESENT
from tool_sandbox.tools import parse_tools


def test_parses_the_crd_shape_with_defaults() -> None:
    tools = parse_tools("""
tools:
  - {name: python, type: python, timeoutSeconds: 10, memoryLimitMiB: 512, maxOutputBytes: 4096}
  - {name: search, type: search, corpus: /data/corpus.jsonl}
  - {name: toolbench, type: http, url: http://stabletoolbench:8000/virtual}
""")
    assert [t.name for t in tools] == ["python", "search", "toolbench"]
    assert tools[0].memory_limit_mib == 512 and tools[0].timeout_seconds == 10.0
    assert tools[1].top_k == 3 and tools[2].url.endswith("/virtual")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tools: [", "not valid YAML"),
        ("{}", 'list under "tools"'),
        ("tools: []", "tools is empty"),
        ("tools: [{type: python}]", "missing 'name'"),
        ("tools: [{name: p, type: ruby}]", "'ruby' is not one of"),
        ("tools: [{name: 9p, type: python}]", "not an identifier"),
        ("tools: [{name: p, type: python, timeoutSeconds: -1}]", "must be positive"),
        ("tools: [{name: p, type: python, memoryLimitMiB: 1.5}]", "whole number"),
        ("tools: [{name: p, type: python, colour: red}]", "unknown field(s) colour"),
        ("tools: [{name: s, type: search}]", "needs corpus"),
        ("tools: [{name: h, type: http, url: ftp://x}]", "needs url"),
        ("tools: [{name: p, type: python}, {name: p, type: python}]", "more than once"),
        ("tools: [{name: m, type: mcp}]", "an mcp tool needs mcp: {url:"),
        ("tools: [{name: m, type: mcp, mcp: {url: my-mcp:8000}}]", "'my-mcp:8000' is not an absolute"),
        ("tools: [{name: m, type: mcp, mcp: {url: 'http://m', tools: [a, a]}}]", "appears more than once"),
        ("tools: [{name: m, type: mcp, mcp: {url: 'http://m', tools: a}}]", "must be a list of"),
        ("tools: [{name: m, type: mcp, mcp: {url: 'http://m', token: x}}]", "mcp: unknown field(s) token"),
        ("tools: [{name: p, type: python, observationFormat: retool}]", "'retool' is not one of default,"),
        ("tools: [{name: p, type: python, observationFormat: 1}]", "observationFormat: expected a string"),
        (
            "tools: [{name: s, type: search, corpus: c.jsonl, observationFormat: default}]",
            "observationFormat: only tools of type python take it",
        ),
    ],
)
def test_rejects_bad_configs_with_a_message_naming_the_problem(text: str, message: str) -> None:
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        parse_tools(text)


def test_a_bare_entry_means_what_the_crd_defaults_it_to() -> None:
    """Every tools[] default is the CRD's (the module generated from it), none the pool's own: a
    hand-written tools.yaml entry parses as the entry the operator writes for a job."""
    from chartgen.crd_defaults import apply_defaults, spec_schema
    from chartgen.outputs import CRD_SOURCE

    item = spec_schema(yaml.safe_load(CRD_SOURCE.read_text()))["properties"]["tools"]["items"]
    defaulted = apply_defaults(item, {"name": "p", "type": "python"})
    assert set(defaulted) - {"name", "type"} == set(DEFAULTS_WHEN_PRESENT["tools[]"])
    assert set(DEFAULTS_WHEN_PRESENT["tools[]"]) <= set(_FIELDS)
    (bare,) = parse_tools("tools: [{name: p, type: python}]")
    (written,) = parse_tools(yaml.safe_dump({"tools": [defaulted]}))
    assert bare == written
    # no knob of the pool's own is left out of the CRD: each field of an entry has its default there
    # no default: absent unless given (a function tool's `source` is the operator's, not the CRD's)
    optional = {"description", "corpus", "url", "function", "parameters", "source", "mcp"}
    optional.add("observationFormat")  # a python tool's; unset is the default format
    assert set(_FIELDS) - {"name", "type"} - optional == set(DEFAULTS_WHEN_PRESENT["tools[]"])


def test_a_python_tool_takes_the_trainers_observation_format() -> None:
    """The job's tools.yaml carries it (spec.tools verbatim); the pool checks it, the trainer reads it."""
    from chartgen.crd_defaults import spec_schema
    from chartgen.outputs import CRD_SOURCE
    from tool_sandbox.config import OBSERVATION_FORMATS

    item = spec_schema(yaml.safe_load(CRD_SOURCE.read_text()))["properties"]["tools"]["items"]
    assert tuple(item["properties"]["observationFormat"]["enum"]) == OBSERVATION_FORMATS
    plain, fusion = parse_tools(
        "tools: [{name: p, type: python}, {name: q, type: python, observationFormat: sandbox-fusion}]"
    )
    assert (plain.observation_format, fusion.observation_format) == ("default", "sandbox-fusion")


FUNCTION = (
    "{name: add, type: function, source: /etc/toolrl/functions/add.py, function: {configMap: {name: t}}"
)


def test_a_function_tool_takes_its_function_name_schema_and_source() -> None:
    (tool,) = parse_tools(
        f"tools:\n  - {FUNCTION}, parameters: {{type: object, properties: {{a: {{type: integer}}}}}}}}"
    )
    assert (tool.type, tool.source, tool.parameters["properties"]) == (
        "function",
        "/etc/toolrl/functions/add.py",
        {"a": {"type": "integer"}},
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (f"{FUNCTION}}}", "parameters: must be a JSON schema of an object"),
        (f"{FUNCTION}, parameters: {{type: array}}}}", "parameters: must be a JSON schema of an object"),
        (f"{FUNCTION}, parameters: [1]}}", "tools[0].parameters: expected a mapping, got list"),
        (
            f"{FUNCTION}, parameters: {{type: object, properties: {{a: {{type: integr}}}}}}}}",
            "parameters: not a valid JSON schema: 'integr' is not valid",
        ),
        (
            "{name: add, type: function, parameters: {type: object}}",
            "a function tool needs source, the path of its Python file",
        ),
        (
            f"{FUNCTION[:-1]}, name: 'not a name'}}, parameters: {{type: object}}}}",
            "function.name: 'not a name' is not a Python identifier",
        ),
    ],
)
def test_rejects_bad_function_tools_saying_what_to_fix(entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"tools\.yaml: tools\[0\]") as raised:
        parse_tools(f"tools:\n  - {entry}")
    assert message in str(raised.value)
