"""Training data → verl's parquet (`python -m trainer_entry.data`).

Rows carry what verl's RLHFDataset and our agent loops read: a chat `prompt`, `data_source`,
`reward_model.ground_truth` and `extra_info` with `tools_kwargs` / `need_tools_kwargs`. The system
prompt teaches one tool-call protocol (`--protocol`, the job's `spec.rollout.protocol`), recorded as
`extra_info.protocol`; the trainer refuses data prepared for another protocol (`check_protocol`). Rows
name no agent loop (`agent_name`): the job's protocol chooses it (trainer_entry.dataset).
Every record is converted before anything is written, and the file appears whole or not at all.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

REACT_SYSTEM = (
    "You can call the functions listed below to answer the user's request. Think step by step. To call a "
    "function write\nThought: <your reasoning>\nAction: <function name>\nAction Input: <JSON arguments>\n"
    "and wait for the Observation. When you are done, call the function Finish with "
    '{"return_type": "give_answer", "final_answer": "..."} or {"return_type": "give_up_and_restart"}.\n'
    "Functions:\n"
)
PYTHON_SYSTEM = (
    "Solve the problem. You may run Python by writing code between <PYTHON> and </PYTHON>; its output is "
    "returned between <PYTHON-OUTPUT> and </PYTHON-OUTPUT>. End with the final answer as '#### <number>'."
)
# The GSM8K system prompt of each tool-call protocol ({tool}: the job's python tool). hermes lists the
# tools through the chat template (verl's tool agent loop passes their schemas).
GSM8K_SYSTEM = {
    "python-tags": PYTHON_SYSTEM,
    "tool-tags": (
        "Solve the problem. You may run Python by writing code between <tool> and </tool>; its output is "
        "returned between <tool_output> and </tool_output>. End with the final answer as '#### <number>'."
    ),
    "hermes": (
        "Solve the problem. You may run Python by calling the function {tool} with the code; it returns "
        "what the code prints. End with the final answer as '#### <number>'."
    ),
    "react": (
        "Solve the problem. You may run Python: write\nThought: <your reasoning>\nAction: {tool}\n"
        'Action Input: {{"code": "<Python source>"}}\nand wait for the Observation (what the code '
        "prints). End with the final answer as '#### <number>'."
    ),
}
# The protocols whose prompts each kind of data can be written in, the first being the default.
KIND_PROTOCOLS = {"gsm8k": ("python-tags", "tool-tags", "hermes", "react"), "toolbench": ("react",)}
FINISH_SCHEMA = {
    "name": "Finish",
    "description": "End the episode with the final answer, or give up and restart.",
    "parameters": {
        "type": "object",
        "properties": {
            "return_type": {"type": "string", "enum": ["give_answer", "give_up_and_restart"]},
            "final_answer": {"type": "string"},
        },
        "required": ["return_type"],
    },
}


class DataError(ValueError):
    """A malformed input record; the message names the file and the record index."""


def standard_name(name: str) -> str:
    """StableToolBench's function naming: lower case, non-alphanumerics to '_'."""
    return re.sub(r"[^a-z0-9_]", "_", name.lower().strip()).strip("_") or "unnamed"


def function_name(api: dict[str, Any]) -> str:
    return f"{standard_name(api['api_name'])}_for_{standard_name(api['tool_name'])}"


def _api_schema(api: dict[str, Any]) -> dict[str, Any]:
    properties = {}
    for param in api.get("required_parameters", []) + api.get("optional_parameters", []):
        properties[param["name"]] = {
            "type": str(param.get("type", "string")).lower(),
            "description": param.get("description", ""),
        }
    return {
        "name": function_name(api),
        "description": f"{api['tool_name']}: {api.get('api_description', '')}".strip(),
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": [p["name"] for p in api.get("required_parameters", [])],
        },
    }


