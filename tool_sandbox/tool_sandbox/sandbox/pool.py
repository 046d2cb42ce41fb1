"""Server side of the warm workers: starts them as separate programs, routes calls to the least
busy one, and restarts any that dies (answering its in-flight calls with an error)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from tool_sandbox.config import ServerSettings
from tool_sandbox.sandbox import outcome, wire

log = logging.getLogger(__name__)
_ENV_KEPT = ("PATH", "PYTHONPATH", "LANG", "LC_ALL")
ANSWER_GRACE_SECONDS = 10.0  # beyond a call's own timeout, before the server stops waiting for its worker
CONTROL_TIMEOUT_SECONDS = 5.0  # for operations without a timeout of their own (close, ping)
STARTUP_GRACE_SECONDS = 120.0  # a worker not ready yet is unhealthy only after this since the pool started
# /readyz runs this in each worker, in an execution slot when one is free: it proves a child can be
# made, isolated and run, not only that the worker's loop answers. /healthz runs no code.
PROBE = {
    "op": "run",
    "code": "pass",
    "timeout": 5.0,
    "maxOutputBytes": 1024,
    "limits": {
        "timeout_seconds": 5.0,
        "memory_mib": 64,
        "file_size_mib": 1,
        "open_files": 16,
        "processes": 16,
    },
}


class WorkerLost(Exception):
    """The worker serving a call or session exited."""


class CallTooLarge(Exception):
    """The call's own content (code, stdin, files) does not fit the worker frame: the caller's to shrink."""


@dataclass
class _Worker:
    index: int
    generation: int = 0
    process: asyncio.subprocess.Process | None = None
    pending: dict[int, asyncio.Future[dict[str, Any]]] = field(default_factory=dict)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    layers: dict[str, Any] = field(default_factory=dict)
    was_ready: bool = False


def worker_environment() -> dict[str, str]:
    """Only what the interpreter needs: none of the server's secrets reach a worker."""
    env = {key: os.environ[key] for key in _ENV_KEPT if key in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(
        OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1"
    )
    # Objects from the C library's heap rather than pymalloc's 1 MiB arenas: one contiguous
    # region, so ~51 of the warm worker's ~58 MiB collapse into huge pages instead of ~41
    # (memory.py) and each fork and exit handles ~2,000 fewer page-table entries (~8 % calls/s).
    env["PYTHONMALLOC"] = "malloc"
    return env


class Pool:
    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.workers = [_Worker(i) for i in range(settings.workers)]
        self.next_id = 1
        self.restarts = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._started = 0.0
        self._pings: dict[int, asyncio.Task[dict[str, Any]]] = {}  # in flight, shared by every prober

    def own_pids(self) -> set[int]:
        """The worker processes (asyncio waits for these; nobody else may reap them)."""
        return {w.process.pid for w in self.workers if w.process is not None}

    async def start(self) -> None:
        self._started = asyncio.get_running_loop().time()
        for worker in self.workers:
            self._tasks.append(asyncio.create_task(self._supervise(worker)))

    async def wait_ready(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(asyncio.gather(*(w.ready.wait() for w in self.workers)), timeout)

    def is_ready(self) -> bool:
        return all(w.ready.is_set() for w in self.workers)

    def layers(self) -> dict[str, Any]:
        return self.workers[0].layers

    def fail_pending(self, message: str) -> int:
        """Answer every call still waiting for a worker with WorkerLost(message) (the pool's fault):
        at shutdown, once the calls had their time. Returns how many."""
        failed = 0
        for worker in self.workers:
            for future in worker.pending.values():
                if not future.done():
                    future.set_exception(WorkerLost(message))
                    failed += 1
        return failed

    async def close(self) -> None:
        self._closing = True
        for task in self._tasks:
            task.cancel()
        for worker in self.workers:
            if worker.process and worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                await worker.process.wait()

    # ---- calls ----------------------------------------------------------------------------

    def pick(self) -> int:
        """Index of the ready worker with the fewest calls in flight."""
        ready = [w for w in self.workers if w.ready.is_set()] or self.workers
        return min(ready, key=lambda w: len(w.pending)).index

    async def call(
        self,
        message: dict[str, Any],
        worker_index: int | None = None,
        generation: int | None = None,
        answer_within: float | None = None,
    ) -> tuple[dict[str, Any], int, int]:
        """Send one request; returns (reply, worker index, worker generation)."""
        index = self.pick() if worker_index is None else worker_index
        worker = self.workers[index]
        if worker_index is None:
            await worker.ready.wait()
        if generation is not None and generation != worker.generation:
            raise WorkerLost("the worker holding this session restarted")
        if worker.process is None or worker.process.stdin is None:
            raise WorkerLost("worker not running")
        call_id = self.next_id
        self.next_id += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        worker.pending[call_id] = future
        gen = worker.generation
        frame = wire.encode({**message, "id": call_id})
        if len(frame) > wire.HEADER_SIZE + wire.MAX_FRAME:
            worker.pending.pop(call_id, None)
            raise CallTooLarge(
                f"the call is {len(frame)} bytes once encoded for the sandbox, over its limit of"
                f" {wire.MAX_FRAME}; send less code, input or files"
            )
        worker.process.stdin.write(frame)
        wait = float(message.get("timeout", 0.0)) + ANSWER_GRACE_SECONDS
        if message.get("op") in ("close", "ping"):
            wait = CONTROL_TIMEOUT_SECONDS
        wait = answer_within or wait
        try:
            return await asyncio.wait_for(future, wait), index, gen
        except TimeoutError:
            raise WorkerLost(
                f"sandbox worker {index} did not answer within {wait:g}s; it is being checked, retry the call"
            ) from None
        finally:
            worker.pending.pop(call_id, None)

    async def alive(self) -> list[str]:
        """Liveness, running no code: every worker runs and its loop answers a ping (one that does
        not answer within 5 s is killed, and restarted by its supervisor) and can make sandbox
        directories. A worker that is not ready (restarting, or crashing in a loop) is a problem
        too, once the pool had time to start. Returns what is wrong."""
        answers = await asyncio.gather(*(self._alive(w) for w in self.workers))
        return [problem for problem in answers if problem]

    async def _alive(self, worker: _Worker) -> str:
        if not worker.ready.is_set():
            starting = asyncio.get_running_loop().time() - self._started < STARTUP_GRACE_SECONDS
            if starting and not worker.was_ready:
                return ""
            return f"worker {worker.index}: not running (restarted {self.restarts} times in all)"
        try:
            ping = await self.ping(worker)
        except WorkerLost as exc:
            return f"worker {worker.index}: {exc}"
        if ping.get("spawnError"):
            return f"worker {worker.index} cannot start sandboxes: {ping['spawnError']}"
        return ""

    async def ready_problems(self, run_code: bool) -> list[str]:
        """Readiness beyond liveness: every worker can fork children now (none failed in the last
        seconds, e.g. for the pod's pids) and, with `run_code`, runs a trivial program."""
        answers = await asyncio.gather(*(self._ready(w, run_code) for w in self.workers))
        return [problem for problem in answers if problem]

    async def _ready(self, worker: _Worker, run_code: bool) -> str:
        try:
            ping = await self.ping(worker)
            if ping.get("status") != outcome.OK:
                return f"worker {worker.index} cannot start sandboxes: {ping.get('message')}"
            if not run_code:
                return ""
            reply, _, _ = await self.call(PROBE, worker.index, worker.generation, CONTROL_TIMEOUT_SECONDS)
        except WorkerLost as exc:
            return f"worker {worker.index}: {exc}"
        if reply.get("status") != outcome.OK:
            return f"worker {worker.index} cannot run code: {reply.get('status')}: {reply.get('message')}"
        return ""

    async def ping(self, worker: _Worker) -> dict[str, Any]:
        """The worker's answer to a ping; one ping in flight per worker, whoever asks (a burst of
        probes costs the worker one). A worker that does not answer is killed (then restarted)."""
        task = self._pings.get(worker.index)
        if task is None:
            task = asyncio.ensure_future(self._ping(worker))
            self._pings[worker.index] = task
            task.add_done_callback(lambda _: self._pings.pop(worker.index, None))
        return await asyncio.shield(task)

    async def _ping(self, worker: _Worker) -> dict[str, Any]:
        try:
            reply, _, _ = await self.call({"op": "ping"}, worker.index, worker.generation)
        except WorkerLost:
            if worker.process is not None and worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
            raise
        return reply

    # ---- supervision ---------------------------------------------------------------------

    async def _supervise(self, worker: _Worker) -> None:
        while not self._closing:
            try:
                await self._run_worker(worker)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker %d failed", worker.index)
            worker.ready.clear()
            worker.generation += 1
            for future in worker.pending.values():
                if not future.done():
                    future.set_exception(WorkerLost("sandbox worker exited during the call"))
            worker.pending.clear()
            if self._closing:
                return
            self.restarts += 1
            log.warning("sandbox worker %d exited; restarting", worker.index)
            await asyncio.sleep(0.2)

    async def _run_worker(self, worker: _Worker) -> None:
        own = self.settings
        settings = {
            "workdir": own.workdir,  # each worker leases its own part of it (zygote.Lease)
            "uidBase": own.sandbox_uid_base,
            "slots": own.capacity + own.max_sessions + own.spares_per_worker + 8,
            "tasks": max(own.max_tasks // own.workers, 1),  # each worker's share of the pod's
            "spares": self.settings.spares_per_worker,
            "landlock": self.settings.landlock,
        }
        worker.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tool_sandbox.sandbox.zygote",
            json.dumps(settings),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=worker_environment(),
            limit=wire.MAX_FRAME,
        )
        stdout = worker.process.stdout
        assert stdout is not None
        try:
            while True:
                message = await wire.read_stream_frame(stdout)
                if message.get("op") == "ready":
                    worker.layers = message.get("layers", {})
                    worker.ready.set()
                    worker.was_ready = True
                    log.info("sandbox worker %d ready: %s", worker.index, worker.layers)
                    continue
                future = worker.pending.get(message.get("id"))
                if future is not None and not future.done():
                    future.set_result(message)
        except asyncio.IncompleteReadError:
            pass
        finally:
            if worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
            await worker.process.wait()


def lost_result(message: str) -> dict[str, Any]:
    """The reply for a call whose worker died under it."""
    return outcome.no_run_reply(outcome.ERROR, message)
