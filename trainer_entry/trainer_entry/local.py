"""A local stand-in model for CPU runs without a GPU or any download (tests, benchmarks).

A tiny random Qwen2 model with a locally trained tokenizer: its outputs are meaningless, its token
plumbing is real.
"""

from __future__ import annotations

from pathlib import Path

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


def build_tiny_model(root: Path) -> Path:
    """Byte-level BPE tokenizer + 1-layer random Qwen2, saved like a hub checkpoint."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(CORPUS * 20, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    path = root / "tiny-qwen2"
    tokenizer.save_pretrained(path)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path