def toolbench_row(
    record: dict[str, Any], index: int, split: str, tool: str, protocol: str = "react"
) -> dict[str, Any]:
    """One StableToolBench query (G1/G2/G3 instruction format) as a ReAct row calling the http tool."""
    apis = record["api_list"]
    schemas = [_api_schema(api) for api in apis] + [FINISH_SCHEMA]
    routes = [
        {
            "function": function_name(a),
            "category": a["category_name"],
            "tool_name": a["tool_name"],
            "api_name": a["api_name"],
        }
        for a in apis
    ]
    relevant = [list(pair) for pair in record.get("relevant APIs", [])]
    return {
        "data_source": "stabletoolbench",
        "prompt": [
            {"role": "system", "content": REACT_SYSTEM + "\n".join(json.dumps(s) for s in schemas)},
            {"role": "user", "content": str(record["query"])},
        ],
        "ability": "tool-use",
        "reward_model": {"style": "rule", "ground_truth": json.dumps(relevant)},
        "extra_info": {
            "index": index,
            "split": split,
            "query_id": str(record.get("query_id", index)),
            "need_tools_kwargs": True,
            "tools_kwargs": {tool: {"create_kwargs": {"routes": routes}}},
            "protocol": protocol,
        },
    }


GSM8K_ANSWER = re.compile(r"####\s*(.+)\s*$")


