"""`advantageEstimator: gae` starts on GPUs (issue 32, 2): verl 0.9.1's critic loader passes
attn_implementation="flash_attention_2" itself; on every platform without flash-attn the trainer's verl
plugin gives verl the same load with SDPA. Checked on verl's default (nvidia) platform, as a GPU worker
selects it, with a tiny real Qwen2 loaded through the name verl's FSDP engine imports at call time."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import verl.utils.model as model_utils
from transformers import Qwen2Config, Qwen2ForCausalLM

from trainer_entry import verl_internals, verl_plugin


@pytest.fixture
def tiny_qwen2(tmp_path):
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    config = Qwen2Config.from_pretrained(tmp_path)
    config.num_labels = 1  # as verl's engine sets it for the value model
    return tmp_path, config


@pytest.fixture
def verls_own_loader(monkeypatch):
    """verl's loader back in place (this process's plugin may have replaced it), restored after."""
    original = verl_internals._ORIGINALS.get(
        verl_internals.VALUEHEAD_LOADER, model_utils.load_valuehead_model
    )
    monkeypatch.setattr(model_utils, "load_valuehead_model", original)
    monkeypatch.delenv("VERL_PLATFORM", raising=False)  # a GPU worker's: verl's nvidia platform
    assert importlib.util.find_spec("flash_attn") is None, "this venv has flash-attn"
    return original


def load(model_dir, config):
    from verl.utils.model import load_valuehead_model  # as verl's FSDP engine does, at call time

    return load_valuehead_model(
        local_path=str(model_dir), torch_dtype=torch.float32, model_config=config, trust_remote_code=False
    )


def test_verls_own_critic_loader_fails_without_flash_attn(verls_own_loader, tiny_qwen2):
    with pytest.raises(RuntimeError, match="please install trl"):
        load(*tiny_qwen2)


def test_without_flash_attn_the_critic_loads_with_sdpa_on_any_platform(verls_own_loader, tiny_qwen2):
    verl_plugin.register()  # what `import verl` runs in every process (the verl.plugins entry point)
    model = load(*tiny_qwen2)
    assert type(model).__name__ == "Qwen2ForTokenClassification"
    assert model.config._attn_implementation == "sdpa"
    values = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert values.shape == (1, 3, 1)  # one value per token
    verl_plugin.use_sdpa_critic()  # idempotent
    assert model_utils.load_valuehead_model is verl_plugin.load_valuehead_model_sdpa


def test_with_flash_attn_importable_verls_loader_stays(verls_own_loader, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn" else real(name, *a)
    )
    verl_plugin.use_sdpa_critic()
    assert model_utils.load_valuehead_model is verls_own_loader
