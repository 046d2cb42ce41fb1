# ruff: noqa: E501
"""The ToolRLJob CRD's `spec` as pydantic models: one class per object, attributes in
snake_case aliased to the CRD's camelCase, the CRD's defaults, enums and bounds.

GENERATED from crds/toolrl.dev_toolrljobs.yaml by `make chart-generate`
(charts/chartgen/spec_types.py): do not edit; change the CRD and regenerate.
`make chart-check` fails while this file is stale.
"""

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Object(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelCache(_Object):
    """`spec.model.cache`."""

    volume: dict[str, Any] | None = Field(default=None, alias="volume")
    size: int | str | None = Field(default=None, alias="size")


class Model(_Object):
    """`spec.model`."""

    path: str = Field(alias="path", max_length=512)
    cache: ModelCache | None = Field(default=None, alias="cache")


class Data(_Object):
    """`spec.data`."""

    train_files: list[str] = Field(alias="trainFiles")
    val_files: list[str] | None = Field(default=None, alias="valFiles")
    val_freq: int | None = Field(default=None, alias="valFreq", ge=-1)
    max_prompt_length: int = Field(default=1024, alias="maxPromptLength", ge=1)
    max_response_length: int = Field(default=2048, alias="maxResponseLength", ge=1)
    volume: dict[str, Any] | None = Field(default=None, alias="volume")


class AlgorithmKlLoss(_Object):
    """`spec.algorithm.klLoss`."""

    enabled: bool = Field(default=True, alias="enabled")
    coef: int | float = Field(default=0.001, alias="coef", ge=0)


class AlgorithmClipRatio(_Object):
    """`spec.algorithm.clipRatio`."""

    low: int | float = Field(default=0.2, alias="low", ge=0, le=1)
    high: int | float = Field(default=0.2, alias="high", ge=0, le=10)


class AlgorithmDynamicSampling(_Object):
    """`spec.algorithm.dynamicSampling`."""

    enabled: bool = Field(default=False, alias="enabled")
    metric: str = Field(default="reward", alias="metric", max_length=128)
    max_generation_batches: int = Field(default=10, alias="maxGenerationBatches", ge=1, le=1000)


class Algorithm(_Object):
    """`spec.algorithm`."""

    advantage_estimator: Literal["grpo", "gae", "rloo", "reinforce_plus_plus", "remax", "grpo_passk", "gpg", "opo"] = Field(default="grpo", alias="advantageEstimator")
    rollouts_per_prompt: int = Field(default=8, alias="rolloutsPerPrompt", ge=1, le=1024)
    kl_loss: AlgorithmKlLoss = Field(default_factory=AlgorithmKlLoss, alias="klLoss")
    learning_rate: int | float = Field(default=1e-06, alias="learningRate", ge=0)
    train_batch_size: int = Field(default=256, alias="trainBatchSize", ge=1)
    ppo_mini_batch_size: int | None = Field(default=None, alias="ppoMiniBatchSize", ge=1)
    total_epochs: int | None = Field(default=None, alias="totalEpochs", ge=1)
    total_training_steps: int | None = Field(default=None, alias="totalTrainingSteps", ge=1)
    clip_ratio: AlgorithmClipRatio = Field(default_factory=AlgorithmClipRatio, alias="clipRatio")
    loss_aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = Field(default="token-mean", alias="lossAggregation")
    dynamic_sampling: AlgorithmDynamicSampling = Field(default_factory=AlgorithmDynamicSampling, alias="dynamicSampling")


class RolloutToolCall(_Object):
    """`spec.rollout.toolCall`."""

    timeout_seconds: int | float = Field(default=30, alias="timeoutSeconds", ge=0.1)
    max_retries: int = Field(default=3, alias="maxRetries", ge=0, le=20)
    retry_delay_seconds: int | float = Field(default=1.0, alias="retryDelaySeconds", ge=0)
    max_concurrency: int = Field(default=256, alias="maxConcurrency", ge=1)
    max_infra_failure_ratio: int | float = Field(default=0.2, alias="maxInfraFailureRatio", ge=0, le=1)


class Rollout(_Object):
    """`spec.rollout`."""

    engine: str = Field(default="vllm", alias="engine", max_length=16)
    tensor_parallel_size: int = Field(default=1, alias="tensorParallelSize", ge=1, le=64)
    gpu_memory_utilization: int | float = Field(default=0.6, alias="gpuMemoryUtilization", ge=0.05, le=0.95)
    protocol: Literal["hermes", "tool-tags", "python-tags", "react"] = Field(default="hermes", alias="protocol")
    max_tool_turns: int = Field(default=3, alias="maxToolTurns", ge=1, le=64)
    max_parallel_calls: int = Field(default=1, alias="maxParallelCalls", ge=1, le=64)
    max_tool_response_length: int = Field(default=1024, alias="maxToolResponseLength", ge=1)
    tool_call: RolloutToolCall = Field(default_factory=RolloutToolCall, alias="toolCall")


class ToolFunctionConfigMap(_Object):
    """`spec.tools[].function.configMap`."""

    name: str = Field(alias="name", max_length=253)
    key: str = Field(default="tools.py", alias="key", max_length=253, pattern="^[-._a-zA-Z0-9]+$")


class ToolFunction(_Object):
    """`spec.tools[].function`."""

    config_map: ToolFunctionConfigMap = Field(alias="configMap")
    name: str | None = Field(default=None, alias="name", max_length=253)


class ToolMcp(_Object):
    """`spec.tools[].mcp`."""

    url: str = Field(alias="url", max_length=2048)
    tools: list[str] | None = Field(default=None, alias="tools")
    pod_selector: dict[str, str] | None = Field(default=None, alias="podSelector")
    target_port: int | None = Field(default=None, alias="targetPort", ge=1, le=65535)


class Tool(_Object):
    """`spec.tools[]`."""

    name: str = Field(alias="name", max_length=63)
    type: Literal["python", "search", "http", "function", "mcp"] = Field(alias="type")
    description: str | None = Field(default=None, alias="description", max_length=4096)
    timeout_seconds: int | float = Field(default=10, alias="timeoutSeconds", ge=0, le=3600)
    memory_limit_mib: int = Field(default=512, alias="memoryLimitMiB", ge=16, le=65536)
    max_output_bytes: int = Field(default=4096, alias="maxOutputBytes", ge=64, le=16777216)
    corpus: str | None = Field(default=None, alias="corpus", max_length=1024)
    top_k: int = Field(default=3, alias="topK", ge=1, le=100)
    file_size_limit_mib: int = Field(default=16, alias="fileSizeLimitMiB", ge=1, le=65536)
    disk_limit_mib: int = Field(default=32, alias="diskLimitMiB", ge=1, le=65536)
    max_open_files: int = Field(default=64, alias="maxOpenFiles", ge=1, le=65536)
    max_processes: int = Field(default=256, alias="maxProcesses", ge=1, le=4096)
    observation_format: Literal["default", "sandbox-fusion"] | None = Field(default=None, alias="observationFormat")
    max_retries: int = Field(default=3, alias="maxRetries", ge=0, le=20)
    retry_delay_seconds: int | float = Field(default=0.5, alias="retryDelaySeconds", ge=0, le=60)
    rate_limit_per_second: int | float = Field(default=50, alias="rateLimitPerSecond", ge=0)
    url: str | None = Field(default=None, alias="url", max_length=2048)
    function: ToolFunction | None = Field(default=None, alias="function")
    mcp: ToolMcp | None = Field(default=None, alias="mcp")
    parameters: dict[str, Any] | None = Field(default=None, alias="parameters")


class ToolPoolReplicas(_Object):
    """`spec.toolPool.replicas`."""

    min: int = Field(default=2, alias="min", ge=1, le=1000)
    max: int = Field(default=64, alias="max", ge=1, le=1000)


class ToolPool(_Object):
    """`spec.toolPool`."""

    image: str | None = Field(default=None, alias="image")
    replicas: ToolPoolReplicas = Field(default_factory=ToolPoolReplicas, alias="replicas")
    autoscaler: Literal["native", "keda"] = Field(default="native", alias="autoscaler")
    target_concurrency_per_replica: int = Field(default=16, alias="targetConcurrencyPerReplica", ge=1)
    capacity_per_replica: int = Field(default=32, alias="capacityPerReplica", ge=1, le=1024)
    max_sessions_per_replica: int = Field(default=64, alias="maxSessionsPerReplica", ge=1, le=4096)
    require_landlock: bool = Field(default=True, alias="requireLandlock")
    scale_down_delay_seconds: int = Field(default=120, alias="scaleDownDelaySeconds", ge=0)
    rollout_aware: bool = Field(default=True, alias="rolloutAware")
    runtime_class_name: str | None = Field(default=None, alias="runtimeClassName", max_length=253)
    node_selector: dict[str, str] | None = Field(default=None, alias="nodeSelector")
    tolerations: list[dict[str, Any]] | None = Field(default=None, alias="tolerations")
    affinity: dict[str, Any] | None = Field(default=None, alias="affinity")
    topology_spread_constraints: list[dict[str, Any]] | None = Field(default=None, alias="topologySpreadConstraints")
    image_pull_secrets: list[dict[str, Any]] | None = Field(default=None, alias="imagePullSecrets")
    resources: dict[str, Any] | None = Field(default=None, alias="resources")


class RewardOverlongPenalty(_Object):
    """`spec.reward.overlongPenalty`."""

    enabled: bool = Field(default=False, alias="enabled")
    buffer_length: int | None = Field(default=None, alias="bufferLength", ge=1)
    penalty_factor: int | float = Field(default=1.0, alias="penaltyFactor", ge=0)


class RewardToolbench(_Object):
    """`spec.reward.toolbench`."""

    format_weight: int | float = Field(default=0.1, alias="formatWeight")
    function_call_weight: int | float = Field(default=0.2, alias="functionCallWeight")
    finish_weight: int | float = Field(default=0.3, alias="finishWeight")
    error_penalty: int | float = Field(default=-0.5, alias="errorPenalty")
    finish_bonus: int | float = Field(default=0.5, alias="finishBonus")


class RewardCustom(_Object):
    """`spec.reward.custom`."""

    config_map: str = Field(alias="configMap", max_length=253)
    key: str = Field(default="reward.py", alias="key", max_length=253, pattern="^[-._a-zA-Z0-9]+$")
    function: str = Field(default="compute_score", alias="function", max_length=253, pattern="^[A-Za-z_][A-Za-z0-9_]*$")


class Reward(_Object):
    """`spec.reward`."""

    preset: Literal["code-execution", "exact-match", "math", "toolbench", "custom"] = Field(default="code-execution", alias="preset")
    overlong_penalty: RewardOverlongPenalty = Field(default_factory=RewardOverlongPenalty, alias="overlongPenalty")
    toolbench: RewardToolbench = Field(default_factory=RewardToolbench, alias="toolbench")
    custom: RewardCustom | None = Field(default=None, alias="custom")


class ClusterHead(_Object):
    """`spec.cluster.head`."""

    resources: dict[str, Any] | None = Field(default=None, alias="resources")
    node_selector: dict[str, str] | None = Field(default=None, alias="nodeSelector")
    tolerations: list[dict[str, Any]] | None = Field(default=None, alias="tolerations")
    affinity: dict[str, Any] | None = Field(default=None, alias="affinity")
    runtime_class_name: str | None = Field(default=None, alias="runtimeClassName", max_length=253, pattern="^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class ClusterWorkers(_Object):
    """`spec.cluster.workers`."""

    replicas: int = Field(default=1, alias="replicas", ge=1, le=512)
    gpus_per_worker: int = Field(default=8, alias="gpusPerWorker", ge=0, le=16)
    resources: dict[str, Any] | None = Field(default=None, alias="resources")
    node_selector: dict[str, str] | None = Field(default=None, alias="nodeSelector")
    tolerations: list[dict[str, Any]] | None = Field(default=None, alias="tolerations")
    affinity: dict[str, Any] | None = Field(default=None, alias="affinity")
    runtime_class_name: str | None = Field(default=None, alias="runtimeClassName", max_length=253, pattern="^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class ClusterRolloutWorkers(_Object):
    """`spec.cluster.rolloutWorkers`."""

    replicas: int = Field(default=1, alias="replicas", ge=1, le=512)
    gpus_per_worker: int = Field(alias="gpusPerWorker", ge=0, le=16)
    resources: dict[str, Any] | None = Field(default=None, alias="resources")
    node_selector: dict[str, str] | None = Field(default=None, alias="nodeSelector")
    tolerations: list[dict[str, Any]] | None = Field(default=None, alias="tolerations")
    affinity: dict[str, Any] | None = Field(default=None, alias="affinity")
    runtime_class_name: str | None = Field(default=None, alias="runtimeClassName", max_length=253, pattern="^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class Cluster(_Object):
    """`spec.cluster`."""

    image: str | None = Field(default=None, alias="image")
    head: ClusterHead = Field(default_factory=ClusterHead, alias="head")
    workers: ClusterWorkers = Field(default_factory=ClusterWorkers, alias="workers")
    rollout_workers: ClusterRolloutWorkers | None = Field(default=None, alias="rolloutWorkers")
    queue_name: str = Field(default="", alias="queueName", max_length=63)
    env: list[dict[str, Any]] | None = Field(default=None, alias="env")
    env_from: list[dict[str, Any]] | None = Field(default=None, alias="envFrom")
    image_pull_secrets: list[dict[str, Any]] | None = Field(default=None, alias="imagePullSecrets")
    priority_class_name: str | None = Field(default=None, alias="priorityClassName", max_length=253)
    pod_labels: dict[str, str] | None = Field(default=None, alias="podLabels")
    pod_annotations: dict[str, str] | None = Field(default=None, alias="podAnnotations")
    service_account_name: str | None = Field(default=None, alias="serviceAccountName", max_length=253)
    shm_size: int | str | None = Field(default=None, alias="shmSize")


class Checkpoint(_Object):
    """`spec.checkpoint`."""

    volume: dict[str, Any] | None = Field(default=None, alias="volume")
    save_freq: int | None = Field(default=None, alias="saveFreq", ge=-1)
    max_to_keep: int | None = Field(default=None, alias="maxToKeep", ge=1, le=1000)
    resume: str = Field(default="auto", alias="resume", max_length=1024)


class TrainerAsync(_Object):
    """`spec.trainer.async`."""

    parameter_sync_step: int = Field(default=1, alias="parameterSyncStep", ge=1, le=64)
    warmup_batches: int | float = Field(default=1, alias="warmupBatches", ge=0, le=16)
    max_policy_versions: int = Field(default=8, alias="maxPolicyVersions", ge=1, le=64)
    on_stale: Literal["drop", "wait"] = Field(default="drop", alias="onStale")


class Trainer(_Object):
    """`spec.trainer`."""

    mode: Literal["sync", "colocate-async", "separate-async"] = Field(default="sync", alias="mode", max_length=32)
    async_: TrainerAsync = Field(default_factory=TrainerAsync, alias="async")
    loggers: list[Literal["console", "wandb", "mlflow", "tensorboard"]] = Field(default=["console"], alias="loggers")
    extra_args: list[str] | None = Field(default=None, alias="extraArgs")


class RunPolicy(_Object):
    """`spec.runPolicy`."""

    backoff_limit: int = Field(default=0, alias="backoffLimit", ge=0, le=100)
    active_deadline_seconds: int = Field(default=0, alias="activeDeadlineSeconds", ge=0)
    ttl_seconds_after_finished: int = Field(default=300, alias="ttlSecondsAfterFinished", ge=0)
    pending_deadline_seconds: int = Field(default=0, alias="pendingDeadlineSeconds", ge=0)
    placement_timeout_seconds: int = Field(default=600, alias="placementTimeoutSeconds", ge=10, le=86400)


class Spec(_Object):
    """`spec`."""

    suspend: bool = Field(default=False, alias="suspend")
    model: Model = Field(alias="model")
    data: Data = Field(alias="data")
    algorithm: Algorithm = Field(default_factory=Algorithm, alias="algorithm")
    rollout: Rollout = Field(default_factory=Rollout, alias="rollout")
    tools: list[Tool] = Field(alias="tools")
    tool_pool: ToolPool = Field(default_factory=ToolPool, alias="toolPool")
    reward: Reward = Field(default_factory=Reward, alias="reward")
    cluster: Cluster = Field(default_factory=Cluster, alias="cluster")
    checkpoint: Checkpoint = Field(default_factory=Checkpoint, alias="checkpoint")
    trainer: Trainer = Field(default_factory=Trainer, alias="trainer")
    run_policy: RunPolicy = Field(default_factory=RunPolicy, alias="runPolicy")