def gsm8k_row(
    record: dict[str, Any], index: int, split: str, tool: str, protocol: str = "python-tags"
) -> dict[str, Any]:
    """One GSM8K-style record (`question`, `answer` ending in '#### n'), prompted for `protocol`."""
    question, answer = record["question"], record["answer"]
    match = GSM8K_ANSWER.search(str(answer))
    if not isinstance(question, str) or match is None:
        raise ValueError("needs a string 'question' and an 'answer' ending in '#### <number>'")
    return {
        "data_source": "gsm8k",
        "prompt": [
            {"role": "system", "content": GSM8K_SYSTEM[protocol].format(tool=tool)},
            {"role": "user", "content": question},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": match.group(1).strip().replace(",", "")},
        "extra_info": {
            "index": index,
            "split": split,
            "need_tools_kwargs": False,
            "tools_kwargs": {tool: {"create_kwargs": {"routes": []}}},
            "protocol": protocol,
        },
    }


def read_records(path: Path) -> list[dict[str, Any]]:
    """JSON array or JSONL; errors name the file and the line or record."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        records = []
        for line_no, line in enumerate(text.splitlines()):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise DataError(
                        f"{path}: record {len(records)} (line {line_no + 1}): invalid JSON: {exc.msg}"
                    ) from None
        return records
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(doc, list):
        raise DataError(f"{path}: expected a JSON array of records")
    return doc


CONVERTERS = {"toolbench": toolbench_row, "gsm8k": gsm8k_row}


def convert(
    kind: str,
    path: Path,
    records: list[dict[str, Any]],
    split: str,
    tool: str,
    offset: int = 0,
    protocol: str | None = None,
) -> list[dict[str, Any]]:
    protocol = protocol_for(kind, protocol)
    rows = []
    for i, record in enumerate(records):
        try:
            if not isinstance(record, dict):
                raise ValueError("is not a JSON object")
            rows.append(CONVERTERS[kind](record, offset + i, split, tool, protocol))
        except KeyError as exc:
            raise DataError(f"{path}: record {offset + i}: missing field {exc}") from None
        except (ValueError, TypeError) as exc:
            raise DataError(f"{path}: record {offset + i}: {exc}") from None
    return rows


def protocol_for(kind: str, protocol: str | None) -> str:
    """The protocol rows of `kind` are prompted for: `protocol`, or the kind's default."""
    choices = KIND_PROTOCOLS[kind]
    if protocol is None:
        return choices[0]
    if protocol not in choices:
        raise DataError(
            f"{kind} data can be prompted for protocol {', '.join(choices)}, not {protocol!r}: "
            f"choose the job's spec.rollout.protocol among those"
        )
    return protocol


def check_protocol(paths: list[str], protocol: str, sample: int = 64) -> list[str]:
    """Refuse training files prepared for another tool-call protocol than the job's.

    The first `sample` rows of each file are read. A row's `extra_info.protocol` (written by this
    module) must equal `protocol`: its system prompt teaches that protocol, and the job's agent loop
    parses only its own. Returns notes: rows naming an agent loop (`agent_name`, written by other
    preparation scripts and by this module before) are trained with the job's protocol all the same."""
    import pyarrow.parquet as pq

    notes = []
    for path in paths:
        if "://" in path:  # a remote file (verl copies hdfs:// ones itself): not read here
            continue
        try:
            rows = next(pq.ParquetFile(path).iter_batches(batch_size=sample)).to_pylist()
        except StopIteration:
            continue
        except FileNotFoundError:
            raise DataError(
                f"{path}: not found: stage the data into spec.data.volume, mounted at /data (see "
                "examples/data-prep-job.yaml), or correct the path"
            ) from None
        except (OSError, ValueError) as exc:  # pyarrow's errors derive from these
            raise DataError(f"{path}: cannot read it as parquet: {exc}") from None
        prepared = {
            (row.get("extra_info") or {}).get("protocol")
            for row in rows
            if isinstance(row.get("extra_info"), dict)
        } - {None}
        other = sorted(prepared - {protocol})
        if other:
            raise DataError(
                f"{path}: prepared for tool-call protocol {', '.join(other)} (extra_info.protocol; its "
                f"system prompt teaches that protocol) but spec.rollout.protocol is {protocol}: prepare "
                f"the data again with `python -m trainer_entry.data ... --protocol {protocol}`, or set "
                f"spec.rollout.protocol to {other[0]}"
            )
        names = sorted({str(row["agent_name"]) for row in rows if row.get("agent_name") is not None})
        if names:
            notes.append(
                f"{path}: the rows' agent_name ({', '.join(names)}) is ignored; every row is rolled out "
                f"with spec.rollout.protocol {protocol}"
            )
    return notes


def split_records(records: list[Any], train_ratio: float, seed: int) -> tuple[list[Any], list[Any]]:
    """Deterministic shuffle, then the first `train_ratio` share for training."""
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    cut = round(len(records) * train_ratio)
    return [records[i] for i in sorted(order[:cut])], [records[i] for i in sorted(order[cut:])]


def write_parquet(rows: list[dict[str, Any]], out: Path) -> None:
    """Write atomically: a temporary file in the same directory, renamed over `out`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    try:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def prepare(
    kind: str,
    inputs: list[Path],
    output_dir: Path,
    *,
    split: bool,
    train_ratio: float,
    max_samples: int | None,
    seed: int,
    tool: str,
    protocol: str | None = None,
) -> dict[str, int]:
    """Convert `inputs` into `output_dir/train.parquet` (and `test.parquet` with `split`)."""
    protocol = protocol_for(kind, protocol)
    records: list[tuple[Path, int, dict[str, Any]]] = []
    for path in inputs:
        records += [(path, i, r) for i, r in enumerate(read_records(path))]
    if max_samples is not None:
        records = records[:max_samples]
    parts = (
        dict(zip(("train", "test"), split_records(records, train_ratio, seed), strict=True))
        if split
        else {"train": records}
    )
    converted = {}
    for name, part in parts.items():
        rows = []
        for path, i, record in part:
            rows += convert(kind, path, [record], name, tool, offset=i, protocol=protocol)
        converted[name] = rows
    if not converted["train"]:
        raise DataError("no training records: check the inputs, --max-samples and --train-ratio")
    for name, rows in converted.items():
        write_parquet(rows, output_dir / f"{name}.parquet")
    return {name: len(rows) for name, rows in converted.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer_entry.data", description=__doc__)
    parser.add_argument(
        "kind", choices=sorted(CONVERTERS), help="toolbench: StableToolBench JSON; gsm8k: JSONL"
    )
    parser.add_argument("inputs", nargs="+", type=Path)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--split", action="store_true", help="also write test.parquet")
    parser.add_argument("--train-ratio", type=float, default=0.9)
    parser.add_argument("--max-samples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool", default=None, help="spec.tools name the rows call (toolbench / python)")
    parser.add_argument(
        "--protocol",
        choices=sorted({p for ps in KIND_PROTOCOLS.values() for p in ps}),
        default=None,
        help="the job's spec.rollout.protocol, which the system prompt teaches "
        "(gsm8k: python-tags by default, any protocol; toolbench: react)",
    )
    args = parser.parse_args(argv)
    if not 0.0 < args.train_ratio <= 1.0:
        parser.error("--train-ratio must be in (0, 1]")
    tool = args.tool or ("toolbench" if args.kind == "toolbench" else "python")
    try:
        counts = prepare(
            args.kind,
            args.inputs,
            args.output_dir,
            split=args.split,
            train_ratio=args.train_ratio,
            max_samples=args.max_samples,
            seed=args.seed,
            tool=tool,
            protocol=args.protocol,
        )
    except (DataError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"output_dir": str(args.output_dir), **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
