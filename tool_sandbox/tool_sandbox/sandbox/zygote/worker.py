"""The worker's loop: the server's requests on fd 3, answers on fd 4, its children's pipes, the
forker's reports of their ends; a few spare children forked ahead of calls."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import site
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from tool_sandbox.sandbox import forker, landlock, layers, outcome, seccomp, tree, wire
from tool_sandbox.sandbox.zygote import preload, staging
from tool_sandbox.sandbox.zygote.leases import Lease
from tool_sandbox.sandbox.zygote.limits import CallLimits

_CHUNK = 1 << 16
MAX_CONTROL_BYTES = 1 << 16  # a child's control frames are tiny; more pending is a violation
MAX_SETUP_ERROR_CHARS = 300  # of a child's set-up failure, in answers and the log
SPAWN_PAUSE_SECONDS = 0.5  # no spare is forked for this long after a fork failed (calls still try)
FORK_FAILURE_SHOWN_SECONDS = 5.0  # a worker that failed to fork this recently says so when pinged


class ControlError(ValueError):
    """A child's control pipe carried what the sandbox does not write there."""


@dataclass
class Call:
    """One request being served by a child."""

    id: int
    started: float
    limits: CallLimits
    fetch: list[str]
    session_open: bool = False
    violation: str = ""  # why the child was killed for breaking the worker protocol
    pressed: bool = False  # a thread was refused because others used up the worker's task budget


@dataclass
class Child:
    slot: int  # its name between worker and forker (the forker alone knows its pid)
    request_w: int
    out_r: int
    err_r: int
    ctl_r: int
    workdir: str
    ctl_buf: bytearray = field(default_factory=bytearray)
    call: Call | None = None
    session: int | None = None
    cpu_seconds: float = 0.0  # its CPU budget (RLIMIT_CPU counts on top of its setup)
    disk_bytes: int = 0  # what its directory may hold (0: unchecked)
    reaped: bool = False
    pid: int = 0  # as it said before any code ran (its first frame); 0 until then
    setup_error: str = ""
    setup_error_logged: bool = False
    # Its control pipe is believed only until code can have run: its pid (the first frame, at its
    # start), then a set-up failure or "started" for a session, or its end (a one-shot child closes it
    # before the code).
    trusted: bool = True
    cells: int = 0  # a session's cells so far; the one running is this number
    cell_exit: int | None = None  # what the child said of the running cell ("done" frame)
    stopped: bool = False  # the forker saw it stop since the running cell began
    violation: str = ""  # what its code did between cells, answered as its next cell
    # An answer held until the child is reaped, so that an answered call has its slot back (the
    # server admits the next call when this one is answered).
    answer_when_reaped: dict[str, Any] | None = None
    open_fds: set[int] = field(default_factory=set)
    outbox: bytearray = field(default_factory=bytearray)  # request bytes the pipe has not taken yet
    close_after_write: bool = False


