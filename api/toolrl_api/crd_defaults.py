"""The ToolRLJob CRD's defaults, as data.

GENERATED from crds/toolrl.dev_toolrljobs.yaml by `make chart-generate`
(charts/chartgen/crd_defaults.py): do not edit; change the CRD and regenerate.
`make chart-check` fails while this file is stale.
"""

from typing import Any

SPEC_DEFAULTS: dict[str, Any] = {
    "suspend": False,
    "data": {
        "maxPromptLength": 1024,
        "maxResponseLength": 2048,
    },
    "algorithm": {
        "advantageEstimator": "grpo",
        "rolloutsPerPrompt": 8,
        "klLoss": {
            "enabled": True,
            "coef": 0.001,
        },
        "learningRate": 1e-06,
        "trainBatchSize": 256,
        "clipRatio": {
            "low": 0.2,
            "high": 0.2,
        },
        "lossAggregation": "token-mean",
        "dynamicSampling": {
            "enabled": False,
            "metric": "reward",
            "maxGenerationBatches": 10,
        },
    },
    "rollout": {
        "engine": "vllm",
        "tensorParallelSize": 1,
        "gpuMemoryUtilization": 0.6,
        "protocol": "hermes",
        "maxToolTurns": 3,
        "maxParallelCalls": 1,
        "maxToolResponseLength": 1024,
        "toolCall": {
            "timeoutSeconds": 30,
            "maxRetries": 3,
            "retryDelaySeconds": 1.0,
            "maxConcurrency": 256,
            "maxInfraFailureRatio": 0.2,
        },
    },
    "toolPool": {
        "replicas": {
            "min": 2,
            "max": 64,
        },
        "autoscaler": "native",
        "targetConcurrencyPerReplica": 16,
        "capacityPerReplica": 32,
        "maxSessionsPerReplica": 64,
        "requireLandlock": True,
        "scaleDownDelaySeconds": 120,
        "rolloutAware": True,
    },
    "reward": {
        "preset": "code-execution",
        "overlongPenalty": {
            "enabled": False,
            "penaltyFactor": 1.0,
        },
        "toolbench": {
            "formatWeight": 0.1,
            "functionCallWeight": 0.2,
            "finishWeight": 0.3,
            "errorPenalty": -0.5,
            "finishBonus": 0.5,
        },
    },
    "cluster": {
        "head": {},
        "workers": {
            "replicas": 1,
            "gpusPerWorker": 8,
        },
        "queueName": "",
    },
    "checkpoint": {
        "resume": "auto",
    },
    "trainer": {
        "mode": "sync",
        "async": {
            "parameterSyncStep": 1,
            "warmupBatches": 1,
            "maxPolicyVersions": 8,
            "onStale": "drop",
        },
        "loggers": ["console"],
    },
    "runPolicy": {
        "backoffLimit": 0,
        "activeDeadlineSeconds": 0,
        "ttlSecondsAfterFinished": 300,
        "pendingDeadlineSeconds": 0,
        "placementTimeoutSeconds": 600,
    },
}
"""`spec` as defaulting fills it: every default outside arrays and optional objects."""

DEFAULTS_WHEN_PRESENT: dict[str, Any] = {
    "tools[]": {
        "timeoutSeconds": 10,
        "memoryLimitMiB": 512,
        "maxOutputBytes": 4096,
        "topK": 3,
        "fileSizeLimitMiB": 16,
        "diskLimitMiB": 32,
        "maxOpenFiles": 64,
        "maxProcesses": 256,
        "maxRetries": 3,
        "retryDelaySeconds": 0.5,
        "rateLimitPerSecond": 50,
    },
    "tools[].function": {
        "configMap": {
            "key": "tools.py",
        },
    },
    "reward.custom": {
        "key": "reward.py",
        "function": "compute_score",
    },
    "cluster.rolloutWorkers": {
        "replicas": 1,
    },
}
"""Defaults of an array's items (`tools[]`) and of an optional object (`reward.custom`),
by path in spec: applied to each one given."""
