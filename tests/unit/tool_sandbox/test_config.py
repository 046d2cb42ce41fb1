import pytest
import yaml
from tool_sandbox.config import _FIELDS, ConfigError
from tool_sandbox.tools import parse_tools
from toolrl_api.crd_defaults import DEFAULTS_WHEN_PRESENT


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
        ("tools: [3]", "tools[0]: must be an object, got 3"),
        ("tools: [{type: python}]", "tools[0].name: is required"),
        ("tools: [{name: p, type: ruby}]", "tools[0].type: unknown value 'ruby'; use one of python,"),
        ("tools: [{name: 9p, type: python}]", "tools[0].name: a tool name must be an identifier"),
        ("tools: [{name: p, type: python, timeoutSeconds: -1}]", "tools[0].timeoutSeconds: must be > 0"),
        ("tools: [{name: p, type: python, memoryLimitMiB: 1.5}]", "memoryLimitMiB: must be an integer"),
        # the CRD's bound, no longer the pool's looser `> 0`
        ("tools: [{name: p, type: python, memoryLimitMiB: 8}]", "memoryLimitMiB: must be >= 16, got 8"),
        ("tools: [{name: p, type: python, colour: red}]", "unknown field(s) colour"),
        ("tools: [{name: s, type: search}]", "a tool of type search needs corpus"),
        ("tools: [{name: h, type: http, url: ftp://x}]", "url must be an absolute http:// or https:// URL"),
        ("tools: [{name: p, type: python}, {name: p, type: python}]", "tool names must be unique"),
        ("tools: [{name: m, type: mcp}]", "a tool of type mcp needs mcp.url"),
        ("tools: [{name: m, type: mcp, mcp: {url: my-mcp:8000}}]", "mcp.url must be an absolute http://"),
        ("tools: [{name: m, type: mcp, mcp: {url: 'http://m', tools: [a, a]}}]", "mcp.tools: has 'a' twice"),
        ("tools: [{name: m, type: mcp, mcp: {url: 'http://m', tools: a}}]", "mcp.tools: must be an array"),
        ("tools: [{name: m, type: mcp, mcp: {url: 'http://m', token: x}}]", "mcp: unknown field(s) token"),
        ("tools: [{name: p, type: python, observationFormat: retool}]", "unknown value 'retool'; use one of"),
        ("tools: [{name: p, type: python, observationFormat: 1}]", "observationFormat: must be a string"),
        (
            "tools: [{name: s, type: search, corpus: c.jsonl, observationFormat: default}]",
            "observationFormat is only used by tools of type python",
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
    from chartgen.crd_defaults import spec_schema
    from chartgen.outputs import CRD_SOURCE
    from toolrl_api.defaulting import apply_defaults

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
    """The job's tools.yaml carries it (spec.tools verbatim); the pool checks it (the CRD's enum), the
    trainer reads it; absent, it is the trainer's default format."""
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
        (f"{FUNCTION}}}", "tools[0].parameters: a tool of type function needs parameters"),
        (f"{FUNCTION}, parameters: {{type: array}}}}", "parameters.type: unknown value 'array'"),
        (f"{FUNCTION}, parameters: [1]}}", "tools[0].parameters: must be an object, got [1]"),
        (
            f"{FUNCTION}, parameters: {{type: object, properties: {{a: {{type: integr}}}}}}}}",
            "tools[0].parameters: not a valid JSON schema: 'integr' is not valid",
        ),
        (
            "{name: add, type: function, parameters: {type: object, properties: {}}}",
            "a tool of type function needs function.configMap",
        ),
        (
            "{name: add, type: function, function: {configMap: {name: t}}, parameters: {type: object,"
            " properties: {}}}",
            "tools[0]: a function tool needs source, the path of its Python file",
        ),
        (
            f"{FUNCTION[:-1]}, name: 'not a name'}}, parameters: {{type: object, properties: {{}}}}}}",
            "function.name must be a Python identifier",
        ),
    ],
)
def test_rejects_bad_function_tools_saying_what_to_fix(entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^tools\.yaml: ") as raised:
        parse_tools(f"tools:\n  - {entry}")
    assert message in str(raised.value)
