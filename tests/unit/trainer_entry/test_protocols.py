"""Parsing calls and formatting observations of the text protocols."""

import pytest
from trainer_entry.protocols import Call, get_protocol


def test_python_tags_take_the_last_block():
    p = get_protocol("python-tags")
    text = "Let me compute.\n<PYTHON>\nprint(1)\n</PYTHON> then <PYTHON>\nprint(6 * 7)\n</PYTHON>"
    assert p.parse(text, "python") == Call("python", {"code": "print(6 * 7)"})
    assert p.observation("42") == "\n<PYTHON-OUTPUT>\n42\n</PYTHON-OUTPUT>\n"
    assert p.stop == ("</PYTHON>",) and p.include_stop


def test_tool_tags():
    p = get_protocol("tool-tags")
    assert p.parse("<tool>x = 3\nprint(x)</tool>", "py") == Call("py", {"code": "x = 3\nprint(x)"})
    assert p.observation("3") == "\n<tool_output>\n3\n</tool_output>\n"


def test_no_call_or_unclosed_tag_is_no_call():
    p = get_protocol("python-tags")
    assert p.parse("The answer is 42.", "python") is None
    assert p.parse("<PYTHON>print(1)", "python") is None


def test_tag_without_python_tool_is_an_error_call():
    assert get_protocol("tool-tags").parse("<tool>1</tool>", None).error


def test_react_action_and_json_input():
    p = get_protocol("react")
    text = (
        'Thought: search first\nAction: transfermarkt_search_for_theclique\nAction Input: {"name": "Messi"}\n'
    )
    assert p.parse(text, None) == Call("transfermarkt_search_for_theclique", {"name": "Messi"})
    assert p.observation('{"error": ""}') == '\nObservation: {"error": ""}\n'
    assert not p.include_stop


def test_react_finish_ends_the_episode():
    p = get_protocol("react")
    call = p.parse('Action: Finish\nAction Input: {"return_type": "give_answer", "final_answer": "x"}', None)
    assert p.is_final(call)


def test_react_bad_json_is_an_error_unless_the_action_is_the_code_tool():
    p = get_protocol("react")
    assert "not valid JSON" in p.parse("Action: search\nAction Input: {oops", "python").error
    assert p.parse("Action: python\nAction Input: print(1)", "python") == Call("python", {"code": "print(1)"})
    assert "JSON object" in p.parse("Action: search\nAction Input: [1, 2]", None).error


def test_unknown_protocol():
    with pytest.raises(ValueError, match="unknown tool-call protocol 'xml'"):
        get_protocol("xml")
