"""`python -m trainer_entry tiny-model DIR`: a tiny Qwen2 model and tokenizer made locally (no hub).

For CPU runs (`gpusPerWorker: 0`), tests, the demo and GPU smoke runs. A random model never calls a
tool, so `warm_up` gives it supervised steps on answers that call a tool in the job's protocol, until
most of its sampled answers for held-out prompts do. With `--spec job.json` these are the job's own
prompts (the first training file), protocol and tools, so a smoke run of any job calls its tools;
without, the toy task (`ToyProblem`: one-digit sums, solved by running code in the tool pool), whose
answers it also learns to copy from the tool's output, so its rewards vary within a group and GRPO
has something to learn from.

Its attention heads are `HEAD_DIM` wide: vLLM's CPU attention backend takes head sizes 32 to 512
(vllm 0.24.0, `v1/attention/backends/cpu_attn.py`), so the same model runs under `engine: vllm` too.
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_entry.data import GSM8K_SYSTEM, gsm8k_row, write_parquet

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n"
    "{% endif %}# Tools\n\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\n"
    "For each function call, return a json object within <tool_call></tool_call> tags.<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n{{ message.content or '' }}"
    "{%- for tc in message.tool_calls or [] %}\n<tool_call>\n"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    'Thought: I should run code. Action: python Action Input: {"code": "print(1 + 1)"} Observation: 2',
    "<PYTHON>print(6 * 7)</PYTHON> <PYTHON-OUTPUT>42</PYTHON-OUTPUT> <tool>x = 3</tool> <tool_output>",
    '<tool_call> {"name": "python", "arguments": {"code": "print(2)"}} </tool_call> <tool_response>',
    "The answer is 42. #### 42 Error: the tool call timed out after 1.0s. Finish give_answer final_answer",
    "import time; time.sleep(10) while True: pass raise ValueError('boom') Traceback (most recent call last)",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 {}[]()<>:;,.'\"!?/\\|-_=+*&^%$#@~`",
]


@dataclass(frozen=True)
class ToyProblem:
    """One-digit addition: the question, the code that solves it, its output and the answer."""

    a: int
    b: int

    @property
    def question(self) -> str:
        return f"What is {self.a} + {self.b}?"

    @property
    def code(self) -> str:
        return f"print({self.a} + {self.b})"

    @property
    def answer(self) -> str:
        return str(self.a + self.b)


TOY_QUESTIONS = 8
"""Distinct sums of the toy task. Few enough that the tiny model learns each one's code and output
in its warm-up: a 2-layer model does not learn to copy digits from the question or the tool's output
in minutes (measured: 5-15 % after 450 steps), and the toy is about learning *to call the tool*."""


def toy_problems(count: int, seed: int = 0) -> list[ToyProblem]:
    """`count` problems drawn from the task's `TOY_QUESTIONS` distinct sums."""
    fixed = random.Random(0)
    pool = [ToyProblem(fixed.randrange(10), fixed.randrange(10)) for _ in range(TOY_QUESTIONS)]
    rng = random.Random(seed)
    return [rng.choice(pool) for _ in range(count)]


def toy_records(count: int, seed: int = 0) -> list[dict[str, str]]:
    """GSM8K-style records (`question`, `answer` ending in '#### n') for `trainer_entry.data gsm8k`."""
    return [{"question": p.question, "answer": f"#### {p.answer}"} for p in toy_problems(count, seed)]


HEAD_DIM = 32
"""Width of each attention head (vLLM's CPU attention needs 32..512)."""
WARM_UP_PROTOCOLS = ("python-tags", "tool-tags", "react", "hermes")
TOY_TOOL = {"name": "python", "type": "python"}


@dataclass(frozen=True)
class Prompt:
    """One prompt of the warm-up: its chat messages (as a data row holds them) and its answer."""

    messages: list[dict[str, str]]
    answer: str


def toy_prompts(count: int, protocol: str, seed: int = 0, tool: str = "python") -> list[Prompt]:
    rows = [gsm8k_row(r, i, "train", tool, protocol) for i, r in enumerate(toy_records(count, seed))]
    return [Prompt(list(row["prompt"]), row["reward_model"]["ground_truth"]) for row in rows]