class Worker:
    def __init__(self, settings: dict[str, Any], lease: Lease) -> None:
        self.settings = settings
        self.lease = lease
        self.root = lease.workdir
        self.spare_target = int(settings.get("spares", 2))
        self.slots = int(settings.get("slots", 64))
        self.task_budget = int(settings.get("tasks", 0))  # this worker's share of the pod's tasks
        self.free_slots = list(range(self.slots))
        self.uid_base = lease.uid_base
        self.children: dict[int, Child] = {}  # by slot
        self.by_fd: dict[int, tuple[Child, str]] = {}
        self.spares: list[Child] = []
        self.sessions: dict[int, Child] = {}
        self.next_session = 1
        self.selector = selectors.DefaultSelector()
        self.inbox = bytearray()
        self.in_fd, self.out_fd = 3, 4  # see __main__._claim_fds
        layers.prepare_stdio()
        self.landlock_abi = landlock.abi_version() if settings.get("landlock", True) else 0
        # whether /proc of its children is readable here: as root, or when they share its uid under
        # Landlock (_spawner.c makes them dumpable then); otherwise files a child deleted but keeps
        # open are not counted against its disk budget
        self.reads_children = os.geteuid() == 0 or self.landlock_abi > 0
        self.layers = layers.Layers(
            landlock=landlock.Prepared(_read_only_paths(), self.landlock_abi) if self.landlock_abi else None,
            static_filter=seccomp.static_filter(),
            self_only_filter=seccomp.self_only_template(),
            task_filter=seccomp.task_filter() if seccomp.listener_available() else b"",
        )
        self.forker_pid = 0
        self.forker: socket.socket | None = None
        self.huge_bytes = 0
        self.spawn_error = ""  # why the last spawn failed ("" once one succeeds again)
        self.fork_error = ""  # why the forker's last fork failed (e.g. the pod's pids limit)
        self.fork_failed_at = -FORK_FAILURE_SHOWN_SECONDS

    # ---- children -------------------------------------------------------------------------

    def spawn(self) -> Child | None:
        if not self.free_slots:
            return None
        slot = self.free_slots[-1]
        uid = None if self.uid_base is None else int(self.uid_base) + slot
        workdir = os.path.join(self.root, f"s{slot}-{time.monotonic_ns()}")
        try:
            staging.make_workdir(self.root, workdir, uid)
        except OSError as exc:  # reported by /healthz (ping) and to the calls that needed a child
            self.spawn_error = f"cannot make a sandbox directory: {exc}"
            return None
        self.spawn_error = ""
        self.free_slots.pop()
        request_r, request_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ctl_r, ctl_w = os.pipe()
        ends = (request_r, out_w, err_w, ctl_w)
        assert self.forker is not None
        forker.spawn(self.forker, slot, workdir, uid, ends)
        for fd in ends:
            os.close(fd)
        os.set_blocking(request_w, False)  # a stopped child must never block this worker
        kid = Child(slot, request_w, out_r, err_r, ctl_r, workdir)
        for fd, role in ((out_r, "out"), (err_r, "err"), (ctl_r, "ctl")):
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)
            self.by_fd[fd] = (kid, role)
            kid.open_fds.add(fd)
        self.children[slot] = kid
        return kid

    def take_spare(self) -> Child | None:
        while self.spares:
            kid = self.spares.pop(0)
            if self.children.get(kid.slot) is kid:  # not reaped (its slot maybe reused)
                return kid
        return self.spawn()

    def kill(self, kid: Child) -> None:
        """Kill a child's process group (the forker ignores it once the child is reaped)."""
        if not kid.reaped:
            assert self.forker is not None
            forker.kill(self.forker, kid.slot)

    def on_forker(self) -> None:
        """Children the forker has reaped."""
        assert self.forker is not None
        while True:
            try:
                data = self.forker.recv(forker.EXITED.size, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if not data:
                raise SystemExit("tool-sandbox worker: the forker exited")
            gone = forker.exited(data)
            kid = self.children.get(gone.slot)
            if kid is not None and gone.pressed:
                if kid.call is not None:
                    kid.call.pressed = True
            elif kid is not None and gone.stopped:
                kid.stopped = True
                self.end_cell(kid)
            elif kid is not None:
                if gone.status is None:  # the pool's failure (pids exhausted?), whoever's call it was
                    kid.setup_error = f"could not start a sandbox process: {os.strerror(gone.fork_errno)}"
                    if kid.setup_error != self.fork_error:
                        print(f"tool-sandbox worker: {kid.setup_error}", file=sys.stderr)
                    self.fork_error, self.fork_failed_at = kid.setup_error, time.monotonic()
                    kid.setup_error_logged = True
                try:
                    self.reap(kid, gone.status, gone.cpu_seconds)
                except Exception:  # e.g. an unreadable leftover: log it, keep serving the others
                    traceback.print_exc()
                    self.children.pop(kid.slot, None)
                    self.sessions.pop(kid.session or -1, None)
                    if kid.slot not in self.free_slots:
                        self.free_slots.append(kid.slot)

    def reap(self, kid: Child, status: int | None, cpu_seconds: float) -> None:
        kid.reaped = True
        for fd, role in ((kid.out_r, "out"), (kid.err_r, "err"), (kid.ctl_r, "ctl")):
            if fd in kid.open_fds:
                self.on_readable(kid, role, drain=True)
        if kid.call is not None:
            self.finish(kid, kid.call.limits.classify(status, cpu_seconds))
        elif kid.answer_when_reaped is not None:
            self.send(kid.answer_when_reaped)
        elif kid.setup_error and not kid.setup_error_logged:  # repr: one line, whatever it holds
            print(f"tool-sandbox worker: child setup failed: {kid.setup_error!r}", file=sys.stderr)
        for fd in list(kid.open_fds):
            self.close_fd(kid, fd)
        self.close_request(kid)
        try:
            tree.remove(kid.workdir)
        except OSError as exc:  # left for the next holder of this lease (leases.sweep)
            print(f"tool-sandbox worker: could not remove {kid.workdir}: {exc}", file=sys.stderr)
        del self.children[kid.slot]
        if kid.session is not None:
            self.sessions.pop(kid.session, None)
        self.free_slots.append(kid.slot)

    def close_request(self, kid: Child) -> None:
        if kid.request_w >= 0:
            if kid.request_w in self.by_fd:
                self.selector.unregister(kid.request_w)
                del self.by_fd[kid.request_w]
            os.close(kid.request_w)
            kid.request_w = -1
            kid.outbox.clear()

    def write_request(self, kid: Child) -> None:
        """Write what the pipe takes now; the rest waits for the selector (or the call's deadline)."""
        try:
            while kid.outbox:
                del kid.outbox[: os.write(kid.request_w, kid.outbox)]
        except BlockingIOError:
            if kid.request_w not in self.by_fd:
                self.selector.register(kid.request_w, selectors.EVENT_WRITE)
                self.by_fd[kid.request_w] = (kid, "req")
            return
        except OSError:
            self.close_request(kid)
            self.kill(kid)  # died before reading: reported when its exit is seen
            return
        if kid.request_w in self.by_fd:
            self.selector.unregister(kid.request_w)
            del self.by_fd[kid.request_w]
        if kid.close_after_write:
            self.close_request(kid)

    def close_fd(self, kid: Child, fd: int) -> None:
        self.selector.unregister(fd)
        del self.by_fd[fd]
        kid.open_fds.discard(fd)
        os.close(fd)

    # ---- calls --------------------------------------------------------------------------

    def start(self, msg: dict[str, Any], kid: Child, mode: str, frame: bytes) -> None:
        if mode == "exec":
            forker.cont(self.forker, kid.slot)  # it stopped itself when its last cell ended
        else:  # before the code: the forker answers its threads from then on
            forker.limit(self.forker, kid.slot, int(msg["limits"]["processes"]))
        if mode != "run":
            kid.cells += 1
            kid.cell_exit, kid.stopped = None, False
        now = time.monotonic()
        max_output = int(msg.get("maxOutputBytes", 4096))
        kid.call = Call(
            id=msg["id"],
            started=now,
            limits=CallLimits.start(
                now,
                float(msg["timeout"]),
                max_output,
                kid.disk_bytes,
                partial(self.disk_used, kid),
                kid.cpu_seconds,
            ),
            fetch=list(msg.get("fetch") or []),
            session_open=mode == "session" and kid.session is None,
        )
        kid.outbox += frame
        kid.close_after_write = mode == "run"
        self.write_request(kid)

    def finish(self, kid: Child, result: outcome.Outcome, session_alive: bool = False) -> None:
        call = kid.call
        kid.call = None
        assert call is not None
        if call.limits.over_disk_at_end() and session_alive:
            self.kill(kid)
            session_alive = False
        result = call.limits.verdict(result)
        message = result.message
        if call.violation:
            result = outcome.Outcome(outcome.KILLED, result.exit_code, "")
            message = call.violation
        if kid.setup_error:
            result = outcome.Outcome(outcome.ERROR, None, "")
            message = f"sandbox setup failed: {kid.setup_error}"
        pressed = call.pressed and result.status != outcome.OK and not kid.setup_error
        if pressed:  # it may have failed for what others took: the pool's fault, not its code's
            message = _join(
                message,
                "a thread of this call could not start: the pool's task budget (--max-tasks) was used"
                " up by other calls; retry",
            )
        stdout, stderr, truncated = call.limits.capped_output()
        reply: dict[str, Any] = {
            "id": call.id,
            "status": result.status,
            "exitCode": result.exit_code,
            "stdout": stdout,
            "stderr": stderr,
            "truncated": truncated,
            "durationSeconds": round(time.monotonic() - call.started, 6),
            "message": message,
            "sandboxError": bool(kid.setup_error) or pressed,
        }
        if kid.session is not None:
            reply["sessionAlive"] = session_alive
        if call.fetch:
            reply["files"], cut = staging.fetch(kid.workdir, call.fetch, staging.FETCH_BUDGET_BYTES)
            if cut:
                reply["truncated"] = True
                reply["message"] = _join(
                    reply["message"],
                    f"fetch_files returned at most {staging.FETCH_BUDGET_BYTES} bytes in all;"
                    f" cut short or left out: {', '.join(cut)}",
                )
        if call.session_open:
            if session_alive:
                kid.session = self.next_session
                self.sessions[kid.session] = kid
                self.next_session += 1
                reply["session"] = kid.session
            elif reply["status"] == outcome.OK:
                reply.update(status=outcome.ERROR, message="session process exited while opening")
        self.send(reply)

    def on_readable(self, kid: Child, role: str, drain: bool = False) -> None:
        """Read what a child wrote: up to 1 MiB per wake-up, up to 64 MiB when draining."""
        fd = {"out": kid.out_r, "err": kid.err_r, "ctl": kid.ctl_r}[role]
        for _ in range(1024 if drain else 16):
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            if not data:
                self.close_fd(kid, fd)
                if role == "ctl":
                    kid.trusted = False
                return
            if role == "ctl":
                kid.ctl_buf += data
                try:
                    if len(kid.ctl_buf) > MAX_CONTROL_BYTES:
                        raise ValueError(f"more than {MAX_CONTROL_BYTES} bytes pending")
                    for frame in wire.split(kid.ctl_buf):
                        self.on_control(kid, frame)
                except Exception as exc:  # the code wrote on the control pipe (any garbage: deep JSON too)
                    why = exc.args[0] if isinstance(exc, ControlError) else type(exc).__name__
                    self.violated(kid, f"the code wrote on the sandbox's control pipe ({why}); it is closed")
                    return
            elif kid.call is not None and kid.call.limits.keep_output(role, data):
                self.kill(kid)

    def violated(self, kid: Child, why: str) -> None:
        """Stop listening to a child that broke the protocol and kill it; its call ends as killed.
        Between a session's cells (what its code wrote before it stopped) the next cell answers so."""
        if kid.ctl_r in kid.open_fds:
            self.close_fd(kid, kid.ctl_r)
        if kid.call is None and kid.session is not None:
            kid.violation = why
            return
        if kid.call is not None:
            kid.call.violation = why
        self.kill(kid)

    def on_control(self, kid: Child, frame: Any) -> None:
        """A frame from a child. Only the first is the pool's own word (written before any code
        ran); after it, the code may have written anything, so nothing decides a verdict's fault,
        and a cell's end needs the kernel's word too (end_cell)."""
        if not isinstance(frame, dict):
            raise ControlError("not a JSON object")
        if kid.trusted:
            if not kid.pid and set(frame) == {"pid"} and isinstance(frame["pid"], int) and frame["pid"] > 0:
                kid.pid = frame["pid"]  # its first frame, at its start: still trusted
                return
            kid.trusted = False
            if "setupError" in frame:
                kid.setup_error = str(frame["setupError"])[:MAX_SETUP_ERROR_CHARS]
            elif frame != {"started": True}:
                raise ControlError("not what a starting child writes")
            return
        code = frame.get("exitCode")
        if set(frame) != {"done", "exitCode", "cell"} or not isinstance(code, int) or not 0 <= code <= 255:
            raise ControlError("not the end of a cell")
        if kid.call is None:
            return  # between cells (written before the child stopped itself): nothing to end
        if frame["cell"] != kid.cells:
            raise ControlError("the end of another cell")
        kid.cell_exit = code  # the last word before the child stops counts (the runner's own)
        self.end_cell(kid)

    def end_cell(self, kid: Child) -> None:
        """A session's cell ends once the child said so and the kernel says it stopped: nothing of
        the cell's code runs on (it continues with the next cell, and that cell's deadline)."""
        call = kid.call
        if call is None or kid.cell_exit is None or not kid.stopped:
            return
        if call.limits.exceeded or call.violation:
            return  # killed: answered when it is reaped
        for fd, role in ((kid.out_r, "out"), (kid.err_r, "err")):
            if fd in kid.open_fds:
                self.on_readable(kid, role, drain=True)
        status = outcome.OK if kid.cell_exit == 0 else outcome.ERROR
        self.finish(kid, outcome.Outcome(status, kid.cell_exit, ""), session_alive=True)

    # ---- server messages ------------------------------------------------------------------

    def handle(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op in ("run", "open"):
            float(msg["timeout"])  # the frame and the timeout are checked before a child is used
            kind = layers.RUN if op == "run" else layers.SESSION
            limits = layers.Limits(**msg["limits"])
            frame = layers.request(kind, msg.get("code", ""), limits, msg.get("stdin") or "")
            try:
                files = staging.decode_files(msg.get("files") or {}) if op == "run" else {}
            except (TypeError, ValueError) as exc:
                self.reply_error(msg, outcome.ERROR, f"could not place files: {exc}; send valid files")
                return
            kid = self.take_spare()
            if kid is None:
                why = self.spawn_error or "no free sandbox slot in this worker"
                self.reply_error(msg, outcome.REJECTED, why)
                return
            kid.cpu_seconds = float(msg["limits"]["timeout_seconds"])
            kid.disk_bytes = int(msg.get("diskBytes", 0))
            try:
                staging.place_files(kid.workdir, files, self.uid_base, kid.slot)
                self.start(msg, kid, "run" if op == "run" else "session", frame)
            except Exception as exc:  # never leave a taken child behind: its slot would be lost
                kid.call = None
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                kid.answer_when_reaped = _error(
                    msg, outcome.ERROR, f"could not place files: {why}; send valid files"
                )
                self.kill(kid)
                return
        elif op == "exec":
            float(msg["timeout"])
            frame = layers.request(layers.EXEC, msg.get("code", ""), stdin=msg.get("stdin") or "")
            kid = self.sessions.get(int(msg.get("session", -1)))
            if kid is None or kid.call is not None:
                why = "unknown or closed session" if kid is None else "session is busy with another call"
                self.reply_error(msg, outcome.ERROR, why)
                return
            if kid.violation:  # the code's doing, in its last cell: this cell ends the session
                self.sessions.pop(kid.session or -1, None)
                self.kill(kid)
                self.send(
                    {
                        "id": msg["id"],
                        "status": outcome.KILLED,
                        "exitCode": None,
                        "stdout": "",
                        "stderr": "",
                        "truncated": False,
                        "durationSeconds": 0.0,
                        "message": kid.violation,
                        "sandboxError": False,
                        "sessionAlive": False,
                    }
                )
                return
            self.start(msg, kid, "exec", frame)
        elif op == "close":
            kid = self.sessions.pop(int(msg.get("session", -1)), None)
            if kid is not None:
                kid.session = None
                self.kill(kid)
            self.send({"id": msg["id"], "status": outcome.OK, "closed": kid is not None})
        elif op == "ping":
            recent = time.monotonic() - self.fork_failed_at < FORK_FAILURE_SHOWN_SECONDS
            fork_error = self.fork_error if recent else ""
            problem = self.spawn_error or fork_error
            self.send(
                {
                    "id": msg["id"],
                    "status": outcome.ERROR if problem else outcome.OK,
                    "message": problem,
                    "spawnError": self.spawn_error,  # its directory: not fixed by waiting
                    "forkError": fork_error,  # e.g. the pod's pids, for now
                }
            )
        else:
            self.reply_error(msg, outcome.ERROR, f"unknown worker operation {op!r}")

    def reply_error(self, msg: dict[str, Any], status: str, message: str) -> None:
        self.send(_error(msg, status, message))

    def send(self, message: dict[str, Any]) -> None:
        data = wire.encode(message)
        if len(data) > wire.HEADER_SIZE + wire.MAX_FRAME:  # the server would drop this worker
            message = {
                **message,
                "stdout": "",
                "stderr": "",
                "files": {},
                "status": outcome.ERROR,
                "message": f"the answer was larger than {wire.MAX_FRAME} bytes; ask for less output",
            }
            data = wire.encode(message)
        wire.write_all(self.out_fd, data)

    # ---- loop -----------------------------------------------------------------------------

    def disk_used(self, kid: Child, unmeasured_bytes: int) -> int | None:
        """What a child's directory holds (a file that cannot be measured counts `unmeasured_bytes`);
        None when the tree changed under the walk."""
        try:
            used = tree.usage(kid.workdir)
            if kid.pid and not kid.reaped and self.reads_children:  # what it deleted but holds
                used += tree.held_after_unlink(kid.pid, kid.workdir, unmeasured_bytes)
        except OSError:
            return None
        return used

    def check_deadlines(self) -> float | None:
        """Kill calls past their deadline or their disk budget; seconds until the next check."""
        now = time.monotonic()
        nearest = None
        for kid in self.children.values():
            call = kid.call
            if call is None or call.limits.timed_out or call.limits.disk_exceeded:
                continue
            if call.limits.should_kill(now):
                self.kill(kid)
                continue
            due = min(call.limits.deadline, call.limits.next_disk_check) - now
            nearest = due if nearest is None else min(nearest, due)
        return nearest

    def run(self) -> None:
        self.forker_pid, self.forker, self.huge_bytes = forker.start(
            self.layers, self.slots, self.task_budget
        )
        self.selector.register(self.forker, selectors.EVENT_READ)
        os.set_blocking(self.in_fd, False)
        self.selector.register(self.in_fd, selectors.EVENT_READ)
        self.send({"op": "ready", "pid": os.getpid(), "layers": self.describe()})
        wait = None
        while True:
            if self.wants_spare():
                wait = 0
            for key, _ in self.selector.select(wait):
                if key.fd == self.in_fd:
                    self.on_server()
                elif key.fileobj is self.forker:
                    self.on_forker()
                elif key.fd in self.by_fd:
                    kid, role = self.by_fd[key.fd]
                    try:
                        if role == "req":
                            self.write_request(kid)
                        else:
                            self.on_readable(kid, role)
                    except Exception:  # one child's trouble must not end every call on this worker
                        traceback.print_exc()
                        self.violated(kid, "the sandbox could not handle this call's output; it was killed")
            # Deadlines after the events: a child that exited in time is reaped (with its own
            # status) before a late wake-up of this worker could call it a timeout.
            wait = self.check_deadlines()
            if self.wants_spare():
                spare = self.spawn()
                if spare is not None:
                    self.spares.append(spare)
            elif len(self.spares) < self.spare_target and self.free_slots:  # paused after a failed fork
                pause = self.fork_failed_at + SPAWN_PAUSE_SECONDS - time.monotonic()
                wait = max(pause, 0.0) if wait is None else max(min(wait, pause), 0.0)

    def wants_spare(self) -> bool:
        return (
            len(self.spares) < self.spare_target
            and bool(self.free_slots)
            and time.monotonic() >= self.fork_failed_at + SPAWN_PAUSE_SECONDS
        )

    def on_server(self) -> None:
        try:
            data = os.read(self.in_fd, 1 << 20)
        except BlockingIOError:
            return
        if not data:
            self.shutdown()
        self.inbox += data
        for msg in wire.split(self.inbox):
            try:
                self.handle(msg)
            except Exception as exc:
                self.reply_error(msg, outcome.ERROR, f"malformed worker request: {exc!r}")

    def shutdown(self) -> None:
        """Kill the forker: its children die with it (PR_SET_PDEATHSIG); remove their directories."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.forker_pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.forker_pid, 0)
        for kid in self.children.values():
            with contextlib.suppress(OSError):
                tree.remove(kid.workdir)
        os._exit(0)

    def describe(self) -> dict[str, Any]:
        return {
            "lease": self.lease.number,
            "hugePagesMiB": self.huge_bytes >> 20,
            "landlockAbi": self.landlock_abi,
            "seccomp": True,
            "taskLimit": bool(self.layers.task_filter),  # threads per call bounded by the forker
            "taskBudget": self.task_budget,  # tasks of all this worker's children together
            "noNewPrivs": True,
            "uidBase": self.uid_base,
            "preloaded": sorted(m for m in preload.PRELOAD if m in sys.modules),
        }


def _read_only_paths() -> tuple[str, ...]:
    """What a child may read: the interpreter with its libraries, shared libraries, time zones and
    a few devices. Not the current directory, not /etc, not /proc, not /tmp."""
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        *site.getsitepackages(),
        "/usr/lib",
        "/usr/lib64",
        "/lib",
        "/lib64",
        "/usr/local/lib",
        "/usr/share/zoneinfo",
        "/etc/localtime",
        "/dev/null",
        "/dev/zero",
        "/dev/urandom",
        "/dev/random",
    ]
    dirs: list[str] = []
    files: list[str] = []
    for path in candidates:
        if os.path.isdir(path):
            real = os.path.realpath(path)
            if not any(real == d or real.startswith(d + os.sep) for d in dirs):
                dirs = [d for d in dirs if not d.startswith(real + os.sep)] + [real]
        elif os.path.exists(path):
            files.append(path)
    return tuple(dirs + files)


def _join(message: str, more: str) -> str:
    return f"{message}; {more}" if message else more


def _error(msg: dict[str, Any], status: str, message: str) -> dict[str, Any]:
    """The worker's answer to a call that no code ran for."""
    return {"id": msg.get("id"), **outcome.no_run_reply(status, message)}
