"""Discrete-event simulation of a tool pool under a replayed rollout pattern.

It drives the operator's real decision function (toolrl_operator.scale_decision.decide); what is
simulated is the world around it: the trainer's phases, trajectories calling tools, pods with a
fixed number of execution slots and a start-up delay, random routing by the Service, and
metrics that are only as fresh as the last scrape.

Model (every number is a parameter of ``World``):
- The trainer first loads the model for ``loading_seconds`` (no trainer metrics yet; it then
  expects one call per trajectory for the first step). A training step is generate -> score ->
  train. Generation starts every trajectory of the
  batch at once; each trajectory alternates an LLM turn and one tool call, for a replayed
  number of turns, and waits for each tool result before its next turn (closed loop), so a slow
  pool also lengthens generation. Scoring and training make no tool calls.
- The Service routes each call to a uniformly random ready pod; the pod runs ``slots`` calls
  at once and queues up to ``queue_per_pod`` more (FIFO); beyond that it rejects the call and
  the trainer's client retries after ``retry_seconds`` (the wait counts from the first try).
  A new pod is ready ``startup_seconds`` after it is asked for. A removed pod takes no new
  calls, finishes its queue, then stops.
- Every ``scrape_seconds`` the metrics (in-flight + queued per pod, the trainer's phase and
  expected calls) are sampled; every ``tick_seconds`` the autoscaler decides on the last sample.
- Replica-seconds count every pod from the moment it is asked for until it stops.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from toolrl_operator import scale_decision as a


@dataclass(frozen=True)
class World:
    steps: int = 20
    trajectories: int = 1024  # batch x rollouts per prompt
    mean_turns: float = 2.5  # tool calls per trajectory (1 + geometric)
    max_turns: int = 6
    llm_turn_seconds: float = 4.0  # mean of a lognormal
    tool_seconds: float = 2.0  # mean of a lognormal service time
    loading_seconds: float = 60.0
    scoring_seconds: float = 5.0
    training_seconds: float = 90.0
    slots: int = 8  # concurrent executions per pod (toolrl_tool_capacity)
    queue_per_pod: int = 16
    retry_seconds: float = 1.0  # spec.rollout.toolCall.retryDelaySeconds
    startup_seconds: float = 20.0
    scrape_seconds: float = 5.0
    tick_seconds: float = 2.0
    seed: int = 7


Turns = list[tuple[float, float]]  # (LLM seconds, tool seconds) per turn, then a final LLM turn


def replay(world: World) -> list[list[tuple[Turns, float]]]:
    """The rollout pattern: for each step, each trajectory's turns and its final LLM turn."""
    rng = random.Random(world.seed)

    def lognormal(mean: float) -> float:
        return rng.lognormvariate(0, 0.6) * mean / 1.197  # exp(0.6^2 / 2) = 1.197

    steps = []
    p_more = 1 - 1 / world.mean_turns
    for _ in range(world.steps):
        batch = []
        for _ in range(world.trajectories):
            n = 1
            while n < world.max_turns and rng.random() < p_more:
                n += 1
            batch.append(
                (
                    [(lognormal(world.llm_turn_seconds), lognormal(world.tool_seconds)) for _ in range(n)],
                    lognormal(world.llm_turn_seconds),
                )
            )
        steps.append(batch)
    return steps


@dataclass
class Pod:
    ready_at: float
    asked_at: float
    removed: bool = False
    busy: int = 0
    queue: deque = field(default_factory=deque)


@dataclass
class Result:
    name: str
    waits: list[tuple[int, float]]  # (step, queue wait) per call
    replica_seconds: float
    duration: float
    scale_events: int
    max_replicas_seen: int

    def summary(self) -> dict[str, float | str]:
        w = [wait for _, wait in self.waits]
        warm = [wait for step, wait in self.waits if step > 0]
        return {
            "policy": self.name,
            "calls": len(w),
            "mean_wait_s": sum(w) / len(w),
            "p99_wait_s": p99(w),
            "p99_wait_after_step1_s": p99(warm),
            "replica_seconds": self.replica_seconds,
            "run_seconds": self.duration,
            "scale_events": self.scale_events,
            "max_replicas": self.max_replicas_seen,
        }


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


Scaler = Callable[[a.Signals], int]


def fixed(replicas: int) -> Scaler:
    return lambda _sig: replicas


def operator_scaler(policy: a.Policy) -> Scaler:
    """The real decision function, keeping its state between ticks as the handler does."""
    state = a.State()

    def scale(sig: a.Signals) -> int:
        nonlocal state
        decision = a.decide(policy, state, sig)
        state = decision.state
        return decision.replicas

    return scale