def job_prompts(path: Path, limit: int = 1024) -> list[Prompt]:
    """The first `limit` prompts of a training parquet (verl's `prompt` and ground truth columns)."""
    import pyarrow.parquet as pq

    try:
        batch = next(pq.ParquetFile(path).iter_batches(batch_size=limit, columns=["prompt", "reward_model"]))
    except (OSError, StopIteration, KeyError) as exc:
        raise ValueError(f"{path}: no training prompts to warm up on ({exc or 'empty file'})") from None
    prompts = []
    for row in batch.to_pylist():
        truth = (row.get("reward_model") or {}).get("ground_truth")
        prompts.append(Prompt([dict(m) for m in row["prompt"]], str(truth if truth is not None else "1")))
    if len(prompts) < 2:
        raise ValueError(f"{path}: the warm-up needs at least 2 prompts, found {len(prompts)}")
    return prompts


@dataclass(frozen=True)
class Episode:
    """One assistant turn that calls a tool in a protocol: the texts of the call and its answer."""

    tool: dict[str, Any]
    protocol: str

    def call_arguments(self, prompt: Prompt) -> tuple[dict[str, Any], str]:
        """(arguments, what the tool prints) of a call that answers `prompt`."""
        kind = self.tool["type"]
        if kind == "python":
            return {"code": f"print({prompt.answer!r})"}, f"{prompt.answer}\n"
        question = next((m["content"] for m in reversed(prompt.messages) if m["role"] == "user"), "")
        if kind == "search":
            return {"query": question[:80]}, "(search results)"
        if kind == "function":
            return function_arguments(self.tool["parameters"], prompt.answer), f"{prompt.answer}"
        return {"arguments": {}}, "(response)"

    def schemas(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        from trainer_entry.translate import tool_schema

        return [tool_schema(t) for t in tools] if self.protocol == "hermes" else None

    def parts(
        self, tokenizer: Any, prompt: Prompt, tools: list[dict[str, Any]], guess: int | None = None
    ) -> list[tuple[str, bool]]:
        """(text, learn) pieces of prompt + assistant turn; `guess` answers at once, without a call."""
        schemas = self.schemas(tools)
        start = tokenizer.apply_chat_template(
            prompt.messages, tools=schemas, add_generation_prompt=True, tokenize=False
        )
        end = tokenizer.eos_token
        if guess is not None:
            return [(start, False), (f"#### {guess}{end}", True)]
        arguments, output = self.call_arguments(prompt)
        answer = f"#### {prompt.answer}{end}"
        if self.protocol == "hermes":
            call = {"role": "assistant", "content": "", "tool_calls": [self._tool_call(arguments)]}
            called = tokenizer.apply_chat_template([*prompt.messages, call], tools=schemas, tokenize=False)
            turn = called[len(start) : called.index(end, len(start)) + len(end)]
            answered = tokenizer.apply_chat_template(
                [*prompt.messages, call, {"role": "tool", "content": output}],
                tools=schemas,
                add_generation_prompt=True,
                tokenize=False,
            )
            return [(start, False), (turn, True), (answered[len(start) + len(turn) :], False), (answer, True)]
        from trainer_entry.protocols import get_protocol

        proto = get_protocol(self.protocol)
        if self.protocol == "react":
            turn = f"Action: {self.tool['name']}\nAction Input: {json.dumps(arguments)}"
        else:
            turn = f"{proto.open_tag}{arguments['code']}{proto.close_tag}"
        return [(start, False), (turn, True), (proto.observation(output), False), (answer, True)]

    def _tool_call(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.tool["name"], "arguments": arguments}}

    def calls(self, text: str) -> bool:
        """Whether sampled text calls the tool in the protocol."""
        if self.protocol == "hermes":
            for body in re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.DOTALL):
                try:
                    call = json.loads(body)
                except json.JSONDecodeError:
                    continue
                if isinstance(call, dict) and call.get("name") == self.tool["name"]:
                    return True
            return False
        from trainer_entry.protocols import get_protocol

        call = get_protocol(self.protocol).parse(text, self.tool["name"])
        return call is not None and not call.error and call.name == self.tool["name"]

    def stops(self) -> list[str]:
        if self.protocol == "hermes":
            return ["</tool_call>"]
        from trainer_entry.protocols import get_protocol

        return list(get_protocol(self.protocol).stop)


def function_arguments(schema: dict[str, Any], answer: str) -> dict[str, Any]:
    """Arguments of a function tool's call in the warm-up: each required parameter (every one when
    none is) gets the prompt's answer in its type (the first of an enum), so a function that answers
    with what it is given (a smoke run's) returns the answer."""
    try:
        number: int | float = int(answer)
    except ValueError:
        try:
            number = float(answer)
        except ValueError:
            number = 0
    values = {
        "integer": int(number),
        "number": number,
        "string": answer,
        "boolean": True,
        "array": [],
        "object": {},
    }
    properties = schema.get("properties") or {}
    arguments = {}
    for name in schema.get("required") or list(properties):
        prop = properties.get(name) or {}
        kind = prop.get("type")
        kind = next((k for k in kind if k in values), "string") if isinstance(kind, list) else kind
        arguments[name] = prop["enum"][0] if prop.get("enum") else values.get(kind, answer)
    return arguments


