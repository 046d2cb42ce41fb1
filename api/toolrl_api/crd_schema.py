# ruff: noqa: E501
"""The ToolRLJob CRD's schema of `spec`, with its CEL rules (`x-kubernetes-validations`),
as data.

GENERATED from crds/toolrl.dev_toolrljobs.yaml by `make chart-generate`
(charts/chartgen/crd_schema.py): do not edit; change the CRD and regenerate.
`make chart-check` fails while this file is stale.
"""

from typing import Any

SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["model", "data", "tools"],
    "x-kubernetes-validations": [{
        "rule": "has(self.algorithm.totalEpochs) != has(self.algorithm.totalTrainingSteps)",
        "fieldPath": ".algorithm",
        "message": "set exactly one of spec.algorithm.totalEpochs or spec.algorithm.totalTrainingSteps",
    }, {
        "rule": "!has(self.algorithm.ppoMiniBatchSize) || self.algorithm.trainBatchSize % self.algorithm.ppoMiniBatchSize == 0",
        "fieldPath": ".algorithm.ppoMiniBatchSize",
        "message": "spec.algorithm.ppoMiniBatchSize must divide spec.algorithm.trainBatchSize: pick a divisor of the batch size, or leave it unset (one mini-batch per batch)",
    }, {
        "rule": "!(self.algorithm.advantageEstimator in ['grpo', 'rloo', 'grpo_passk', 'opo']) || self.algorithm.rolloutsPerPrompt >= 2",
        "fieldPath": ".algorithm.rolloutsPerPrompt",
        "message": "group estimators (grpo, rloo, grpo_passk, opo) compare rollouts of the same prompt: set spec.algorithm.rolloutsPerPrompt to 2 or more, or use advantageEstimator gae",
    }, {
        "rule": "self.trainer.mode == 'sync' || self.trainer.async.maxPolicyVersions >= 2",
        "fieldPath": ".trainer.async.maxPolicyVersions",
        "message": "an asynchronous trainer.mode (colocate-async, separate-async) with trainer.async.maxPolicyVersions 1 drops every sample begun before the last update (all that overlapping generation produced): set maxPolicyVersions to 2 or more, or use trainer.mode sync",
    }, {
        "rule": "(self.trainer.mode == 'separate-async') == has(self.cluster.rolloutWorkers)",
        "fieldPath": ".cluster.rolloutWorkers",
        "message": "cluster.rolloutWorkers (the worker group that generates) is required with trainer.mode separate-async and only there: add it ({replicas, gpusPerWorker}), or remove it for sync and colocate-async, which generate on cluster.workers",
    }, {
        "rule": "self.trainer.mode != 'separate-async' || self.cluster.workers.gpusPerWorker == 0",
        "fieldPath": ".trainer.mode",
        "message": "separate-async runs on CPU workers only so far (gpusPerWorker 0): on GPUs verl syncs the weights through its nccl checkpoint engine, which needs cupy (verl's cupy-cu130 extra), not in the trainer image, and no GPU run has checked it: use colocate-async on GPUs",
    }, {
        "rule": "!has(self.cluster.rolloutWorkers) || (self.cluster.rolloutWorkers.gpusPerWorker == 0) == (self.cluster.workers.gpusPerWorker == 0)",
        "fieldPath": ".cluster.rolloutWorkers.gpusPerWorker",
        "message": "cluster.rolloutWorkers.gpusPerWorker and cluster.workers.gpusPerWorker must both be 0 (CPU) or both above 0 (GPUs)",
    }, {
        "rule": "!has(self.cluster.rolloutWorkers) || self.cluster.rolloutWorkers.gpusPerWorker == 0 || self.cluster.rolloutWorkers.gpusPerWorker % self.rollout.tensorParallelSize == 0",
        "fieldPath": ".cluster.rolloutWorkers.gpusPerWorker",
        "message": "rollout.tensorParallelSize must divide cluster.rolloutWorkers.gpusPerWorker; change one of them",
    }, {
        "rule": "self.trainer.mode != 'separate-async' || (has(self.algorithm.ppoMiniBatchSize) ? self.algorithm.trainBatchSize == self.trainer.async.parameterSyncStep * self.algorithm.ppoMiniBatchSize : self.algorithm.trainBatchSize % self.trainer.async.parameterSyncStep == 0)",
        "fieldPath": ".trainer.async.parameterSyncStep",
        "message": "separate-async updates the rollout's weights every trainer.async.parameterSyncStep mini-batches, so algorithm.trainBatchSize must equal parameterSyncStep x algorithm.ppoMiniBatchSize (verl's rule; unset ppoMiniBatchSize is trainBatchSize / parameterSyncStep): change one of them",
    }, {
        "rule": "self.toolPool.replicas.min <= self.toolPool.replicas.max",
        "fieldPath": ".toolPool.replicas",
        "message": "spec.toolPool.replicas.min must be less than or equal to spec.toolPool.replicas.max",
    }, {
        "rule": "self.toolPool.targetConcurrencyPerReplica <= self.toolPool.capacityPerReplica",
        "fieldPath": ".toolPool.targetConcurrencyPerReplica",
        "message": "spec.toolPool.targetConcurrencyPerReplica must not exceed spec.toolPool.capacityPerReplica (calls a replica runs at once): raise the capacity or lower the target",
    }, {
        "rule": "self.reward.preset != 'custom' || has(self.reward.custom)",
        "fieldPath": ".reward",
        "message": "reward.preset custom needs reward.custom.configMap (a ConfigMap holding reward.py)",
    }, {
        "rule": "self.toolPool.autoscaler == oldSelf.toolPool.autoscaler",
        "fieldPath": ".toolPool.autoscaler",
        "message": "spec.toolPool.autoscaler is immutable; create a new ToolRLJob to switch between native and keda",
    }, {
        "rule": "self.cluster.workers.gpusPerWorker == oldSelf.cluster.workers.gpusPerWorker",
        "fieldPath": ".cluster.workers.gpusPerWorker",
        "message": "spec.cluster.workers.gpusPerWorker is immutable; create a new ToolRLJob to change the GPU shape",
    }, {
        "rule": "self.cluster.workers.gpusPerWorker == 0 || self.cluster.workers.gpusPerWorker % self.rollout.tensorParallelSize == 0",
        "fieldPath": ".rollout.tensorParallelSize",
        "message": "rollout.tensorParallelSize must divide cluster.workers.gpusPerWorker; change one of them",
    }, {
        "rule": "self.cluster.workers.gpusPerWorker > 0 || self.rollout.tensorParallelSize == 1",
        "fieldPath": ".rollout.tensorParallelSize",
        "message": "rollout.tensorParallelSize must be 1 when cluster.workers.gpusPerWorker is 0 (CPU)",
    }, {
        "rule": "!has(self.data.valFreq) || self.data.valFreq == -1 || (has(self.data.valFiles) && size(self.data.valFiles) > 0)",
        "fieldPath": ".data.valFreq",
        "message": "data.valFreq needs data.valFiles: it says how often to validate on them; add valFiles, or leave valFreq unset",
    }, {
        "rule": "!has(self.checkpoint.saveFreq) || self.checkpoint.saveFreq == -1 || has(self.checkpoint.volume)",
        "fieldPath": ".checkpoint.saveFreq",
        "message": "checkpoint.saveFreq needs checkpoint.volume: checkpoints are written under /checkpoints, which without a volume is not writable and is lost with the pod; add a volume (e.g. a persistentVolumeClaim), or set saveFreq to -1 (or leave it unset)",
    }, {
        "rule": "self.cluster.workers.gpusPerWorker == 0 || !has(self.cluster.workers.resources) || (has(self.cluster.workers.resources.limits) && 'cpu' in self.cluster.workers.resources.limits ? quantity(string(self.cluster.workers.resources.limits['cpu'])).asApproximateFloat() > double(3 * self.cluster.workers.gpusPerWorker + 1) : !has(self.cluster.workers.resources.requests) || !('cpu' in self.cluster.workers.resources.requests) || quantity(string(self.cluster.workers.resources.requests['cpu'])).asApproximateFloat() > double(3 * self.cluster.workers.gpusPerWorker + 1))",
        "fieldPath": ".cluster.workers.resources",
        "message": "cluster.workers.resources: a GPU worker needs 3 CPUs per GPU + 2 (verl's placement group asks each GPU for 3, one TransferQueue storage unit is pinned to every node, and verl's vLLM server actors need one free CPU to be placed; short of that the job waits forever): set the workers' cpu limit (or request, without a limit) to 3 x gpusPerWorker + 2 or more (26 for 8 GPUs), or leave cpu unset and the operator gives Ray that many",
    }, {
        "rule": "self.trainer.mode == 'separate-async' || self.rollout.gpuMemoryUtilization <= 0.85",
        "fieldPath": ".rollout.gpuMemoryUtilization",
        "message": "rollout.gpuMemoryUtilization above 0.85 leaves the training worker that shares the GPU (sync, colocate-async) too little memory, and vLLM refuses to start: use 0.85 or less (0.6 is the default)",
    }, {
        "rule": "!(self.rollout.protocol in ['tool-tags', 'python-tags']) || self.tools.exists(t, t.type == 'python')",
        "fieldPath": ".tools",
        "message": "rollout.protocol tool-tags and python-tags run code: add a tool of type python to spec.tools",
    }, {
        "rule": "!self.reward.overlongPenalty.enabled || has(self.reward.overlongPenalty.bufferLength)",
        "fieldPath": ".reward.overlongPenalty.bufferLength",
        "message": "reward.overlongPenalty.enabled needs bufferLength: the tokens before data.maxResponseLength over which the penalty grows (DAPO: 4096 of 20480), less than data.maxResponseLength",
    }, {
        "rule": "!self.reward.overlongPenalty.enabled || !has(self.reward.overlongPenalty.bufferLength) || self.reward.overlongPenalty.bufferLength < self.data.maxResponseLength",
        "fieldPath": ".reward.overlongPenalty.bufferLength",
        "message": "reward.overlongPenalty.bufferLength must be less than data.maxResponseLength: the penalty starts bufferLength tokens before the longest response, so at the whole length or more every response would be penalised from its first token (verl's dapo manager refuses more): lower bufferLength or raise data.maxResponseLength",
    }, {
        "rule": "self.reward.preset != 'code-execution' || self.tools.exists(t, t.type == 'python')",
        "fieldPath": ".tools",
        "message": "reward.preset code-execution runs code in the tool pool: add a tool of type python to spec.tools, or choose another preset",
    }],
    "properties": {
        "suspend": {
            "type": "boolean",
            "default": False,
            "description": "true stops the Ray cluster and scales the tool pool to zero; false resumes.",
        },
        "model": {
            "type": "object",
            "required": ["path"],
            "x-kubernetes-validations": [{
                "rule": "self.path == oldSelf.path",
                "message": "spec.model.path is immutable; create a new ToolRLJob to train another model",
            }],
            "properties": {
                "path": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 512,
                    "description": "Hugging Face hub id, or a path inside a mounted volume (model.cache.volume is mounted at /models, data.volume at /data).",
                },
                "cache": {
                    "type": "object",
                    "description": "Where the Ray pods keep the model's weights (HF_HOME=/models/huggingface). A volume (a ReadWriteMany claim for a multi-node job) is downloaded into once and read by every pod and attempt after it; size alone gives each Ray pod an emptyDir of that size at /models and asks the node for that much ephemeral storage. Unset: each pod downloads the weights into its container's writable layer, on every attempt.",
                    "x-kubernetes-validations": [{
                        "rule": "has(self.volume) != has(self.size)",
                        "message": "spec.model.cache: give volume (a shared cache, downloaded into once) or size (an emptyDir of that size in each Ray pod), one of them",
                    }, {
                        "rule": "!has(self.size) || quantity(string(self.size)).asApproximateFloat() >= 1048576.0",
                        "message": "spec.model.cache.size: at least 1Mi (the weights of the smallest models are tens of MiB; e.g. 20Gi for a 7B model)",
                    }],
                    "properties": {
                        "volume": {
                            "type": "object",
                            "description": "A Kubernetes volume source (e.g. persistentVolumeClaim), mounted writable at /models; not hostPath.",
                            "x-kubernetes-preserve-unknown-fields": True,
                            "properties": {
                                "hostPath": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                            "x-kubernetes-validations": [{
                                "rule": "!has(self.hostPath)",
                                "message": "hostPath volumes are not allowed (they expose the node's files to the job): use a persistentVolumeClaim",
                            }],
                        },
                        "size": {
                            "description": "The emptyDir's sizeLimit and each Ray pod's ephemeral-storage request (e.g. 20Gi for a 7B model in bf16).",
                            "anyOf": [{
                                "type": "integer",
                            }, {
                                "type": "string",
                            }],
                            "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                            "x-kubernetes-int-or-string": True,
                        },
                    },
                },
            },
        },
        "data": {
            "type": "object",
            "required": ["trainFiles"],
            "properties": {
                "trainFiles": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 64,
                    "items": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 1024,
                        "x-kubernetes-validations": [{
                            "rule": "self.endsWith('.parquet')",
                            "message": "data files must be .parquet files (prepare them with `python -m trainer_entry.data`)",
                        }],
                    },
                },
                "valFiles": {
                    "type": "array",
                    "maxItems": 64,
                    "items": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 1024,
                        "x-kubernetes-validations": [{
                            "rule": "self.endsWith('.parquet')",
                            "message": "data files must be .parquet files (prepare them with `python -m trainer_entry.data`)",
                        }],
                    },
                },
                "valFreq": {
                    "type": "integer",
                    "minimum": -1,
                    "description": "Validate on valFiles every N training steps (verl's trainer.test_freq), and before training; -1 (or unset): before training only. Needs valFiles.",
                    "x-kubernetes-validations": [{
                        "rule": "self != 0",
                        "message": "data.valFreq must be a positive step count, or -1 to validate before training only",
                    }],
                },
                "maxPromptLength": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 1024,
                },
                "maxResponseLength": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 2048,
                },
                "volume": {
                    "type": "object",
                    "description": "A Kubernetes volume source (e.g. persistentVolumeClaim), mounted at /data; not hostPath.",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {
                        "hostPath": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        },
                    },
                    "x-kubernetes-validations": [{
                        "rule": "!has(self.hostPath)",
                        "message": "hostPath volumes are not allowed (they expose the node's files to the job): use a persistentVolumeClaim",
                    }],
                },
            },
        },
        "algorithm": {
            "type": "object",
            "default": {},
            "properties": {
                "advantageEstimator": {
                    "type": "string",
                    "enum": ["grpo", "gae", "rloo", "reinforce_plus_plus", "remax", "grpo_passk", "gpg", "opo"],
                    "default": "grpo",
                    "description": "grpo, or gae (PPO with a critic), or another verl estimator",
                },
                "rolloutsPerPrompt": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 1024,
                    "default": 8,
                },
                "klLoss": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "enabled": {
                            "type": "boolean",
                            "default": True,
                        },
                        "coef": {
                            "type": "number",
                            "minimum": 0,
                            "default": 0.001,
                        },
                    },
                },
                "learningRate": {
                    "type": "number",
                    "exclusiveMinimum": True,
                    "minimum": 0,
                    "default": 1e-06,
                },
                "trainBatchSize": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 256,
                },
                "ppoMiniBatchSize": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "prompts per PPO/GRPO update (verl ppo_mini_batch_size); unset = trainBatchSize",
                },
                "totalEpochs": {
                    "type": "integer",
                    "minimum": 1,
                },
                "totalTrainingSteps": {
                    "type": "integer",
                    "minimum": 1,
                },
                "clipRatio": {
                    "type": "object",
                    "default": {},
                    "description": "PPO's clip range of the policy ratio, [1 - low, 1 + high] (verl actor.clip_ratio_low / clip_ratio_high; verl's defaults 0.2 / 0.2). DAPO's clip-higher raises high alone (0.28) so that unlikely tokens can gain probability.",
                    "properties": {
                        "low": {
                            "type": "number",
                            "minimum": 0,
                            "exclusiveMinimum": True,
                            "maximum": 1,
                            "exclusiveMaximum": True,
                            "default": 0.2,
                        },
                        "high": {
                            "type": "number",
                            "minimum": 0,
                            "exclusiveMinimum": True,
                            "maximum": 10,
                            "default": 0.2,
                        },
                    },
                },
                "lossAggregation": {
                    "type": "string",
                    "enum": ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"],
                    "default": "token-mean",
                    "description": "How the policy loss is averaged (verl actor.loss_agg_mode): token-mean (verl's default, DAPO's token-level loss: every token of the batch weighs the same), seq-mean-token-sum (each response's token sum, averaged over responses) or seq-mean-token-mean (GRPO's original: each response's token mean, averaged over responses).",
                },
                "dynamicSampling": {
                    "type": "object",
                    "default": {},
                    "description": "DAPO's dynamic sampling (verl algorithm.filter_groups): a prompt group whose rollouts all scored alike (no signal for a group-relative advantage) is dropped and a new prompt generated in its place, until the batch is full of groups that differ.",
                    "properties": {
                        "enabled": {
                            "type": "boolean",
                            "default": False,
                        },
                        "metric": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 128,
                            "default": "reward",
                            "description": "What \"scored alike\" compares: reward (the score with every penalty, verl's default), or a key the reward function returns beside its score (a reward returning a dict), e.g. acc.",
                        },
                        "maxGenerationBatches": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 1000,
                            "default": 10,
                            "description": "The run fails at a step that dropped more than this many batches' worth of groups (trainBatchSize each) without filling its batch: data the model now finds all too easy or all too hard would otherwise be generated for ever (DAPO: 10).",
                        },
                    },
                },
            },
        },
        "rollout": {
            "type": "object",
            "default": {},
            "properties": {
                "engine": {
                    "type": "string",
                    "maxLength": 16,
                    "default": "vllm",
                    "description": "The rollout engine: vllm on GPUs, or vLLM's CPU build with gpusPerWorker 0; hf generates with transformers on the actor's current weights (CPU runs of tiny models). sglang is not supported yet.",
                    "x-kubernetes-validations": [{
                        "rule": "self in ['vllm', 'hf']",
                        "message": "rollout.engine must be vllm or hf; sglang is not supported yet (the trainer image has no sglang, and sglang's server rejects the stop-string settings of the tag protocols): use vllm",
                    }],
                },
                "tensorParallelSize": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 64,
                    "default": 1,
                },
                "gpuMemoryUtilization": {
                    "type": "number",
                    "minimum": 0.05,
                    "maximum": 0.95,
                    "default": 0.6,
                },
                "protocol": {
                    "type": "string",
                    "enum": ["hermes", "tool-tags", "python-tags", "react"],
                    "default": "hermes",
                    "description": "How tool calls appear in the policy's text: hermes, <tool>...</tool>, <PYTHON>...</PYTHON> or ReAct.",
                },
                "maxToolTurns": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 64,
                    "default": 3,
                    "description": "Tool turns a trajectory may take (at least 1).",
                },
                "maxParallelCalls": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 64,
                    "default": 1,
                },
                "maxToolResponseLength": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 1024,
                },
                "toolCall": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "timeoutSeconds": {
                            "type": "number",
                            "minimum": 0.1,
                            "default": 30,
                        },
                        "maxRetries": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": 20,
                            "default": 3,
                        },
                        "retryDelaySeconds": {
                            "type": "number",
                            "minimum": 0,
                            "default": 1.0,
                        },
                        "maxConcurrency": {
                            "type": "integer",
                            "minimum": 1,
                            "default": 256,
                        },
                        "maxInfraFailureRatio": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 1,
                            "default": 0.2,
                            "description": "Circuit breaker. Trajectories whose tool call failed for the infrastructure's reason (pool unreachable, rejected after every retry, worker lost) are excluded from the update; when more than this share of a step's trajectories is excluded (or all of them), the trainer does not train on the rest: it waits for the tool pool's /readyz (with backoff, up to 10 minutes), sets the ToolPoolDegraded condition, and generates the batch again; if the pool does not recover the run fails and says so. 0.2 lets the 5-15 % of episodes that other stacks report losing during node preemptions pass, and stops a batch that a degraded pool has emptied of its tool-heavy trajectories (those are the ones a failing pool removes first). 1 trips only when nothing is left to train on; 0 on any exclusion.",
                        },
                    },
                },
            },
        },
        "tools": {
            "type": "array",
            "minItems": 1,
            "maxItems": 32,
            "x-kubernetes-validations": [{
                "rule": "self.all(t, self.filter(u, u.name == t.name).size() == 1)",
                "message": "tool names must be unique within spec.tools; rename the duplicate",
            }],
            "items": {
                "type": "object",
                "required": ["name", "type"],
                "x-kubernetes-validations": [{
                    "rule": "self.type != 'http' || has(self.url)",
                    "fieldPath": ".url",
                    "message": "a tool of type http needs url (the external endpoint it forwards to)",
                }, {
                    "rule": "self.type != 'search' || has(self.corpus)",
                    "fieldPath": ".corpus",
                    "message": "a tool of type search needs corpus (a JSONL file inside the data volume)",
                }, {
                    "rule": "!has(self.url) || self.type == 'http'",
                    "fieldPath": ".url",
                    "message": "url is only used by tools of type http; remove it or change the type",
                }, {
                    "rule": "self.type != 'function' || has(self.__function__)",
                    "fieldPath": ".function",
                    "message": "a tool of type function needs function.configMap.name (and .key): the ConfigMap holding its Python source",
                }, {
                    "rule": "self.type != 'function' || has(self.parameters)",
                    "fieldPath": ".parameters",
                    "message": "a tool of type function needs parameters, the JSON schema of its arguments: {type: object, properties: {...}, required: [...]}",
                }, {
                    "rule": "(!has(self.__function__) && !has(self.parameters)) || self.type == 'function'",
                    "message": "function and parameters are only used by tools of type function; remove them or change the type",
                }, {
                    "rule": "self.type != 'mcp' || has(self.mcp)",
                    "message": "a tool of type mcp needs mcp.url, the streamable-HTTP endpoint of an MCP server (e.g. http://my-mcp.my-namespace.svc:8000/mcp)",
                }, {
                    "rule": "!has(self.mcp) || self.type == 'mcp'",
                    "message": "mcp is only used by tools of type mcp; remove it or change the type",
                }, {
                    "rule": "!has(self.observationFormat) || self.type == 'python'",
                    "fieldPath": ".observationFormat",
                    "message": "observationFormat is only used by tools of type python (what the model reads back from its code); remove it or change the type",
                }],
                "properties": {
                    "name": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 63,
                        "x-kubernetes-validations": [{
                            "rule": "self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",
                            "message": "a tool name must be an identifier (letters, digits, _; not starting with a digit): the model calls the tool by this name",
                        }],
                        "description": "The function name the policy calls.",
                    },
                    "type": {
                        "type": "string",
                        "enum": ["python", "search", "http", "function", "mcp"],
                    },
                    "description": {
                        "type": "string",
                        "maxLength": 4096,
                    },
                    "timeoutSeconds": {
                        "type": "number",
                        "exclusiveMinimum": True,
                        "minimum": 0,
                        "maximum": 3600,
                        "default": 10,
                    },
                    "memoryLimitMiB": {
                        "type": "integer",
                        "minimum": 16,
                        "maximum": 65536,
                        "default": 512,
                    },
                    "maxOutputBytes": {
                        "type": "integer",
                        "minimum": 64,
                        "maximum": 16777216,
                        "default": 4096,
                    },
                    "corpus": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 1024,
                    },
                    "topK": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 100,
                        "default": 3,
                        "description": "Passages a search call returns when its input names no topK.",
                    },
                    "fileSizeLimitMiB": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 65536,
                        "default": 16,
                        "description": "Largest file (MiB) a python call may write.",
                    },
                    "diskLimitMiB": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 65536,
                        "default": 32,
                        "description": "Bytes (MiB) a python call or session may keep in its directory; past it the call is killed. The pool's /tmp is sized from it.",
                    },
                    "maxOpenFiles": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 65536,
                        "default": 64,
                        "description": "Files a python call may hold open at once.",
                    },
                    "maxProcesses": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 4096,
                        "default": 256,
                        "description": "Tasks (processes and threads) one python call may run at once.",
                    },
                    "observationFormat": {
                        "type": "string",
                        "enum": ["default", "sandbox-fusion"],
                        "description": "What the model reads back from a python tool's call (the trainer builds it from the pool's answer; unset means default). default: a program that exits 0 shows its stdout (its stderr only when it printed nothing to stdout); one that fails shows \"Error: \" and its stderr (its stdout dropped, shown only when stderr is empty); a timeout \"Error: the tool call timed out after 10.0s.\" (its seconds), a killed call \"Error: the tool process was killed (it exceeded a resource limit).\", and \"[output truncated]\" is appended when maxOutputBytes cut a stream. sandbox-fusion: as verl's SandboxFusionTool (ReTool's code interpreter) shows SandboxFusion's answer: the first fenced block in the code argument (```python ... ```, ```py ... ```, ``` ... ```) is what runs, and a program that ran to its end, whatever its exit code, shows its stdout directly followed by its stderr (what it printed, then the traceback); a timeout or a call the pool could not run shows \"no stdout here\". Calls the trainer refuses before running (no code argument) read as in default.",
                    },
                    "maxRetries": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": 20,
                        "default": 3,
                        "description": "Retries of an http tool's upstream call.",
                    },
                    "retryDelaySeconds": {
                        "type": "number",
                        "minimum": 0,
                        "maximum": 60,
                        "default": 0.5,
                        "description": "Base delay of an http tool's backoff between retries.",
                    },
                    "rateLimitPerSecond": {
                        "type": "number",
                        "exclusiveMinimum": True,
                        "minimum": 0,
                        "default": 50,
                        "description": "Upstream calls per second an http tool makes (per pool replica); a call waits for its turn, or is rejected if that outlasts its timeout.",
                    },
                    "url": {
                        "type": "string",
                        "maxLength": 2048,
                        "x-kubernetes-validations": [{
                            "rule": "isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",
                            "message": "url must be an absolute http:// or https:// URL",
                        }],
                    },
                    "function": {
                        "type": "object",
                        "description": "A function tool's Python source: a ConfigMap key (mounted read-only into the tool pool's pods) and the function in it the model calls.",
                        "required": ["configMap"],
                        "properties": {
                            "configMap": {
                                "type": "object",
                                "required": ["name"],
                                "properties": {
                                    "name": {
                                        "type": "string",
                                        "minLength": 1,
                                        "maxLength": 253,
                                        "description": "A ConfigMap in the job's namespace.",
                                    },
                                    "key": {
                                        "type": "string",
                                        "default": "tools.py",
                                        "maxLength": 253,
                                        "pattern": "^[-._a-zA-Z0-9]+$",
                                        "description": "The ConfigMap key holding the Python source.",
                                    },
                                },
                            },
                            "name": {
                                "type": "string",
                                "maxLength": 253,
                                "description": "The function to call, defined at the top level of the source; the tool's name when unset.",
                                "x-kubernetes-validations": [{
                                    "rule": "self.matches('^[A-Za-z_][A-Za-z0-9_]*$')",
                                    "message": "function.name must be a Python identifier: the name of a function defined at the top level of the source",
                                }],
                            },
                        },
                    },
                    "mcp": {
                        "type": "object",
                        "description": "A remote MCP server whose tools the pool serves, each as <tool name>__<remote tool name>: the pool lists them at start (not ready until the server answers) and proxies each call with this tool's timeoutSeconds, maxRetries and retryDelaySeconds.",
                        "required": ["url"],
                        "properties": {
                            "url": {
                                "type": "string",
                                "maxLength": 2048,
                                "description": "The server's streamable-HTTP endpoint, e.g. http://my-mcp.my-namespace.svc:8000/mcp.",
                                "x-kubernetes-validations": [{
                                    "rule": "isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",
                                    "message": "mcp.url must be an absolute http:// or https:// URL: the MCP server's streamable-HTTP endpoint, e.g. http://my-mcp.my-namespace.svc:8000/mcp",
                                }],
                            },
                            "tools": {
                                "type": "array",
                                "maxItems": 128,
                                "x-kubernetes-list-type": "set",
                                "description": "The remote tools to serve, by their names on the server; all of them when unset.",
                                "items": {
                                    "type": "string",
                                    "maxLength": 128,
                                    "x-kubernetes-validations": [{
                                        "rule": "self.matches('^[A-Za-z0-9_.-]+$')",
                                        "message": "mcp.tools names a remote tool as the server lists it: letters, digits, _, - and . (MCP's tool names)",
                                    }],
                                },
                            },
                            "podSelector": {
                                "type": "object",
                                "maxProperties": 16,
                                "additionalProperties": {
                                    "type": "string",
                                    "maxLength": 63,
                                },
                                "description": "Labels of the server's pods: the pool's NetworkPolicy then admits egress to those pods only (else to every pod of the Service's namespace on the port).",
                            },
                            "targetPort": {
                                "type": "integer",
                                "minimum": 1,
                                "maximum": 65535,
                                "description": "The port the server's pods listen on, when the Service maps mcp.url's port to another (NetworkPolicy matches the pods' port).",
                            },
                        },
                    },
                    "parameters": {
                        "type": "object",
                        "description": "A function tool's arguments as a JSON schema of an object (the function's keyword arguments); the model sees it, the pool checks each call against it. The function's keyword-only parameters (after *) are not listed: they take the row's per-sample values (extra_info.tools_kwargs.<tool>.create_kwargs), never the model's.",
                        "required": ["type", "properties"],
                        "x-kubernetes-preserve-unknown-fields": True,
                        "x-kubernetes-validations": [{
                            "rule": "!has(self.required) || self.required.all(r, r in self.properties)",
                            "message": "every name in parameters.required must be a key of parameters.properties; add the property or drop the name",
                        }],
                        "properties": {
                            "type": {
                                "type": "string",
                                "enum": ["object"],
                                "description": "Always object: the model's arguments are a JSON object of keyword arguments.",
                            },
                            "properties": {
                                "type": "object",
                                "maxProperties": 64,
                                "description": "One JSON schema per argument; each names its type (string, integer, number, boolean, array, object).",
                                "additionalProperties": {
                                    "type": "object",
                                    "required": ["type"],
                                    "x-kubernetes-preserve-unknown-fields": True,
                                },
                            },
                            "required": {
                                "type": "array",
                                "maxItems": 64,
                                "items": {
                                    "type": "string",
                                    "maxLength": 253,
                                },
                            },
                        },
                    },
                },
            },
        },
        "toolPool": {
            "type": "object",
            "default": {},
            "properties": {
                "image": {
                    "type": "string",
                    "description": "Tool-sandbox image; the operator's default when empty.",
                },
                "replicas": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "min": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 1000,
                            "default": 2,
                            "description": "At least 1: the trainer waits for a ready tool pool (suspend the job to scale the pool to 0).",
                        },
                        "max": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 1000,
                            "default": 64,
                        },
                    },
                },
                "autoscaler": {
                    "type": "string",
                    "enum": ["native", "keda"],
                    "default": "native",
                    "description": "native: the operator sizes the pool (rollout-aware); keda: a KEDA ScaledObject does (needs KEDA and the operator's Prometheus URL).",
                },
                "targetConcurrencyPerReplica": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 16,
                },
                "capacityPerReplica": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 1024,
                    "default": 32,
                    "description": "Calls one replica runs at once (more wait in its queue, then get 429).",
                },
                "maxSessionsPerReplica": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 4096,
                    "default": 64,
                    "description": "Live stateful sessions (multi-turn code) one replica keeps; more get 429.",
                },
                "requireLandlock": {
                    "type": "boolean",
                    "default": True,
                    "description": "Pods stay unready on nodes whose kernel lacks Landlock (file-system confinement of sandboxed code). false: serve there too, relying on the non-root uid and the read-only root file system.",
                },
                "scaleDownDelaySeconds": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 120,
                },
                "rolloutAware": {
                    "type": "boolean",
                    "default": True,
                },
                "runtimeClassName": {
                    "type": "string",
                    "maxLength": 253,
                    "description": "Optional RuntimeClass (e.g. gvisor) for stronger isolation where the cluster has it.",
                },
                "nodeSelector": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "string",
                    },
                    "description": "Where pool pods may run (they need no GPU; keep them off GPU nodes).",
                },
                "tolerations": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    },
                },
                "affinity": {
                    "type": "object",
                    "description": "A pod affinity (nodeAffinity, podAffinity, podAntiAffinity), as in a pod spec.",
                    "x-kubernetes-preserve-unknown-fields": True,
                },
                "topologySpreadConstraints": {
                    "type": "array",
                    "description": "As in a pod spec; labelSelector may select app.kubernetes.io/component=tool-pool and toolrl.dev/job.",
                    "items": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    },
                },
                "imagePullSecrets": {
                    "type": "array",
                    "description": "Secrets (in the job's namespace) with registry credentials for the images.",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": 253,
                            },
                        },
                    },
                },
                "resources": {
                    "type": "object",
                    "properties": {
                        "requests": {
                            "type": "object",
                            "maxProperties": 32,
                            "additionalProperties": {
                                "anyOf": [{
                                    "type": "integer",
                                }, {
                                    "type": "string",
                                }],
                                "x-kubernetes-int-or-string": True,
                                "maxLength": 64,
                                "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                            },
                        },
                        "limits": {
                            "type": "object",
                            "maxProperties": 32,
                            "additionalProperties": {
                                "anyOf": [{
                                    "type": "integer",
                                }, {
                                    "type": "string",
                                }],
                                "x-kubernetes-int-or-string": True,
                                "maxLength": 64,
                                "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                            },
                        },
                    },
                },
            },
        },
        "reward": {
            "type": "object",
            "default": {},
            "properties": {
                "preset": {
                    "type": "string",
                    "enum": ["code-execution", "exact-match", "math", "toolbench", "custom"],
                    "default": "code-execution",
                    "description": "code-execution (runs the answer's code in the tool pool), exact-match (GSM8K's final number), math (the last \\boxed{...} of the answer against the ground truth, normalised, as verl's math_dapo verifies: 1 or 0), toolbench (the calls of a StableToolBench trajectory), or custom (a function from a ConfigMap).",
                },
                "overlongPenalty": {
                    "type": "object",
                    "default": {},
                    "description": "DAPO's overlong penalty (verl's dapo reward manager, reward.reward_kwargs.overlong_buffer_cfg): a response longer than data.maxResponseLength - bufferLength tokens loses penaltyFactor x (its excess / bufferLength) of its score, up to penaltyFactor at maxResponseLength. verl's dapo manager hands a custom reward function the row's extra_info alone (no num_turns, raw_prompt or the tool loop's records, which the default manager adds).",
                    "properties": {
                        "enabled": {
                            "type": "boolean",
                            "default": False,
                        },
                        "bufferLength": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "Tokens before data.maxResponseLength where the penalty grows from 0 (DAPO: 4096 of 20480).",
                        },
                        "penaltyFactor": {
                            "type": "number",
                            "minimum": 0,
                            "exclusiveMinimum": True,
                            "default": 1.0,
                            "description": "The penalty at data.maxResponseLength (DAPO: 1.0).",
                        },
                    },
                },
                "toolbench": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "formatWeight": {
                            "type": "number",
                            "default": 0.1,
                        },
                        "functionCallWeight": {
                            "type": "number",
                            "default": 0.2,
                        },
                        "finishWeight": {
                            "type": "number",
                            "default": 0.3,
                        },
                        "errorPenalty": {
                            "type": "number",
                            "default": -0.5,
                        },
                        "finishBonus": {
                            "type": "number",
                            "default": 0.5,
                        },
                    },
                },
                "custom": {
                    "type": "object",
                    "required": ["configMap"],
                    "properties": {
                        "configMap": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 253,
                        },
                        "key": {
                            "type": "string",
                            "default": "reward.py",
                            "maxLength": 253,
                            "pattern": "^[-._a-zA-Z0-9]+$",
                            "description": "The ConfigMap key holding the reward module (mounted at /etc/toolrl/reward/<key>).",
                        },
                        "function": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 253,
                            "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                            "default": "compute_score",
                            "description": "The reward module's function: a Python name.",
                        },
                    },
                },
            },
        },
        "cluster": {
            "type": "object",
            "default": {},
            "properties": {
                "image": {
                    "type": "string",
                    "description": "Trainer image (verl + vLLM); the operator's default when empty.",
                },
                "head": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "resources": {
                            "type": "object",
                            "properties": {
                                "requests": {
                                    "type": "object",
                                    "maxProperties": 32,
                                    "additionalProperties": {
                                        "anyOf": [{
                                            "type": "integer",
                                        }, {
                                            "type": "string",
                                        }],
                                        "x-kubernetes-int-or-string": True,
                                        "maxLength": 64,
                                        "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                                    },
                                },
                                "limits": {
                                    "type": "object",
                                    "maxProperties": 32,
                                    "additionalProperties": {
                                        "anyOf": [{
                                            "type": "integer",
                                        }, {
                                            "type": "string",
                                        }],
                                        "x-kubernetes-int-or-string": True,
                                        "maxLength": 64,
                                        "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                                    },
                                },
                            },
                        },
                        "nodeSelector": {
                            "type": "object",
                            "additionalProperties": {
                                "type": "string",
                            },
                        },
                        "tolerations": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                        "affinity": {
                            "type": "object",
                            "description": "A pod affinity (nodeAffinity, podAffinity, podAntiAffinity), as in a pod spec. Every Ray pod of the job carries toolrl.dev/job and app.kubernetes.io/component=trainer (and KubeRay's ray.io/node-type): a podAntiAffinity on them with matchLabelKeys [toolrl.dev/job] spreads the job's Ray pods over machines (examples/toolrljob-cpu.yaml).",
                            "x-kubernetes-preserve-unknown-fields": True,
                        },
                        "runtimeClassName": {
                            "type": "string",
                            "maxLength": 253,
                            "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                            "description": "RuntimeClass of this group's pods (e.g. nvidia, where the GPU nodes' container runtime is not the default); empty: the cluster's default.",
                        },
                    },
                },
                "workers": {
                    "type": "object",
                    "default": {},
                    "properties": {
                        "replicas": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 512,
                            "default": 1,
                        },
                        "gpusPerWorker": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": 16,
                            "default": 8,
                            "description": "GPUs per Ray worker; 0 runs on CPUs only (needs rollout.engine vllm or hf).",
                        },
                        "resources": {
                            "type": "object",
                            "properties": {
                                "requests": {
                                    "type": "object",
                                    "maxProperties": 32,
                                    "additionalProperties": {
                                        "anyOf": [{
                                            "type": "integer",
                                        }, {
                                            "type": "string",
                                        }],
                                        "x-kubernetes-int-or-string": True,
                                        "maxLength": 64,
                                        "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                                    },
                                },
                                "limits": {
                                    "type": "object",
                                    "maxProperties": 32,
                                    "additionalProperties": {
                                        "anyOf": [{
                                            "type": "integer",
                                        }, {
                                            "type": "string",
                                        }],
                                        "x-kubernetes-int-or-string": True,
                                        "maxLength": 64,
                                        "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                                    },
                                },
                            },
                        },
                        "nodeSelector": {
                            "type": "object",
                            "additionalProperties": {
                                "type": "string",
                            },
                        },
                        "tolerations": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                        "affinity": {
                            "type": "object",
                            "description": "A pod affinity (nodeAffinity, podAffinity, podAntiAffinity), as in a pod spec. Every Ray pod of the job carries toolrl.dev/job and app.kubernetes.io/component=trainer (and KubeRay's ray.io/node-type): a podAntiAffinity on them with matchLabelKeys [toolrl.dev/job] spreads the job's Ray pods over machines (examples/toolrljob-cpu.yaml).",
                            "x-kubernetes-preserve-unknown-fields": True,
                        },
                        "runtimeClassName": {
                            "type": "string",
                            "maxLength": 253,
                            "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                            "description": "RuntimeClass of this group's pods (e.g. nvidia, where the GPU nodes' container runtime is not the default); empty: the cluster's default.",
                        },
                    },
                },
                "rolloutWorkers": {
                    "type": "object",
                    "required": ["gpusPerWorker"],
                    "description": "trainer.mode separate-async only: the worker group that generates (verl's standalone rollout pool), beside cluster.workers, which train. Its own replicas, GPUs and scheduling; gpusPerWorker 0 on CPUs (then cluster.workers too).",
                    "properties": {
                        "replicas": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 512,
                            "default": 1,
                        },
                        "gpusPerWorker": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": 16,
                            "description": "GPUs per rollout worker; 0 runs on CPUs (one logical GPU each).",
                        },
                        "resources": {
                            "type": "object",
                            "properties": {
                                "requests": {
                                    "type": "object",
                                    "maxProperties": 32,
                                    "additionalProperties": {
                                        "anyOf": [{
                                            "type": "integer",
                                        }, {
                                            "type": "string",
                                        }],
                                        "x-kubernetes-int-or-string": True,
                                        "maxLength": 64,
                                        "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                                    },
                                },
                                "limits": {
                                    "type": "object",
                                    "maxProperties": 32,
                                    "additionalProperties": {
                                        "anyOf": [{
                                            "type": "integer",
                                        }, {
                                            "type": "string",
                                        }],
                                        "x-kubernetes-int-or-string": True,
                                        "maxLength": 64,
                                        "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                                    },
                                },
                            },
                        },
                        "nodeSelector": {
                            "type": "object",
                            "additionalProperties": {
                                "type": "string",
                            },
                        },
                        "tolerations": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                        "affinity": {
                            "type": "object",
                            "description": "A pod affinity (nodeAffinity, podAffinity, podAntiAffinity), as in a pod spec. Every Ray pod of the job carries toolrl.dev/job and app.kubernetes.io/component=trainer (and KubeRay's ray.io/node-type): a podAntiAffinity on them with matchLabelKeys [toolrl.dev/job] spreads the job's Ray pods over machines (examples/toolrljob-cpu.yaml).",
                            "x-kubernetes-preserve-unknown-fields": True,
                        },
                        "runtimeClassName": {
                            "type": "string",
                            "maxLength": 253,
                            "pattern": "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                            "description": "RuntimeClass of this group's pods (e.g. nvidia, where the GPU nodes' container runtime is not the default); empty: the cluster's default.",
                        },
                    },
                },
                "queueName": {
                    "type": "string",
                    "default": "",
                    "maxLength": 63,
                    "description": "Kueue LocalQueue; passed to the RayJob as the label kueue.x-k8s.io/queue-name.",
                },
                "env": {
                    "type": "array",
                    "maxItems": 256,
                    "description": "Environment of the Ray containers (head and workers), as a container's env: values, or valueFrom a Secret (HF_TOKEN, WANDB_API_KEY) or ConfigMap. Overrides the NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME defaults (eth0).",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "x-kubernetes-preserve-unknown-fields": True,
                        "properties": {
                            "name": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": 253,
                            },
                        },
                        "x-kubernetes-validations": [{
                            "rule": "!self.name.startsWith('TOOLRL_')",
                            "message": "cluster.env names starting with TOOLRL_ are set by the operator (the trainer's contract); choose another name",
                        }],
                    },
                },
                "envFrom": {
                    "type": "array",
                    "maxItems": 64,
                    "description": "Secrets and ConfigMaps whose keys become environment variables of the Ray containers, as a container's envFrom.",
                    "items": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    },
                },
                "imagePullSecrets": {
                    "type": "array",
                    "description": "Secrets (in the job's namespace) with registry credentials for the images.",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": 253,
                            },
                        },
                    },
                },
                "priorityClassName": {
                    "type": "string",
                    "maxLength": 253,
                    "description": "PriorityClass of the Ray pods (preemption and scheduling order on shared clusters).",
                },
                "podLabels": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "string",
                    },
                    "description": "Extra labels of the Ray pods (e.g. for cost allocation or policy selectors).",
                    "x-kubernetes-validations": [{
                        "rule": "!self.exists(k, k in ['app.kubernetes.io/managed-by', 'app.kubernetes.io/component', 'toolrl.dev/job'])",
                        "message": "cluster.podLabels may not set app.kubernetes.io/managed-by, app.kubernetes.io/component or toolrl.dev/job: the operator selects its pods by them",
                    }],
                },
                "podAnnotations": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "string",
                    },
                    "description": "Extra annotations of the Ray pods.",
                },
                "serviceAccountName": {
                    "type": "string",
                    "maxLength": 253,
                    "description": "A ServiceAccount of the job's namespace for the Ray pods (e.g. a cloud storage identity); the operator also lets it report the job's progress. Empty: the operator's per-job account, on the head only.",
                },
                "shmSize": {
                    "anyOf": [{
                        "type": "integer",
                    }, {
                        "type": "string",
                    }],
                    "x-kubernetes-int-or-string": True,
                    "pattern": "^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$",
                    "description": "Size limit of /dev/shm (memory-backed) in the Ray pods, e.g. 16Gi; it counts against the pod's memory. Empty: no limit of its own.",
                },
            },
        },
        "checkpoint": {
            "type": "object",
            "default": {},
            "properties": {
                "volume": {
                    "type": "object",
                    "description": "A Kubernetes volume source (e.g. persistentVolumeClaim), mounted at /checkpoints; not hostPath.",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {
                        "hostPath": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        },
                    },
                    "x-kubernetes-validations": [{
                        "rule": "!has(self.hostPath)",
                        "message": "hostPath volumes are not allowed (they expose the node's files to the job): use a persistentVolumeClaim",
                    }],
                },
                "saveFreq": {
                    "type": "integer",
                    "minimum": -1,
                    "description": "Save every N steps; -1 never. Unset: every 20 steps with a checkpoint volume, never without one. Needs checkpoint.volume (checkpoints go to /checkpoints, which only a volume makes writable and keeps beyond the pod).",
                    "x-kubernetes-validations": [{
                        "rule": "self != 0",
                        "message": "checkpoint.saveFreq must be a positive step count, or -1 to never save",
                    }],
                },
                "maxToKeep": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 1000,
                    "description": "Checkpoints kept on the volume, the newest; older ones are deleted after each save (verl's trainer.max_actor_ckpt_to_keep and max_critic_ckpt_to_keep). Unset: all are kept (a 3B model's checkpoint is ~45 GB).",
                },
                "resume": {
                    "type": "string",
                    "default": "auto",
                    "maxLength": 1024,
                    "x-kubernetes-validations": [{
                        "rule": "self in ['auto', 'disable'] || self.startsWith('/')",
                        "message": "checkpoint.resume must be auto, disable, or an absolute path to a checkpoint",
                    }],
                },
            },
        },
        "trainer": {
            "type": "object",
            "default": {},
            "properties": {
                "mode": {
                    "type": "string",
                    "enum": ["sync", "colocate-async", "separate-async"],
                    "maxLength": 32,
                    "default": "sync",
                    "description": "sync: every step generates its batch, then trains on it. colocate-async: the rollouts of the next steps go on while a step trains (on the same workers; generation pauses for the update and resumes on the new weights), so a step may train on samples from older weights, up to trainer.async.maxPolicyVersions. separate-async: rollouts run all the time on their own workers (cluster.rolloutWorkers), which take the new weights every trainer.async.parameterSyncStep mini-batches (partial rollouts continue on them).",
                },
                "async": {
                    "type": "object",
                    "default": {},
                    "description": "The asynchronous modes' settings (trainer.mode colocate-async, separate-async); sync ignores them.",
                    "properties": {
                        "parameterSyncStep": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 64,
                            "default": 1,
                            "description": "separate-async: mini-batches trained between two weight syncs to the rollout workers (verl's parameter_sync_step; its own default is 4). trainBatchSize must equal parameterSyncStep x ppoMiniBatchSize.",
                        },
                        "warmupBatches": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 16,
                            "default": 1,
                            "description": "Batches of prompts sent to the rollouts before the first step, beyond each step's own: how far generation runs ahead of training (fractions allowed: 0.5 is half a batch).",
                        },
                        "maxPolicyVersions": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": 64,
                            "default": 8,
                            "description": "The most policy versions one trained sample may span: 1 trains only on samples of the current weights, 2 also on those begun one update earlier. A sample past it is handled as onStale says.",
                        },
                        "onStale": {
                            "type": "string",
                            "enum": ["drop", "wait"],
                            "default": "drop",
                            "description": "drop: a finished sample past maxPolicyVersions is thrown away and its prompt replaced; wait: a step waits for in-flight samples that reach maxPolicyVersions to finish, and trains on them (nothing is dropped).",
                        },
                    },
                },
                "loggers": {
                    "type": "array",
                    "description": "verl's tracking backends (trainer.logger). Credentials come from cluster.env / envFrom (e.g. WANDB_API_KEY, MLFLOW_TRACKING_URI). The Prometheus metrics on :9400 are always on.",
                    "default": ["console"],
                    "maxItems": 4,
                    "x-kubernetes-list-type": "set",
                    "items": {
                        "type": "string",
                        "enum": ["console", "wandb", "mlflow", "tensorboard"],
                    },
                },
                "extraArgs": {
                    "type": "array",
                    "maxItems": 128,
                    "description": "Raw verl (Hydra) overrides, the escape hatch.",
                    "items": {
                        "type": "string",
                        "maxLength": 1024,
                        "x-kubernetes-validations": [{
                            "rule": "self.matches('^[+]{0,2}[A-Za-z0-9_.-]+=')",
                            "message": "each trainer.extraArgs entry must be a Hydra override like trainer.val_before_train=false (+key=value adds a key)",
                        }],
                    },
                },
            },
        },
        "runPolicy": {
            "type": "object",
            "default": {},
            "properties": {
                "backoffLimit": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 100,
                    "default": 0,
                    "description": "Retries of a failed attempt; each resumes from the last checkpoint (checkpoint.resume: auto).",
                },
                "activeDeadlineSeconds": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 0,
                    "description": "Seconds the job may run before it is stopped; 0 means no deadline.",
                },
                "ttlSecondsAfterFinished": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 300,
                    "description": "Seconds KubeRay keeps the finished job's Ray cluster (its pods, for kubectl exec) before deleting it; the job, its RayJob and the submitter Job's log (the trainer's output) stay until the job is deleted.",
                },
                "pendingDeadlineSeconds": {
                    "type": "integer",
                    "minimum": 0,
                    "default": 0,
                    "description": "Seconds the job may take to start running (Ray cluster up, job submitted) before it fails with PreRunningDeadlineExceeded; 0 means no deadline. KubeRay's preRunningDeadlineSeconds.",
                },
                "placementTimeoutSeconds": {
                    "type": "integer",
                    "minimum": 10,
                    "maximum": 86400,
                    "default": 600,
                    "description": "Seconds one of verl's placement groups may stay pending once the trainer runs (verl itself waits with no timeout, holding the GPUs it placed); past it the attempt ends with a PlacementPending Event that says what is missing. Raise it when an autoscaler adds nodes slowly.",
                },
            },
        },
    },
}
"""The storage version's openAPIV3Schema of `spec`, verbatim (k8s extensions included)."""
