"""The ToolRL Grafana dashboard: what to look at while a ToolRLJob trains.

Metric names and labels follow docs/contracts.md. Tool-pool and trainer series carry the
target labels `namespace` and `toolrl_job` (relabelled from the pod label `toolrl.dev/job`);
the operator's per-job series carry them as their own labels (scraped with honor_labels).
Operator-wide series (reconciles, scale decisions) have no job and are not filtered by it.
"""

from __future__ import annotations

from .panels import Dashboard, Panel, QueryVariable, Row, Target

JOB = 'namespace=~"$namespace", toolrl_job=~"$job"'
RATE = "$__rate_interval"
QUANTILES = (0.5, 0.95, 0.99)


def _quantiles(metric: str, by: str, sel: str = JOB) -> tuple[Target, ...]:
    """p50/p95/p99 of a histogram, one series per `by` value."""
    group = f"{by}, le" if by else "le"
    legend_by = f"{{{{{by}}}}} " if by else ""
    series = f"{metric}_bucket{{{sel}}}" if sel else f"{metric}_bucket"
    return tuple(
        Target(f"histogram_quantile({q}, sum by ({group}) (rate({series}[{RATE}])))",
               f"{legend_by}p{round(q * 100)}")
        for q in QUANTILES
    )


TOOL_POOL = Row("Tool pool", (
    Panel("Tool calls per second by tool and outcome", "reqps", (
        Target(f"sum by (tool, outcome) (rate(toolrl_tool_calls_total{{{JOB}}}[{RATE}]))",
               "{{tool}} {{outcome}}"),
    ), "Responses of the tool pool; outcome is ok, error, timeout, killed or rejected.", stack=True),
    Panel("Tool call latency p50 / p95 / p99 by tool", "s",
          _quantiles("toolrl_tool_call_duration_seconds", "tool"),
          "Server-side duration of a tool call, from the tool pool's histogram."),
    Panel("Tool calls per second by protocol and outcome", "reqps", (
        Target(f"sum by (protocol, outcome) (rate(toolrl_tool_calls_total{{{JOB}}}[{RATE}]))",
               "{{protocol}} {{outcome}}"),
    ), "The same calls by the protocol their client spoke: native (/v1/execute), sandboxfusion (/run_code),"
       " verltool (/get_observation), mcp (/mcp), openenv (/step, /ws).", stack=True),
    Panel("Tool call latency p95 by protocol", "s",
          _quantiles("toolrl_tool_call_duration_seconds", "protocol")[1:2],
          "Server-side duration of a tool call by the protocol that carried it."),
    Panel("In-flight calls vs capacity, and queue depth", "short", (
        Target(f"sum(toolrl_tool_inflight{{{JOB}}})", "in flight"),
        Target(f"sum(toolrl_tool_capacity{{{JOB}}})", "capacity"),
        Target(f"sum(toolrl_tool_queue_depth{{{JOB}}})", "queued"),
    ), "Calls executing now, the slots the ready replicas offer, and calls waiting for a slot."),
    Panel("Tool pool replicas: desired, max and ready", "short", (
        Target(f"max(toolrl_autoscaler_desired_replicas{{{JOB}}})", "desired"),
        Target(f"max(toolrl_autoscaler_max_replicas{{{JOB}}})", "max"),
        Target(f"count(toolrl_tool_capacity{{{JOB}}})", "ready (serving metrics)"),
    ), "The autoscaler's decision, the job's ceiling, and the tool-pool pods that answer scrapes."),
    Panel("Scale decisions by reason", "short", (
        Target(f"sum by (reason) (increase(toolrl_autoscaler_decisions_total[{RATE}]))", "{{reason}}"),
    ), "Autoscaler decisions per interval across all jobs, by why the operator chose the replica count.",
        stack=True),
    Panel("Timeouts, errors and truncated outputs", "reqps", (
        Target(f'sum by (tool, outcome) (rate(toolrl_tool_calls_total{{{JOB}, outcome!="ok"}}[{RATE}]))',
               "{{tool}} {{outcome}}"),
        Target(f"sum by (tool) (rate(toolrl_tool_output_truncated_total{{{JOB}}}[{RATE}]))",
               "{{tool}} truncated"),
    ), "Failed calls by outcome, and calls whose output was cut at maxOutputBytes."),
))

