"""Data preparation: real StableToolBench JSON and GSM8K-style JSONL to verl parquet."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from trainer_entry.data import DataError, check_protocol, function_name, main, prepare, write_parquet

G1 = Path(__file__).resolve().parents[4] / "shared" / "data" / "stabletoolbench" / "G1_instruction.json"


def rows(path):
    return pq.read_table(path).to_pylist()


def test_stabletoolbench_split_and_limit(tmp_path):
    counts = prepare(
        "toolbench", [G1], tmp_path, split=True, train_ratio=0.8, max_samples=20, seed=1, tool="toolbench"
    )
    assert counts == {"train": 16, "test": 4}
    train, test = rows(tmp_path / "train.parquet"), rows(tmp_path / "test.parquet")
    assert {r["extra_info"]["split"] for r in train} == {"train"} and len(test) == 4
    first = json.loads(G1.read_text())[0]
    row = next(r for r in train + test if r["extra_info"]["query_id"] == str(first["query_id"]))
    assert row["data_source"] == "stabletoolbench" and row["extra_info"]["protocol"] == "react"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["prompt"][1]["content"] == first["query"]
    assert "transfermarkt_search_for_theclique" in row["prompt"][0]["content"]
    assert row["extra_info"]["need_tools_kwargs"] is True
    routes = row["extra_info"]["tools_kwargs"]["toolbench"]["create_kwargs"]["routes"]
    assert routes[0] == {
        "function": "songkick_concert_for_theclique",
        "category": "Data",
        "tool_name": "TheClique",
        "api_name": "Songkick concert",
    }
    assert json.loads(row["reward_model"]["ground_truth"]) == [list(p) for p in first["relevant APIs"]]


def test_names_match_stabletoolbench_answers():
    assert function_name({"api_name": "Transfermarkt search", "tool_name": "TheClique"}) == (
        "transfermarkt_search_for_theclique"
    )


def test_gsm8k_jsonl(tmp_path):
    src = tmp_path / "gsm8k.jsonl"
    src.write_text(
        json.dumps({"question": "2+2?", "answer": "2+2=4\n#### 4"})
        + "\n\n"
        + json.dumps({"question": "Pay?", "answer": "#### 1,200"})
        + "\n"
    )
    assert main(["gsm8k", str(src), "--output-dir", str(tmp_path / "out")]) == 0
    out = rows(tmp_path / "out" / "train.parquet")
    assert [r["reward_model"]["ground_truth"] for r in out] == ["4", "1200"]
    assert out[0]["extra_info"]["protocol"] == "python-tags" and out[0]["prompt"][1]["content"] == "2+2?"
    assert out[1]["extra_info"]["index"] == 1


def test_malformed_record_names_file_and_index_and_writes_nothing(tmp_path, capsys):
    src = tmp_path / "bad.jsonl"
    src.write_text(
        json.dumps({"question": "ok", "answer": "#### 1"})
        + "\n"
        + json.dumps({"question": "no answer marker", "answer": "four"})
        + "\n"
    )
    out = tmp_path / "out"
    with pytest.raises(DataError, match=rf"{src}: record 1: needs a string 'question'"):
        prepare("gsm8k", [src], out, split=False, train_ratio=1.0, max_samples=None, seed=0, tool="python")
    assert not out.exists() or list(out.iterdir()) == []
    assert main(["gsm8k", str(src), "--output-dir", str(out)]) == 1
    assert "record 1" in capsys.readouterr().err


def test_missing_field_and_bad_json(tmp_path):
    src = tmp_path / "stb.json"
    src.write_text(json.dumps([{"query": "q", "api_list": []}, {"query": "no apis"}]))
    with pytest.raises(DataError, match=r"stb.json: record 1: missing field 'api_list'"):
        prepare(
            "toolbench",
            [src],
            tmp_path / "o",
            split=False,
            train_ratio=1.0,
            max_samples=None,
            seed=0,
            tool="toolbench",
        )
    src.write_text("[{")
    with pytest.raises(DataError, match="invalid JSON"):
        prepare(
            "toolbench",
            [src],
            tmp_path / "o",
            split=False,
            train_ratio=1.0,
            max_samples=None,
            seed=0,
            tool="toolbench",
        )


def test_existing_output_survives_a_failed_run(tmp_path):
    src = tmp_path / "g.jsonl"
    src.write_text(json.dumps({"question": "a", "answer": "#### 1"}) + "\n")
    prepare("gsm8k", [src], tmp_path, split=False, train_ratio=1.0, max_samples=None, seed=0, tool="python")
    before = (tmp_path / "train.parquet").read_bytes()
    src.write_text(json.dumps({"question": "a", "answer": "#### 1"}) + "\n{broken\n")
    with pytest.raises(DataError, match="record 1"):
        prepare(
            "gsm8k", [src], tmp_path, split=False, train_ratio=1.0, max_samples=None, seed=0, tool="python"
        )
    assert (tmp_path / "train.parquet").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.jsonl", "train.parquet"]


# ---- issue 23 (7): the job's protocol, not the data, chooses how tools are called ----------------


def test_rows_name_no_agent_loop_and_record_the_protocol_their_prompt_teaches(tmp_path):
    """verl runs a row's `agent_name` loop instead of the job's: the rows must not carry one."""
    src = tmp_path / "gsm8k.jsonl"
    src.write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
    prepare(
        "toolbench",
        [G1],
        tmp_path / "stb",
        split=False,
        train_ratio=1.0,
        max_samples=2,
        seed=0,
        tool="toolbench",
    )
    for protocol in ("python-tags", "tool-tags", "hermes", "react"):
        assert (
            main(["gsm8k", str(src), "--output-dir", str(tmp_path / protocol), "--protocol", protocol]) == 0
        )
    prepared = {
        p: rows(tmp_path / p / "train.parquet")[0] for p in ("python-tags", "tool-tags", "hermes", "react")
    }
    for row in [*prepared.values(), *rows(tmp_path / "stb" / "train.parquet")]:
        assert "agent_name" not in row
    assert {p: r["extra_info"]["protocol"] for p, r in prepared.items()} == {p: p for p in prepared}
    system = {p: r["prompt"][0]["content"] for p, r in prepared.items()}
    assert "<PYTHON>" in system["python-tags"] and "<tool>" in system["tool-tags"]
    assert "function python" in system["hermes"] and "<" not in system["hermes"].replace("<number>", "")
    assert "Action: python" in system["react"] and "Action Input:" in system["react"]


def test_toolbench_prompts_are_react_only(tmp_path, capsys):
    assert main(["toolbench", str(G1), "--output-dir", str(tmp_path), "--protocol", "hermes"]) == 1
    assert "toolbench data can be prompted for protocol react, not 'hermes'" in capsys.readouterr().err
    assert not (tmp_path / "train.parquet").exists()


def test_data_for_another_protocol_is_refused_with_the_fix(tmp_path):
    src = tmp_path / "gsm8k.jsonl"
    src.write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
    prepare(
        "gsm8k",
        [src],
        tmp_path,
        split=False,
        train_ratio=1.0,
        max_samples=None,
        seed=0,
        tool="python",
        protocol="python-tags",
    )
    train = str(tmp_path / "train.parquet")
    assert check_protocol([train], "python-tags") == []
    with pytest.raises(DataError) as refused:
        check_protocol([train], "hermes")
    assert str(refused.value) == (
        f"{train}: prepared for tool-call protocol python-tags (extra_info.protocol; its system prompt "
        "teaches that protocol) but spec.rollout.protocol is hermes: prepare the data again with "
        "`python -m trainer_entry.data ... --protocol hermes`, or set spec.rollout.protocol to python-tags"
    )
    with pytest.raises(DataError, match=r"missing.parquet: not found: stage the data into spec.data.volume"):
        check_protocol([str(tmp_path / "missing.parquet")], "hermes")


def test_rows_of_other_preparation_scripts_are_used_with_a_note(tmp_path):
    """verl's own preparation scripts write `agent_name` (e.g. tool_agent) and no protocol."""
    old = tmp_path / "old.parquet"
    write_parquet(
        [
            {
                "prompt": [{"role": "user", "content": "q"}],
                "agent_name": "tool_agent",
                "extra_info": {"index": 0},
            }
        ],
        old,
    )
    assert check_protocol([str(old)], "react") == [
        f"{old}: the rows' agent_name (tool_agent) is ignored; every row is rolled out with "
        "spec.rollout.protocol react"
    ]