def simulate(name: str, world: World, scaler: Scaler, initial: int) -> Result:
    """Runs the replayed pattern through one pool and scaler."""
    pattern = replay(world)
    route = random.Random(world.seed + 1)
    seq = itertools.count()
    events: list = []
    now = 0.0
    pods: list[Pod] = []
    gone_seconds = 0.0
    waits: list[float] = []
    phase: str | None = None
    step, open_trajs = 0, 0
    expected: float | None = None
    sample: tuple[float, str | None, float | None] = (0.0, None, None)  # last scrape: load, phase, expected
    scale_events, peak = 0, initial

    def at(t: float, kind: str, *args) -> None:
        heapq.heappush(events, (t, next(seq), kind, args))

    def live() -> list[Pod]:
        return [p for p in pods if not p.removed]

    def start(pod: Pod, call) -> None:
        arrived, service, traj = call
        waits.append((step, now - arrived))
        pod.busy += 1
        at(now + service, "call_done", pod, traj)

    def submit(call) -> None:
        ready = [p for p in live() if p.ready_at <= now]
        if not ready:  # no endpoint yet: the client retries until a pod is ready
            at(min(p.ready_at for p in live()), "retry", call)
            return
        pod = route.choice(ready)
        if pod.busy < world.slots:
            start(pod, call)
        elif len(pod.queue) < world.queue_per_pod:
            pod.queue.append(call)
        else:  # rejected: the client retries
            at(now + world.retry_seconds, "retry", call)

    def begin_generation() -> None:
        nonlocal phase, open_trajs
        phase, open_trajs = "generating", len(pattern[step])
        for i, (turns, final) in enumerate(pattern[step]):
            at(now + (turns[0][0] if turns else final), "llm_done", (i, 0))

    def resize(n: int) -> None:
        nonlocal scale_events, peak
        current = live()
        if n == len(current):
            return
        scale_events += 1
        peak = max(peak, n)
        if n > len(current):
            pods.extend(
                Pod(ready_at=now + world.startup_seconds, asked_at=now) for _ in range(n - len(current))
            )
            return
        # Like a ReplicaSet: remove pods not yet ready first, then the least loaded.
        for pod in sorted(current, key=lambda p: (p.ready_at <= now, p.busy + len(p.queue)))[
            : len(current) - n
        ]:
            pod.removed = True
            if pod.busy == 0 and not pod.queue:
                retire(pod)

    def retire(pod: Pod) -> None:
        nonlocal gone_seconds
        pods.remove(pod)
        gone_seconds += now - pod.asked_at

    for _ in range(initial):
        pods.append(Pod(ready_at=0.0, asked_at=0.0))
    at(world.loading_seconds, "loaded")
    at(0.0, "scrape")
    at(0.0, "tick")
    done = False
    while not done:
        now, _, kind, args = heapq.heappop(events)
        if kind == "llm_done":
            i, turn = args[0]
            turns, _final = pattern[step][i]
            if turn < len(turns):
                submit((now, turns[turn][1], (i, turn)))
            else:
                open_trajs -= 1
                if open_trajs == 0:
                    expected = float(sum(len(t) for t, _ in pattern[step]))  # calls seen in this step
                    phase = "scoring"
                    at(now + world.scoring_seconds, "training")
        elif kind == "call_done":
            pod, (i, turn) = args
            pod.busy -= 1
            if pod.queue:
                start(pod, pod.queue.popleft())
            elif pod.removed and pod.busy == 0:
                retire(pod)
            turns, final = pattern[step][i]
            nxt = turns[turn + 1][0] if turn + 1 < len(turns) else final
            at(now + nxt, "llm_done", (i, turn + 1))
        elif kind == "loaded":
            expected = float(world.trajectories)
            begin_generation()
        elif kind == "retry":
            submit(args[0])
        elif kind == "training":
            phase = "training"
            at(now + world.training_seconds, "step_done")
        elif kind == "step_done":
            step += 1
            if step == len(pattern):
                done = True
            else:
                begin_generation()
        elif kind == "scrape":
            load = sum(p.busy + len(p.queue) for p in pods)
            sample = (float(load), phase, expected)
            at(now + world.scrape_seconds, "scrape")
        elif kind == "tick":
            current = live()
            ready = sum(1 for p in current if p.ready_at <= now)
            load, seen_phase, seen_expected = sample
            resize(
                scaler(
                    a.Signals(
                        now=now,
                        current_replicas=len(current),
                        ready_replicas=ready,
                        load=load,
                        phase=seen_phase,
                        expected_calls=seen_expected,
                    )
                )
            )
            at(now + world.tick_seconds, "tick")
    replica_seconds = gone_seconds + sum(now - p.asked_at for p in pods)
    return Result(name, waits, replica_seconds, now, scale_events, peak)