def episode_for(protocol: str, tools: list[dict[str, Any]]) -> Episode:
    """The warm-up's call: a protocol that calls tools by name (hermes, react) calls the job's first
    function tool where it has one (a smoke run calls the user's function); else the python tool when
    the job has one, else its first tool."""
    if protocol not in WARM_UP_PROTOCOLS:
        raise ValueError(f"the tiny model's warm-up speaks {', '.join(WARM_UP_PROTOCOLS)}, not {protocol!r}")
    if not tools:
        raise ValueError("the warm-up needs a tool to call: the job's spec.tools is empty")
    named = protocol in ("hermes", "react")
    tool = next((t for t in tools if named and t["type"] == "function"), None)
    tool = tool or next((t for t in tools if t["type"] == "python"), tools[0])
    if protocol in ("python-tags", "tool-tags") and tool["type"] != "python":
        raise ValueError(f"protocol {protocol} runs code: the job needs a tool of type python")
    return Episode(tool=tool, protocol=protocol)


def build_tokenizer(extra_texts: list[str] | None = None) -> Any:
    """A byte-level BPE trained on the corpus above, the data prep's prompts, the toy task and
    `extra_texts` (a job's prompts and tool schemas), with a Qwen-style template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600 if not extra_texts else 1000,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    toy = [f"{p.question} {p.code} #### {p.answer}" for p in toy_problems(100)]
    fixed = [*CORPUS, *sorted(set(GSM8K_SYSTEM.values()))] * 20
    bpe.train_from_iterator(fixed + toy + list(extra_texts or []), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def prompt_texts(prompts: list[Prompt], tools: list[dict[str, Any]]) -> list[str]:
    """What a job's conversations hold, for the tokenizer: prompt contents and tool schemas."""
    from trainer_entry.translate import tool_schema

    texts = [m["content"] for p in prompts for m in p.messages if isinstance(m.get("content"), str)]
    return texts + [json.dumps(tool_schema(t)) for t in tools] * 20


def build_tiny_model(
    root: Path,
    name: str = "tiny-qwen2",
    hidden: int = 32,
    layers: int = 1,
    extra_texts: list[str] | None = None,
) -> Path:
    """Tokenizer + random Qwen2, saved like a hub checkpoint under `root/name`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden % HEAD_DIM:
        raise ValueError(f"hidden size {hidden} must be a multiple of the head size {HEAD_DIM}")
    tokenizer = build_tokenizer(extra_texts)
    path = root / name
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    heads = hidden // HEAD_DIM
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@dataclass(frozen=True)
class Sampling:
    """How training samples a job's responses (its composed verl config: `rollout.n`, the response and
    prompt lengths, temperature, top-p, top-k), for the warm-up to measure the model the same way."""

    rollouts: int
    """Responses per prompt: one GRPO group."""
    max_new_tokens: int
    max_prompt_tokens: int
    """verl's agent loop keeps a longer prompt's *last* this many tokens (the system prompt that
    teaches the protocol goes first)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    """-1: off, as verl and vLLM say it."""

    @classmethod
    def of_job(cls, job: Any) -> Sampling:
        """The job's sampling as its training composes it (`extraArgs` included)."""
        from trainer_entry import verl_config
        from trainer_entry.translate import translate

        rollout = verl_config.compose(
            translate(job, "http://127.0.0.1:1").overrides
        ).actor_rollout_ref.rollout
        return cls(
            rollouts=int(rollout.n),
            max_new_tokens=int(rollout.response_length),
            max_prompt_tokens=int(rollout.prompt_length),
            temperature=float(rollout.temperature),
            top_p=float(rollout.top_p),
            top_k=int(rollout.top_k),
        )

    def generate_kwargs(self) -> dict[str, Any]:
        """transformers' `generate` arguments that sample as verl's rollout does."""
        if self.temperature <= 0:
            return {"do_sample": False, "num_return_sequences": 1}
        return {
            "do_sample": True,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k if self.top_k > 0 else 0,  # 0: off in transformers (its default is 50)
            "num_return_sequences": self.rollouts,
        }