TRAINING = Row("Training", (
    Panel("Reward mean and components", "none", (
        Target(f"max(toolrl_trainer_reward_mean{{{JOB}}})", "reward mean"),
        Target(f"max by (component) (toolrl_trainer_reward_component{{{JOB}}})", "{{component}}"),
    ), "Mean reward of the last step and its parts, as training steps advance."),
    Panel("Training step", "short", (
        Target(f"max(toolrl_trainer_step{{{JOB}}})", "step"),
        Target(f"max(toolrl_trainer_total_steps{{{JOB}}})", "total steps"),
    ), "Progress of the run: the last finished step and the planned number."),
    Panel("Step time", "s", (
        Target(f"max(toolrl_trainer_step_duration_seconds{{{JOB}}})", "last step"),
    ), "Wall time of the last training step (rollout, scoring and update)."),
    Panel("Tool calls per trajectory", "short", (
        Target(f"max(toolrl_trainer_tool_calls_per_trajectory{{{JOB}}})", "calls per trajectory"),
    ), "Mean number of tool calls in a rollout trajectory of the last step."),
    Panel("Trajectories excluded for infrastructure failures", "percentunit", (
        Target(f"max(toolrl_trainer_excluded_fraction{{{JOB}}})", "excluded share of the last step"),
        Target(f"sum by (reason) (increase(toolrl_trajectories_excluded_total{{{JOB}}}[{RATE}]))"
               f" / scalar(sum(increase(toolrl_trajectories_total{{{JOB}}}[{RATE}])))", "{{reason}}"),
        Target(f"sum(increase(toolrl_trajectories_discarded_total{{{JOB}}}[{RATE}]))"
               f" / scalar(sum(increase(toolrl_trajectories_total{{{JOB}}}[{RATE}])))",
               "discarded with a batch the breaker stopped"),
        Target(f"max(toolrl_trainer_tool_pool_degraded{{{JOB}}})", "circuit breaker holding a step (100 %)"),
    ), "Trajectories kept out of scoring and the update because a tool call failed by the pool's doing "
       "(rejected, unreachable, no answer in time, sandbox error), as a share of all trajectories: "
       "they are not scored 0, they are not trained on (docs/contracts.md, Whose failure). When a step's "
       "share passes rollout.toolCall.maxInfraFailureRatio, the circuit breaker holds the step (100 % "
       "while it waits for the pool; the job's ToolPoolDegraded condition) and discards the rest of its "
       "batch.", width=24),
    Panel("Rollout and trainer idle fractions", "percentunit", (
        Target(f"max(toolrl_trainer_rollout_idle_fraction{{{JOB}}})", "rollout idle"),
        Target(f"max(toolrl_trainer_idle_fraction{{{JOB}}})", "trainer idle (waiting for a batch)"),
    ), "Shares of the last step, from verl's timings of it. The trainer is idle while it waits for a "
       "batch (timing_s/gen) in every mode. In sync and colocate-async, rollout and update share the "
       "workers: the rollout is idle for the rest of the step and the two add up to 100 %. In "
       "separate-async the rollout workers are idle only for the weight sync (a lower bound).", width=8),
    Panel("Off-policy lag of trained trajectories", "short", (
        Target(f"max(toolrl_trainer_off_policy_lag_max{{{JOB}}})", "max"),
        Target(f"max(toolrl_trainer_off_policy_lag_mean{{{JOB}}})", "mean"),
    ), "Model versions between the policy the last update trained and the oldest weights its "
       "trajectories were generated with (0 in sync mode; in the async modes bounded by "
       "spec.trainer.async.maxPolicyVersions).", width=8),
    Panel("Prompt groups dropped as stale", "short", (
        Target(f"sum(increase(toolrl_trainer_stale_groups_dropped_total{{{JOB}}}[{RATE}]))", "dropped"),
    ), "Prompt groups the async replay buffer dropped per interval because they passed the staleness "
       "bound (spec.trainer.async.maxPolicyVersions): generation spent on nothing.", width=8),
))

OPERATOR = Row("Operator", (
    Panel("Jobs by phase", "short", (
        Target('sum by (phase) (toolrl_operator_jobs{namespace=~"$namespace"})', "{{phase}}"),
    ), "ToolRLJobs in the selected namespaces by status.phase.", width=8, stack=True),
    Panel("Reconcile latency p50 / p95 / p99", "s",
          _quantiles("toolrl_operator_reconcile_duration_seconds", "", sel=""),
          "How long the operator's reconcile handler takes.", width=8),
    Panel("Reconcile errors per second by reason", "ops", (
        Target(f"sum by (reason) (rate(toolrl_operator_reconcile_errors_total[{RATE}]))", "{{reason}}"),
    ), "Reconciles that raised, by reason; kopf retries them.", width=8),
))

DASHBOARD = Dashboard(
    uid="toolrl-jobs",
    title="ToolRL jobs",
    description="Tool pool, training and operator of ToolRLJobs (toolrl-operator).",
    tags=("toolrl", "rl", "kubernetes"),
    variables=(
        QueryVariable("namespace", "Namespace", 'up{toolrl_job!=""}', "namespace"),
        QueryVariable("job", "Job", 'up{namespace=~"$namespace", toolrl_job!=""}', "toolrl_job"),
    ),
    rows=(TOOL_POOL, TRAINING, OPERATOR),
)


def substitute(expr: str, namespace: str, job: str, rate_interval: str = "1m") -> str:
    """A query as Grafana sends it for one selected namespace and job: used to run the
    dashboard's queries against a real Prometheus in tests."""
    for var, value in (("$namespace", namespace), ("$job", job), ("$__rate_interval", rate_interval)):
        expr = expr.replace(var, value)
    return expr
