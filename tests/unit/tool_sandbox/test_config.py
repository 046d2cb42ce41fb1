import pytest
from tool_sandbox.config import ConfigError, parse_tools


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
    ],
)
def test_rejects_bad_configs_with_a_message_naming_the_problem(text: str, message: str) -> None:
    with pytest.raises(
        ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        parse_tools(text)