@dataclass(frozen=True)
class Behaviour:
    """What the model does with held-out prompts, sampled."""

    call_rate: float
    """Share of sampled answers that call the tool."""
    copy_rate: float
    """Share of prompts with a call after which the model answers with the tool's output."""
    group_rate: float | None = None
    """Share of prompts of which at least one of `Sampling.rollouts` answers calls the tool: the GRPO
    groups in which training sees the tool used (None: measured without the job's sampling)."""
    prompts_cut: float = 0.0
    """Share of prompts longer than the job's prompt length (left-truncated, as training does)."""


@dataclass(frozen=True)
class WarmUp:
    steps: int
    seconds: float
    loss: float
    call_rate: float
    """Share of answers sampled for held-out prompts that call the tool (temperature 1, or the job's
    sampling when given one)."""
    copy_rate: float
    """Share of the prompts with a call after whose call (the taught one, with the true output spliced
    in) the model answers with the tool's output."""
    goal_met: bool = False
    """Whether it stopped at its call and copy rates, not at its time bound."""
    group_rate: float | None = None
    """With the job's sampling: share of prompt groups (`rolloutsPerPrompt` answers) calling the tool."""
    prompts_cut: float = 0.0
    """With the job's sampling: share of prompts training will left-truncate (spec.data.maxPromptLength)."""


