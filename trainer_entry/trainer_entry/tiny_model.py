"""`python -m trainer_entry tiny-model DIR`: a tiny Qwen2 model and tokenizer made locally (no hub).

For CPU runs (`rollout.engine: hf`, `gpusPerWorker: 0`), tests and the demo. A random model never
calls a tool, so `warm_up` gives it a few seconds of supervised steps on protocol-formatted examples
of the toy task (`toy_problem`: one-digit sums, solved by running code in the tool pool) until most
of its sampled answers contain a tool call in the job's protocol. Its rollouts then really use the
pool, and its rewards vary within a group, so GRPO has something to learn from.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer_entry.data import PYTHON_SYSTEM, gsm8k_row, write_parquet

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


WARM_UP_PROTOCOLS = ("python-tags", "tool-tags")
# vLLM's CPU attention (vLLM 0.24.0, `cpu_attn.py`) takes head sizes 32..512.
HEAD_SIZE = 32


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


def solution_text(problem: ToyProblem, protocol: str) -> tuple[str, str, str]:
    """(call, observation, answer) of the assistant turn that solves `problem` in `protocol`."""
    from trainer_entry.protocols import get_protocol

    if protocol not in WARM_UP_PROTOCOLS:
        raise ValueError(
            f"the tiny model's warm-up speaks {', '.join(WARM_UP_PROTOCOLS)}, not {protocol!r}; "
            "use one of those for CPU runs of the tiny model, or --no-warm-up for a random model"
        )
    proto = get_protocol(protocol)
    call = f"{proto.open_tag}{problem.code}{proto.close_tag}"
    return call, proto.observation(problem.answer), f"#### {problem.answer}"


def build_tokenizer() -> Any:
    """A byte-level BPE trained on the corpus above and the toy task, with a Qwen-style template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    toy = [f"{p.question} {p.code} #### {p.answer}" for p in toy_problems(100)]
    bpe.train_from_iterator([*CORPUS, PYTHON_SYSTEM] * 20 + toy, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(root: Path, name: str = "tiny-qwen2", hidden: int = 32, layers: int = 1) -> Path:
    """Tokenizer + random Qwen2, saved like a hub checkpoint under `root/name`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer()
    path = root / name
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        # heads of HEAD_SIZE: the smallest head vLLM's CPU attention takes (`rollout.engine: vllm`)
        num_attention_heads=max(1, hidden // HEAD_SIZE),
        num_key_value_heads=max(1, hidden // HEAD_SIZE // 2),
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@dataclass(frozen=True)
class WarmUp:
    steps: int
    seconds: float
    loss: float
    call_rate: float
    """Share of answers sampled (temperature 1) for held-out questions that call the tool."""
    copy_rate: float
    """Share of those calls after which the model answers with the tool's output."""


def _prompt(tokenizer: Any, problem: ToyProblem) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "system", "content": PYTHON_SYSTEM}, {"role": "user", "content": problem.question}],
        add_generation_prompt=True,
        tokenize=False,
    )


def _example(
    tokenizer: Any, problem: ToyProblem, protocol: str, guess: int | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of prompt + assistant turn, and labels (-100 on the prompt and the observation).
    With `guess`, the turn answers at once with that number, without calling the tool."""
    if guess is None:
        call, observation, answer = solution_text(problem, protocol)
        parts = ((call, True), (observation, False), (answer, True))
    else:
        parts = ((f"#### {guess}", True),)
    ids, labels = [], []
    for text, learn in ((_prompt(tokenizer, problem), False), *parts, ("<|im_end|>", True)):
        part = tokenizer.encode(text, add_special_tokens=False)
        ids += part
        labels += part if learn else [-100] * len(part)
    return ids, labels


def _sampled_behaviour(
    model: Any, tokenizer: Any, protocol: str, problems: list[ToyProblem]
) -> tuple[float, float]:
    """(call rate, copy rate) of sampled answers; after a call the true tool output is spliced in."""
    import torch

    from trainer_entry.protocols import get_protocol

    proto = get_protocol(protocol)
    calls = copies = 0
    for problem in problems:
        prompt = _prompt(tokenizer, problem)
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
        out = model.generate(
            ids,
            max_new_tokens=24,
            do_sample=True,
            temperature=1.0,
            pad_token_id=tokenizer.pad_token_id,
            stop_strings=list(proto.stop),
            tokenizer=tokenizer,
        )
        text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        if proto.parse(text, "python") is None:
            continue
        calls += 1
        follow = prompt + text + proto.observation(problem.answer)
        ids = torch.tensor([tokenizer.encode(follow, add_special_tokens=False)])
        out = model.generate(
            ids, max_new_tokens=8, do_sample=True, temperature=1.0, pad_token_id=tokenizer.pad_token_id
        )
        tail = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        copies += tail.strip().split("<")[0].strip() == f"#### {problem.answer}"
    return calls / len(problems), copies / max(calls, 1)


def warm_up(
    path: Path,
    protocol: str,
    seconds: float = 300.0,
    guess_share: float = 0.5,
    min_call_rate: float = 0.25,
    min_copy_rate: float = 0.5,
    seed: int = 0,
) -> WarmUp:
    """Supervised steps on toy answers until the model both calls the tool and copies its output.

    A share `guess_share` of the examples answer at once with a random number instead of calling
    the tool (usually wrong), the rest call it in `protocol` and answer with its output. The warmed
    model does both, so its rewards vary within a group and RL has something to learn: that calling
    the tool pays. Stops when sampled answers call the tool at least `min_call_rate` of the time and
    copy its output after `min_copy_rate` of the calls (checked every 50 steps), or after `seconds`;
    saves the model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    # One thread: on a busy 2-core machine torch's thread pool spins (a step measured 4.9 s with the
    # default threads at load 18, 0.05 s with one); on a quiet one this model gains nothing from more.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rng = random.Random(seed)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    examples = [
        _example(tokenizer, p, protocol, rng.randrange(19) if rng.random() < guess_share else None)
        for p in toy_problems(512, seed + 1)
    ]
    held_out = toy_problems(16, seed + 2)
    start, step, loss = time.monotonic(), 0, float("nan")
    call_rate = copy_rate = 0.0
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
                call_rate, copy_rate = _sampled_behaviour(model, tokenizer, protocol, held_out)
            done = call_rate >= min_call_rate and copy_rate >= min_copy_rate
            if done or time.monotonic() - start >= seconds:
                break
    model.save_pretrained(path)
    torch.set_num_threads(threads)
    return WarmUp(step, time.monotonic() - start, loss, call_rate, copy_rate)


def write_toy_data(directory: Path, count: int = 256, seed: int = 0, tool: str = "python") -> Path:
    """The toy task as verl parquet (`train.parquet`), in the python-tags format of the data prep."""
    rows = [gsm8k_row(r, i, "train", tool) for i, r in enumerate(toy_records(count, seed))]
    out = directory / "train.parquet"
    write_parquet(rows, out)
    return out
