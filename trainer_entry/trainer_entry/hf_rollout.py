"""`rollout.engine: hf`: verl's rollout served by transformers, on the actor's current weights.

For CPU smoke runs of tiny models (and tiny models next to one GPU): no vLLM, no CUDA kernels. It
plugs into verl 0.9.1 through its registries (`verl_plugin.register`), the same way vLLM does:

- `HFReplica` (verl's `RolloutReplica`) starts one `HFRolloutServer` Ray actor per replica. The
  agent loops call its `generate` token-in/token-out, exactly as they call vLLM's server.
- `HFServerAdapter` (verl's `BaseRollout`) lives in each training worker; after every step verl
  hands it the actor's weights and it sends them to the server (`update_weights`).

The server samples one request at a time with a KV cache, honouring temperature, top-p, top-k,
EOS, stop strings and max_tokens. Log-probs, when asked, are of the sampled token under the
model's unmodified distribution (what vLLM returns by default).

Partial rollouts (verl's `colocate_async` trainer) work as on verl's vLLM server: `abort_all_requests`
stops the request being sampled at its next token and returns what it has with stop reason
`aborted`, and parks every request that arrives (or waits for the model) until `resume_generation`;
verl's `FullyAsyncLLMServerClient` then sends the aborted request again with its tokens so far, to
be continued on the new weights (`global_steps` tells it which version sampled each piece).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Generator
from typing import Any

import ray
import torch
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput

from trainer_entry.verl_internals import actor_ready, call_in_actor, set_replica_server
from trainer_entry.verl_plugin import ENGINE_NAME

log = logging.getLogger(__name__)

ENGINE = ENGINE_NAME
SERVER_PREFIX = "toolrl_hf_server_"


def server_name(replica_rank: int) -> str:
    return f"{SERVER_PREFIX}{replica_rank}"


def sample_token(
    logits: torch.Tensor, temperature: float, top_p: float, top_k: int, generator: torch.Generator
) -> int:
    """One token from 1-D `logits`: greedy at temperature 0, else top-k, then nucleus sampling."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    scaled = logits / temperature
    if top_k and 0 < top_k < scaled.numel():
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    if 0 < top_p < 1:
        ordered, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = cumulative - torch.softmax(ordered, dim=-1) >= top_p
        scaled = scaled.scatter(0, order, ordered.masked_fill(drop, -math.inf))
    probs = torch.softmax(scaled, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


class HFRolloutServer:
    """A Ray actor: the model in transformers, generating token-in/token-out for the agent loops."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, replica_rank: int) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from verl.utils.config import omega_conf_to_dataclass

        # One thread: tiny matmuls gain nothing from more, and on a busy machine torch's thread pool
        # spins (a warm-up step measured 4.9 s with the default threads at load 18, 0.05 s with one).
        torch.set_num_threads(1)
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.config = config
        self.replica_rank = replica_rank
        path = model_config.local_path or model_config.path
        self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=model_config.trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(
            path,
            dtype=torch.float32,
            attn_implementation="sdpa",
            trust_remote_code=model_config.trust_remote_code,
        ).eval()
        self.initial = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos]
        self.eos_ids = {int(e) for e in [*eos, self.tokenizer.eos_token_id] if e is not None}
        self.max_model_len = int(config.max_model_len or config.prompt_length + config.response_length)
        self.global_steps = 0  # the weights' version: verl's step that produced them
        self.generator = torch.Generator().manual_seed(int(config.seed) + replica_rank)
        self.lock = asyncio.Lock()
        self.updates = 0
        # partial rollouts: while paused, the request being sampled stops at its next token and new ones
        # wait for `resumed` (read by the sampling thread: a bool's assignment is atomic)
        self.paused = self.rejecting = False
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.aborted = 0

    def _budget(self, prompt_len: int, params: dict[str, Any]) -> int:
        # as verl's vLLM server: the request's max_tokens, else what the response length allows
        requested = params.pop("max_tokens", params.pop("max_new_tokens", None))
        if requested is None:
            requested = min(
                self.config.response_length,
                self.config.prompt_length + self.config.response_length - prompt_len,
            )
        room = self.max_model_len - prompt_len
        if room < 1:
            raise ValueError(
                f"prompt of {prompt_len} tokens leaves no room within max_model_len {self.max_model_len}"
            )
        return max(1, min(int(requested), room))

    @torch.no_grad()  # grad mode is per thread: this runs in a worker thread
    def _sample(self, prompt_ids: list[int], params: dict[str, Any]) -> tuple[list[int], list[float], bool]:
        """The sampled tokens and their log-probs, and whether an abort stopped the sampling."""
        max_tokens = self._budget(len(prompt_ids), params)
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0))
        top_k = int(params.get("top_k", -1) or -1)
        ignore_eos = bool(params.get("ignore_eos", False))
        stops = [s for s in (params.get("stop") or []) if s]
        window = max((len(s) for s in stops), default=0) + 4  # tokens enough to hold any stop string
        tokens: list[int] = []
        logprobs: list[float] = []
        past = None
        step_input = torch.tensor([prompt_ids], dtype=torch.long)
        for _ in range(max_tokens):
            if self.paused:
                return tokens, logprobs, True
            out = self.model(input_ids=step_input, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1].float()
            token = sample_token(logits, temperature, top_p, top_k, self.generator)
            tokens.append(token)
            logprobs.append(torch.log_softmax(logits, dim=-1)[token].item())
            if token in self.eos_ids and not ignore_eos:
                break
            if stops:
                tail = self.tokenizer.decode(tokens[-window:], skip_special_tokens=False)
                if any(s in tail for s in stops):
                    break
            step_input = torch.tensor([[token]], dtype=torch.long)
        return tokens, logprobs, False

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None:
            raise ValueError("rollout.engine hf serves text models only (got image or video input)")
        params = dict(sampling_params)
        want_logprobs = bool(params.get("logprobs"))
        while self.paused and not self.rejecting:  # parked until verl resumes generation
            await self.resumed.wait()
        async with self.lock:  # one sequence at a time: torch already uses every core for one
            if self.paused:  # aborted (or rejected) while waiting for the model: the client sends it again
                tokens, logprobs, aborted = [], [], True
            else:
                tokens, logprobs, aborted = await asyncio.to_thread(self._sample, list(prompt_ids), params)
        self.aborted += aborted
        return TokenOutput(
            token_ids=tokens,
            log_probs=logprobs if want_logprobs else None,
            stop_reason="aborted" if aborted else "completed",
            extra_fields={"global_steps": self.global_steps},
        )

    def update_weights(
        self, named_tensors: dict[str, torch.Tensor], global_steps: int | None = None
    ) -> float:
        """Load the actor's weights; returns their L2 distance from the initial ones (and logs it)."""
        state = self.model.state_dict()
        unknown = sorted(set(named_tensors) - set(state))
        if unknown:
            raise KeyError(f"hf rollout: weights the model does not have: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in named_tensors.items():
                state[name].copy_(tensor.to(state[name].dtype))
        if getattr(self.model.config, "tie_word_embeddings", False):
            self.model.tie_weights()
        self.updates += 1
        if global_steps is not None:
            self.global_steps = global_steps
        distance = math.sqrt(
            sum(float((state[k].float() - v.float()).pow(2).sum()) for k, v in self.initial.items())
        )
        log.warning(
            "hf rollout: weights update %d (step %s): L2 distance from the initial weights %.6g",
            self.updates,
            global_steps,
            distance,
        )
        return distance

    # Lifecycle calls verl makes on every rollout server; weights and cache live in host memory.
    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def wake_up(self, *args: Any, **kwargs: Any) -> None: ...

    async def sleep(self, *args: Any, **kwargs: Any) -> None: ...

    async def clear_kv_cache(self) -> None: ...

    async def release_kv_cache(self) -> None: ...

    async def resume_kv_cache(self) -> None: ...

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Stop sampling and hold new requests until `resume_generation`: the request being sampled ends
        at its next token (`aborted`), as do those waiting for the model, and with `reject_request`
        those that arrive until then (verl routes them to another replica). Returns once none samples."""
        before = self.aborted
        self.paused, self.rejecting = True, reject_request
        self.resumed.clear()
        async with self.lock:  # the request being sampled has stopped
            pass
        count = self.aborted - before
        log.warning(
            "hf rollout: generation paused (step %s), %d request(s) aborted", self.global_steps, count
        )
        return {"aborted_count": count, "request_ids": []}

    async def resume_generation(self) -> None:
        self.paused = self.rejecting = False
        self.resumed.set()

    async def wait_for_requests_to_drain(self) -> None:
        async with self.lock:
            return None

    async def start_profile(self, **kwargs: Any) -> None: ...

    async def stop_profile(self) -> None: ...


class HFReplica(RolloutReplica):
    """One `HFRolloutServer` per replica, on the node of the replica's first training worker."""

    async def launch_servers(self) -> None:
        node_id = None
        if self.workers:
            node_id = await call_in_actor(
                self.workers[0], lambda worker: ray.get_runtime_context().get_node_id()
            )
        options: dict[str, Any] = {
            "name": server_name(self.replica_rank) + self.name_suffix,
            "max_concurrency": self.max_concurrency,
            "num_cpus": 0,
        }
        if node_id is not None:
            options["scheduling_strategy"] = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            )
        server = (
            ray.remote(HFRolloutServer)
            .options(**options)
            .remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
        )
        await actor_ready(server)
        self.servers = [server]
        # verl's load balancer keys servers by address; there is no HTTP endpoint
        set_replica_server(self, server, f"{ENGINE}-replica-{self.replica_rank}")


class HFServerAdapter(BaseRollout):
    """In each training worker: forwards the actor's weights to its replica's server."""

    def __init__(self, config: RolloutConfig, model_config: HFModelConfig, device_mesh: Any, **kwargs: Any):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = int(self.config.tensor_model_parallel_size) or 1
        self.is_leader = rank % world == 0
        # in a training worker (hybrid) the replica follows from the rank; verl's checkpoint-engine worker
        # of a standalone rollout (separate-async) names its replica, its own group's rank starting at 0
        given = kwargs.get("replica_rank")
        self.replica_rank = int(given) if given is not None else rank // world
        self.server = None

    def _server(self) -> Any:
        if self.server is None:
            self.server = ray.get_actor(server_name(self.replica_rank))
        return self.server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"rollout.engine hf takes full weights (named_tensors), not {wire_format!r}")
        tensors = {}
        if hasattr(weights, "__aiter__"):  # a checkpoint engine's asynchronous receiver
            weights = [item async for item in weights]
        for name, tensor in weights:  # every rank must drain the generator (it gathers shards)
            if hasattr(tensor, "full_tensor"):
                tensor = tensor.full_tensor()
            tensors[name] = tensor.detach().to("cpu", copy=True)
        if self.is_leader:
            await self._server().update_weights.remote(tensors, global_steps)