def _example(
    tokenizer: Any, episode: Episode, prompt: Prompt, tools: list[dict[str, Any]], guess: int | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of prompt + assistant turn, and labels (-100 where nothing is learned)."""
    ids, labels = [], []
    for text, learn in episode.parts(tokenizer, prompt, tools, guess):
        part = tokenizer.encode(text, add_special_tokens=False)
        ids += part
        labels += part if learn else [-100] * len(part)
    return ids, labels


def _sampled_behaviour(
    model: Any,
    tokenizer: Any,
    episode: Episode,
    prompts: list[Prompt],
    tools: list[dict[str, Any]],
    sampling: Sampling | None = None,
) -> Behaviour:
    """What the model does with `prompts`, sampled; after a call the true tool output is spliced in
    to see whether it copies it. Without `sampling`, one answer per prompt at temperature 1 (up to 48
    tokens); with it, as the job's training samples: `rollouts` answers per prompt, its lengths
    (a longer prompt left-truncated, as verl's agent loop does), temperature, top-p and top-k."""
    import torch

    calls = groups = copies = cut = 0
    answers = 0
    for prompt in prompts:
        parts = episode.parts(tokenizer, prompt, tools)
        ids = tokenizer.encode(parts[0][0], add_special_tokens=False)
        if sampling is not None:
            cut += len(ids) > sampling.max_prompt_tokens
            ids = ids[-sampling.max_prompt_tokens :]
            how = {"max_new_tokens": sampling.max_new_tokens, **sampling.generate_kwargs()}
        else:
            how = {"max_new_tokens": 48, "do_sample": True, "temperature": 1.0}
        tensor = torch.tensor([ids])
        out = model.generate(
            tensor,
            pad_token_id=tokenizer.pad_token_id,
            stop_strings=episode.stops(),
            tokenizer=tokenizer,
            **how,
        )
        texts = [tokenizer.decode(row[tensor.shape[1] :], skip_special_tokens=True) for row in out]
        called = sum(episode.calls(text) for text in texts)
        answers += len(texts)
        calls += called
        if not called:
            continue
        groups += 1
        follow = "".join(text for text, _ in parts[:3])  # the call as taught, then the true output
        follow_ids = torch.tensor([tokenizer.encode(follow, add_special_tokens=False)])
        out = model.generate(
            follow_ids,
            max_new_tokens=12,
            do_sample=True,
            temperature=1.0,
            pad_token_id=tokenizer.pad_token_id,
        )
        tail = tokenizer.decode(out[0, follow_ids.shape[1] :], skip_special_tokens=True)
        copies += tail.strip().split("<")[0].strip() == f"#### {prompt.answer}"
    return Behaviour(
        call_rate=calls / max(answers, 1),
        copy_rate=copies / max(groups, 1),
        group_rate=groups / len(prompts) if sampling is not None else None,
        prompts_cut=cut / len(prompts),
    )


def warm_up(
    path: Path,
    protocol: str,
    seconds: float = 300.0,
    guess_share: float = 0.5,
    min_call_rate: float = 0.25,
    min_copy_rate: float = 0.5,
    seed: int = 0,
    prompts: list[Prompt] | None = None,
    tools: list[dict[str, Any]] | None = None,
    sampling: Sampling | None = None,
    min_group_rate: float = 0.75,
) -> WarmUp:
    """Supervised steps on answers that call a tool until the model calls it on held-out prompts.

    `prompts` (default: the toy task's, in `protocol`) and `tools` (default: one python tool) are the
    job's. A share `guess_share` of the examples answer at once with a random number instead of
    calling the tool (usually wrong), the rest call it and answer with its output. The warmed model
    does both, so its rewards vary within a group and RL has something to learn: that calling the
    tool pays. Stops when sampled answers call the tool at least `min_call_rate` of the time and
    copy its output after `min_copy_rate` of the calls (checked every 50 steps), or after `seconds`;
    saves the model. With the job's `sampling` the answers are sampled as its training will sample
    them, and at least `min_group_rate` of the prompts' groups must call the tool too: a smoke run's
    rollouts then call it in most groups (a rate measured otherwise promised calls that training,
    sampling longer answers from a cut prompt, did not make)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tools = tools or [TOY_TOOL]
    episode = episode_for(protocol, tools)
    if prompts is None:
        prompts = toy_prompts(512 + 16, protocol, seed + 1, episode.tool["name"])
    rng = random.Random(seed)
    shuffled = rng.sample(prompts, len(prompts))
    held_out_count = max(1, min(16, len(shuffled) // 8))
    held_out, train = shuffled[:held_out_count], shuffled[held_out_count:] or shuffled
    torch.manual_seed(seed)
    # One thread: on a busy 2-core machine torch's thread pool spins (a step measured 4.9 s with the
    # default threads at load 18, 0.05 s with one); on a quiet one this model gains nothing from more.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    examples = [
        _example(tokenizer, episode, p, tools, rng.randrange(19) if rng.random() < guess_share else None)
        for p in (train * (512 // len(train) + 1))[:512]
    ]
    start, step, loss = time.monotonic(), 0, float("nan")
    seen = Behaviour(call_rate=0.0, copy_rate=0.0)
    done = False
    while True:
        model.train()
        batch = rng.sample(examples, 16)
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), tokenizer.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, lab) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            labels[row, : len(lab)] = torch.tensor(lab)
            mask[row, : len(ids)] = 1
        out = model(input_ids=input_ids, attention_mask=mask, labels=labels)
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
        step, loss = step + 1, out.loss.item()
        if step % 50 == 0:
            model.eval()
            with torch.no_grad():
                seen = _sampled_behaviour(model, tokenizer, episode, held_out, tools, sampling)
            done = (
                seen.call_rate >= min_call_rate
                and seen.copy_rate >= min_copy_rate
                and (seen.group_rate is None or seen.group_rate >= min_group_rate)
            )
            if done or time.monotonic() - start >= seconds:
                break
    model.save_pretrained(path)
    torch.set_num_threads(threads)
    return WarmUp(
        step,
        time.monotonic() - start,
        loss,
        seen.call_rate,
        seen.copy_rate,
        done,
        seen.group_rate,
        seen.prompts_cut,
    )


def write_toy_data(
    directory: Path, count: int = 256, seed: int = 0, tool: str = "python", protocol: str = "python-tags"
) -> Path:
    """The toy task as verl parquet (`train.parquet`), prompted for `protocol` as the data prep does."""
    rows = [gsm8k_row(r, i, "train", tool, protocol) for i, r in enumerate(toy_records(count, seed))]
    out = directory / "train.parquet"
    write_parquet(rows, out)
    return out


def describe_sampling(sampling: Sampling | None) -> str:
    if sampling is None:
        return "one answer each at temperature 1"
    top_k = f", top-k {sampling.top_k}" if sampling.top_k > 0 else ""
    return (
        f"sampled as the job's training will ({sampling.rollouts} answers each, up to "
        f"{sampling.max_new_tokens} tokens, temperature {sampling.temperature:g}, "
        f"top-p {sampling.top_p:g}{top_k})"
    )


def describe_behaviour(result: WarmUp) -> str:
    groups = "" if result.group_rate is None else f", in {result.group_rate:.0%} of the prompts' groups"
    return (
        f"answers call the tool {result.call_rate:.0%} of the time{groups}, and answer with its output "
        f"for {result.copy_rate:.0%} of the prompts they call it for"
    )


def cut_prompts_message(share: float, sampling: Sampling | None) -> str:
    limit = sampling.max_prompt_tokens if sampling else "?"
    return (
        f"{share:.0%} of the held-out prompts are longer than spec.data.maxPromptLength ({limit} tokens): "
        "training keeps only their last tokens, so the system prompt that teaches the tool-call protocol "
        "is cut first. Raise spec.data.maxPromptLength or shorten the prompts"
    )
