"""Issue 35: no argument, program or peer turns a model's failure into the pool's (`infra`) or stops the
pool. Each class is tested with the server as root (a uid per child) and as in its pod (the server as
nobody, children sharing its uid), on one pool per mode serving a python tool (and no search tool), a
function tool with a hostile schema, an `http` tool whose API quotes its input and a remote MCP server."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
from harness.sandbox_process import SandboxProcess
from harness.tiers import process_tier

REMOTE_MCP_SERVER = Path(__file__).with_name("remote_mcp_server.py")
HEARTBEAT_SECONDS = 1.0
MAX_SESSIONS = 3
BIG_ANSWER = 200 << 20  # an upstream's answer far past what the pool keeps (maxOutputBytes 4096)
READ_BOUND = 1 << 20  # what the pool reads of such an answer: 16 x maxOutputBytes, at least 1 MiB

SOURCE = """\
import json


def check(**arguments):
    return f"text of {len(arguments['text'])} characters" if "text" in arguments else "checked"


def _ratio(a, b):
    return a / b


def ratio(a, b):
    return _ratio(a, b) * 100


def parse(text):
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RuntimeError("not JSON: " + text) from exc
"""
# A schema a user may well write, with a pattern that backtracks catastrophically on "aaa...a!" (in
# Python's re and in the regex engine alike) and
# uniqueItems over arrays of objects (quadratic in jsonschema).
CHECK_SCHEMA = {
    "type": "object",
    "properties": {
        "word": {"type": "string", "pattern": "^(a|aa)+$"},
        "items": {"type": "array", "uniqueItems": True},
        "text": {"type": "string"},
    },
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Quoting(BaseHTTPRequestHandler):
    """An API that quotes its input: answers `{"you_sent": <the body>}`."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path in (
            "/big",
            "/endless",
        ):  # far past maxOutputBytes in pieces; endless: until the pool leaves
            self.send_response(200)
            if self.path == "/big":
                self.send_header("Content-Length", str(BIG_ANSWER))
            self.end_headers()
            with contextlib.suppress(OSError):
                for _ in range(BIG_ANSWER >> 20) if self.path == "/big" else iter(int, 1):
                    self.wfile.write(b"x" * (1 << 20))
            return
        answer = json.dumps({"you_sent": json.loads(body)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


class _HugeMcp(BaseHTTPRequestHandler):
    """An MCP server (handshake era, a session id, one JSON-RPC message per POST) whose one tool, `big`,
    answers `{"bytes": N}` with a text of N bytes made as it is sent: as JSON, or as one SSE event
    (`"sse": true`), or gzip-compressed though the pool asked for none (`"gzip": true`)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._send(405, b"")

    def do_DELETE(self) -> None:
        self._send(200, b"")

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _answer(self, ident: Any, result: dict[str, Any], **headers: str) -> None:
        body = json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}).encode()
        self._send(200, body, {"Content-Type": "application/json", **headers})

    def do_POST(self) -> None:
        message = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        method, ident = message.get("method"), message.get("id")
        if ident is None:  # a notification
            self._send(202, b"")
        elif method == "initialize":
            info = {"name": "huge", "version": "1"}
            version = message["params"]["protocolVersion"]
            result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
            self._answer(ident, result, **{"Mcp-Session-Id": "s1"})
        elif method == "tools/list":
            flags = {"sse": {"type": "boolean"}, "gzip": {"type": "boolean"}}
            schema = {"type": "object", "properties": {"bytes": {"type": "integer"}, **flags}}
            self._answer(ident, {"tools": [{"name": "big", "inputSchema": schema}]})
        elif method == "tools/call":
            self._big(ident, message["params"]["arguments"])
        else:
            error = {"code": -32601, "message": f"no method {method}"}
            body = json.dumps({"jsonrpc": "2.0", "id": ident, "error": error}).encode()
            self._send(200, body, {"Content-Type": "application/json"})

    def _big(self, ident: Any, arguments: dict[str, Any]) -> None:
        size, sse = arguments["bytes"], arguments.get("sse", False)
        result = {"content": [{"type": "text", "text": "@"}], "isError": False}
        before, after = json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}).encode().split(b"@")
        if sse:
            before, after = b"event: message\ndata: " + before, after + b"\n\n"
        if arguments.get("gzip"):
            squeeze = zlib.compressobj(wbits=31)  # gzip, made piece by piece
            parts = [squeeze.compress(before)]
            parts += [squeeze.compress(b"x" * min(1 << 20, size - at)) for at in range(0, size, 1 << 20)]
            body = b"".join([*parts, squeeze.compress(after), squeeze.flush()])
            headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
            return self._send(200, body, headers)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream" if sse else "application/json")
        self.send_header("Content-Length", str(len(before) + size + len(after)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the pool may stop reading
            self.wfile.write(before)
            for start in range(0, size, 1 << 20):
                self.wfile.write(b"x" * min(1 << 20, size - start))
            self.wfile.write(after)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
@process_tier
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(the quoting API's url, the remote MCP server's url, the huge MCP server's url), on loopback."""
    api = ThreadingHTTPServer(("127.0.0.1", 0), _Quoting)
    threading.Thread(target=api.serve_forever, daemon=True).start()
    huge = ThreadingHTTPServer(("127.0.0.1", 0), _HugeMcp)
    threading.Thread(target=huge.serve_forever, daemon=True).start()
    port = free_port()
    log = (tmp_path_factory.mktemp("remote-mcp") / "remote.log").open("wb")
    remote = subprocess.Popen([sys.executable, str(REMOTE_MCP_SERVER), str(port)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert remote.poll() is None and time.monotonic() < deadline, (
                "the remote MCP server did not start"
            )
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        yield (
            f"http://127.0.0.1:{api.server_port}/",
            f"http://127.0.0.1:{port}/mcp",
            f"http://127.0.0.1:{huge.server_port}/mcp",
        )
    finally:
        api.shutdown()
        huge.shutdown()
        remote.terminate()
        remote.wait(15)
        log.close()


def _tools(source: Path, api: str, mcp: str, huge: str) -> list[dict[str, Any]]:
    return [
        {"name": "python", "type": "python", "timeoutSeconds": 5, "maxProcesses": 256},
        {
            "name": "check",
            "type": "function",
            "function": {"configMap": {"name": "tools", "key": "tools.py"}},
            "parameters": CHECK_SCHEMA,
            "source": str(source),
            "timeoutSeconds": 5,
        },
        *(
            {
                "name": name,
                "type": "function",
                "function": {"configMap": {"name": "tools", "key": "tools.py"}},
                "parameters": {"type": "object", "properties": properties},
                "source": str(source),
                "timeoutSeconds": 5,
            }
            for name, properties in [
                ("ratio", {"a": {"type": "number"}, "b": {"type": "number"}}),
                ("parse", {"text": {"type": "string"}}),
            ]
        ),
        {"name": "echo", "type": "http", "url": api, "timeoutSeconds": 5, "maxRetries": 2},
        {"name": "big", "type": "http", "url": api + "big", "timeoutSeconds": 30, "maxOutputBytes": 4096},
        {
            "name": "endless",
            "type": "http",
            "url": api + "endless",
            "maxOutputBytes": 4096,
            "timeoutSeconds": 10,
        },
        {
            "name": "remote",
            "type": "mcp",
            "mcp": {"url": mcp},
            "timeoutSeconds": 5,
            "maxRetries": 2,
            "retryDelaySeconds": 0.5,
        },
        {
            "name": "huge",
            "type": "mcp",
            "mcp": {"url": huge},
            "timeoutSeconds": 30,
            "maxOutputBytes": 4096,
            "maxRetries": 2,
            "retryDelaySeconds": 0.5,
        },
    ]


MAX_BODY = 80 << 20  # past the worker frame (64 MiB)
MAX_TASKS = 64  # the pod's task budget: 32 per worker, below a call's maxProcesses
ARGS = (
    "--max-sessions",
    str(MAX_SESSIONS),
    "--ws-heartbeat-seconds",
    str(HEARTBEAT_SECONDS),
    "--max-body-bytes",
    str(MAX_BODY),
    "--max-tasks",
    str(MAX_TASKS),
)


@pytest.fixture(scope="module", params=["root", "pod"])
@process_tier
def pool(
    request: pytest.FixtureRequest, upstreams: tuple[str, str, str], server_in_mode: Any
) -> Iterator[SandboxProcess]:
    root = Path(tempfile.mkdtemp(prefix="toolrl-holds-"))
    try:
        os.chmod(root, 0o755)  # the pod's server (nobody) reads the function's source
        source = root / "tools.py"
        source.write_text(SOURCE)
        source.chmod(0o644)
        python = request.getfixturevalue("debian_python")
        with server_in_mode(request.param, *ARGS, tools=_tools(source, *upstreams), python=python) as running:
            yield running
    finally:
        shutil.rmtree(root, ignore_errors=True)


def execute(pool: SandboxProcess, tool: str, arguments: Any) -> dict[str, Any]:
    answer = pool.post("/v1/execute", {"tool": tool, "input": arguments})
    assert answer.status_code == 200, answer.text
    return answer.json()


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"k": value}
    return value


# 5 -------------------------------------------------------------------------------------------------


def test_a_verltool_tag_for_a_tool_the_pool_lacks_is_the_models_fault(pool: SandboxProcess) -> None:
    """The model chose `<search>` in a pool without a search tool: its failure, not the pool's."""
    answer = pool.post(
        "/get_observation",
        {"trajectory_ids": ["t-search"], "actions": ["<search>capital of France</search>"]},
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["faults"] == ["code"] and body["valids"] == [False], body
    assert "no search tool" in body["observations"][0] and "python" in body["observations"][0], body


# 3, 4 ----------------------------------------------------------------------------------------------


def test_mcp_arguments_the_client_cannot_send_are_the_callers_fault(pool: SandboxProcess) -> None:
    """A lone surrogate, or nesting past what the MCP client serialises, is the caller's (no retry,
    no infra), at every depth around the client's limit."""
    started = time.monotonic()
    lone = execute(pool, "remote__fail", {"reason": "\ud800"})
    assert (lone["status"], lone["fault"]) == ("error", "code"), lone
    assert "surrogate" in lone["message"], lone
    for depth in (250, 252, 253, 254, 255, 256, 300):
        deep = execute(pool, "remote__add", {"a": 1, "b": 2, "x": nested(depth)})
        assert deep["fault"] != "infra", (depth, deep)
        if deep["status"] != "ok":
            assert deep["fault"] == "code" and "nest" in deep["message"], (depth, deep)
    assert execute(pool, "remote__add", {"a": 1, "b": 2, "x": nested(300)})["fault"] == "code"
    assert time.monotonic() - started < 5, "arguments that cannot be sent were retried"
    assert execute(pool, "remote__add", {"a": 1, "b": 2})["output"] == "3"


def test_an_http_api_quoting_a_lone_surrogate_is_answered_not_500(pool: SandboxProcess) -> None:
    """The upstream answers with the caller's lone surrogate quoted back: an answer (never HTTP 500,
    never infra) on /v1/execute, /mcp and /step."""
    arguments = {"q": "x\ud800y"}
    native = execute(pool, "echo", arguments)
    assert native["status"] == "ok" and native["fault"] is None and "you_sent" in native["output"], native
    mcp = pool.post(
        "/mcp",
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": arguments},
        },
    )
    assert mcp.status_code == 200, mcp.text
    assert mcp.json()["result"]["structuredContent"]["fault"] is None, mcp.text
    step = pool.post("/step", {"action": {"tool": "echo", "arguments": arguments}})
    assert step.status_code == 200 and step.json()["observation"]["fault"] is None, step.text


# 6 -------------------------------------------------------------------------------------------------


def _while_probing(pool: SandboxProcess, call: Any) -> tuple[Any, int, float]:
    """Run `call` while /healthz is probed: (its result, the probes answered meanwhile and the one in
    flight at its end, the CPU seconds the server's event loop thread (its main thread) spent
    meanwhile). A check run on the event loop
    spends its CPU there and answers no probe until it ends; run beside it, it spends its CPU in another
    thread. CPU seconds, not a probe's wall time: on a machine loaded by other work a probe of a loop that
    is not blocked took 2 s (CI)."""
    answered, done = 0, threading.Event()

    def probe() -> None:
        nonlocal answered
        while not done.is_set():
            requests.get(pool.url + "/healthz", timeout=120)
            answered += 1
            time.sleep(0.05)

    pid = pool.process.pid
    assert b"tool_sandbox" in Path(f"/proc/{pid}/cmdline").read_bytes(), "not the server's own process"
    with ThreadPoolExecutor(1) as prober:
        probing = prober.submit(probe)
        time.sleep(0.2)
        before, counted = _thread_cpu_seconds(pid, pid), answered
        try:
            result = call()
        finally:
            loop_cpu = _thread_cpu_seconds(pid, pid) - before
            done.set()
        probing.result()  # the probe in flight when the call ended counts: under load one probe can
        # outlast a call that never blocked the loop (ci8: none answered during a quick check)
    return result, answered - counted, loop_cpu


def _thread_cpu_seconds(pid: int, tid: int) -> float:
    """User + system CPU seconds of one thread (/proc/PID/task/TID/stat: fields 14 and 15, in ticks)."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# A check on the event loop spent seconds of CPU there (27 characters: seconds; 35: hours); the loop's
# own work while one call is checked and /healthz is probed is milliseconds.
LOOP_CPU_SECONDS = 0.5


def test_a_catastrophic_pattern_never_freezes_the_pool(pool: SandboxProcess) -> None:
    """27 characters froze every call and every probe for seconds, 35 for hours."""
    for word in ("a" * 27 + "!", "a" * 60 + "!"):
        answer, probes, loop_cpu = _while_probing(
            pool, lambda word=word: execute(pool, "check", {"word": word})
        )
        assert (answer["status"], answer["fault"]) == ("error", "code"), answer
        assert "word" in answer["message"] and "^(a|aa)+$" in answer["message"], answer
        assert loop_cpu < LOOP_CPU_SECONDS and probes >= 1, (len(word), loop_cpu, probes)
    assert "in the time a call's arguments may take" in answer["message"], answer
    assert execute(pool, "check", {"word": "aaaa"})["output"] == "checked"


def test_unique_items_over_large_arrays_never_freezes_the_pool(pool: SandboxProcess) -> None:
    items = [{"n": i} for i in range(4000)]  # ~36 KiB of distinct objects
    answer, probes, loop_cpu = _while_probing(pool, lambda: execute(pool, "check", {"items": items}))
    assert answer["status"] == "ok", answer
    assert loop_cpu < LOOP_CPU_SECONDS and probes >= 1, (loop_cpu, probes)
    repeated = execute(pool, "check", {"items": [*items, {"n": 7}]})
    assert repeated["fault"] == "code" and "unique" in repeated["message"], repeated
    assert execute(pool, "check", {"items": [1, 1.0]})["fault"] == "code"  # JSON equality: 1 == 1.0
    assert (
        execute(pool, "check", {"items": [1, True, [0], [False], {"a": 0}, {"a": False}]})["status"] == "ok"
    )


# 12 ------------------------------------------------------------------------------------------------


def _post_raw(pool: SandboxProcess, body: dict[str, Any]) -> dict[str, Any]:
    data = json.dumps(body, ensure_ascii=False).encode()
    answer = requests.post(
        pool.url + "/v1/execute", data=data, headers={"Content-Type": "application/json"}, timeout=180
    )
    assert answer.status_code == 200, answer.text[:1000]
    return answer.json()


def test_function_arguments_in_non_ascii_text_reach_the_function(pool: SandboxProcess) -> None:
    """A 19 MiB body of 2-byte characters was re-escaped (x3.5) past the worker frame: infra."""
    characters = 19 << 19  # 19 MiB in UTF-8
    result = _post_raw(pool, {"tool": "check", "input": {"text": "é" * characters}})
    short = {key: str(value)[:300] for key, value in result.items()}
    assert (result["status"], result["output"]) == ("ok", f"text of {characters} characters"), short


def test_a_call_too_large_for_the_sandbox_is_the_callers_fault(pool: SandboxProcess) -> None:
    """A body under --max-body-bytes whose call does not fit the worker frame: the caller's to shrink."""
    result = _post_raw(pool, {"tool": "python", "input": "print(1)\n#" + "x" * (65 << 20)})
    short = {key: str(value)[:300] for key, value in result.items()}
    assert (result["status"], result["fault"]) == ("error", "code"), short
    assert "send less" in result["message"] and not result["sandboxError"], short
    assert execute(pool, "python", "print(1)")["stdout"] == "1\n"


# function tracebacks ----------------------------------------------------------------------------------


def _line(text: str) -> int:
    """The line of SOURCE (the function tool's file, tools.py) that is `text`."""
    return SOURCE.splitlines().index(text) + 1


def test_a_raising_functions_traceback_shows_its_lines_but_no_source_and_no_path(
    pool: SandboxProcess,
) -> None:
    """The function's source is not the model's to read, nor are the worker's paths: a raising
    function's traceback is its exception and the lines of its own file that raised it."""
    ratio = execute(pool, "ratio", {"a": 1, "b": 0})
    assert (ratio["status"], ratio["fault"]) == ("error", "code"), ratio
    assert ratio["stderr"] == (
        "Traceback (most recent call last):\n"
        f'  File "tools.py", line {_line("    return _ratio(a, b) * 100")}, in ratio\n'
        f'  File "tools.py", line {_line("    return a / b")}, in _ratio\n'
        "ZeroDivisionError: division by zero\n"
    ), ratio
    raised = _line('        raise RuntimeError("not JSON: " + text) from exc')
    parsed = execute(pool, "parse", {"text": "{oops"})
    assert (parsed["status"], parsed["fault"]) == ("error", "code"), parsed
    assert parsed["stderr"] == (
        "Traceback (most recent call last):\n"
        f'  File "tools.py", line {_line("        return json.loads(text)")}, in parse\n'
        "json.decoder.JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2"
        " (char 1)\n"
        "\nThe above exception was the direct cause of the following exception:\n\n"
        "Traceback (most recent call last):\n"
        f'  File "tools.py", line {raised}, in parse\n'
        "RuntimeError: not JSON: {oops\n"
    ), parsed
    for answer in (ratio, parsed):
        shown = json.dumps(answer)
        assert "/" not in shown and "main.py" not in shown and "tool_function" not in shown, answer
    assert execute(pool, "ratio", {"a": 1, "b": 4})["output"] == "25.0"


# 1 -------------------------------------------------------------------------------------------------

THREADS_UNTIL_REFUSED = """\
import threading
threading.stack_size(64 << 10)  # small stacks: the task budget, not memory, is what runs out
stop, started = threading.Event(), []
try:
    while True:
        thread = threading.Thread(target=stop.wait)
        thread.start()
        started.append(thread)
except RuntimeError:
    stop.set()
    raise SystemExit(f"started {len(started)} threads, then none more")
"""


def test_a_call_refused_threads_after_taking_its_share_is_the_codes_fault(pool: SandboxProcess) -> None:
    """A program starting threads until refused, then failing: the budget went to its own threads (it
    held more than its fair share, the budget over the worker's live children), not to other calls'."""
    for _ in range(2):
        result = execute(pool, "python", THREADS_UNTIL_REFUSED)
        assert (result["status"], result["fault"], result["sandboxError"]) == ("error", "code", False), result
        assert "then none more" in result["stderr"] and "used up by other calls" not in result["message"], (
            result
        )
    assert execute(pool, "python", "print(1)")["stdout"] == "1\n"


# 9 -------------------------------------------------------------------------------------------------


def _kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _with_peak(pool: SandboxProcess, call: Any) -> tuple[Any, float]:
    """(what `call()` returns, how far the server's peak RSS rose above its RSS before, MiB): the
    kernel's high-water mark (VmHWM), reset first, so no peak between samples is missed."""
    pid = pool.process.pid
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM := VmRSS
    before = _kib(pid, "VmRSS")
    result = call()
    return result, (_kib(pid, "VmHWM") - before) / 1024


def _short(result: dict[str, Any]) -> dict[str, str]:
    return {key: str(value)[:300] for key, value in result.items()}


@pytest.mark.parametrize("tool", ["big", "endless"])
def test_an_http_answer_is_read_only_up_to_a_bound(pool: SandboxProcess, tool: str) -> None:
    """A 200 MiB answer, or one that never ends, for a tool keeping 4 KiB: the first 4 KiB kept, the
    rest read and dropped up to the bound (16 x maxOutputBytes, at least 1 MiB), then not read at all."""
    started = time.monotonic()
    result, grew = _with_peak(pool, lambda: execute(pool, tool, {}))
    assert (result["status"], result["fault"], result["truncated"]) == ("ok", None, True), _short(result)
    marker = f"\n[... output truncated: more than {READ_BOUND} bytes, first 4096 shown ...]"
    assert result["output"] == "x" * 4096 + marker, _short(result)
    assert grew < 24, f"the server's peak RSS grew by {grew:.0f} MiB"
    assert time.monotonic() - started < 5, "the answer was read past the bound"


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
def test_an_mcp_answer_past_the_bound_is_refused_unread(pool: SandboxProcess, sse: bool) -> None:
    """A remote tool's 200 MiB answer (as JSON, or as one SSE event) for a tool keeping 4 KiB: read up to
    the bound (16 x maxOutputBytes, at least 1 MiB), then refused without retries as the call's own
    (what it asked for), as a program's output is past 16 x maxOutputBytes; never held whole (the SDK
    read a JSON answer whole: +1 GiB)."""
    started = time.monotonic()
    arguments = {"bytes": BIG_ANSWER, "sse": sse}
    result, grew = _with_peak(pool, lambda: execute(pool, "huge__big", arguments))
    assert (result["status"], result["fault"], result["truncated"]) == ("error", "code", True), _short(result)
    assert f"more than {READ_BOUND} bytes" in result["message"], _short(result)
    assert "maxOutputBytes" in result["message"] and result["message"] in result["stderr"], _short(result)
    assert grew < 24, f"the server's peak RSS grew by {grew:.0f} MiB"
    assert time.monotonic() - started < 5, "the answer was read whole or the call retried"
    assert execute(pool, "huge__big", {"bytes": 3, "sse": sse})["output"] == "xxx"


@pytest.mark.parametrize("sse", [False, True], ids=["json", "sse"])
def test_mcp_answers_within_the_bound_are_unchanged(pool: SandboxProcess, sse: bool) -> None:
    """Answers up to the bound are read and cut to maxOutputBytes as before."""
    small = execute(pool, "huge__big", {"bytes": 10, "sse": sse})
    assert (small["status"], small["output"], small["truncated"]) == ("ok", "x" * 10, False), small
    for size in (100 << 10, READ_BOUND - (1 << 10)):
        result = execute(pool, "huge__big", {"bytes": size, "sse": sse})
        marker = f"\n[... output truncated: {size} bytes, first 4096 shown ...]"
        assert (result["status"], result["fault"], result["truncated"]) == ("ok", None, True), _short(result)
        assert result["output"] == "x" * 4096 + marker, _short(result)
    assert execute(pool, "remote__add", {"a": 1, "b": 2})["output"] == "3"


def test_a_compressed_mcp_answer_is_refused_before_it_inflates(pool: SandboxProcess) -> None:
    """The pool asks for answers uncompressed; a server compressing anyway (200 KiB of gzip, 200 MiB of
    JSON) is not inflated past the bound: refused as the server's failure."""
    result, grew = _with_peak(pool, lambda: execute(pool, "huge__big", {"bytes": BIG_ANSWER, "gzip": True}))
    assert (result["status"], result["fault"]) == ("error", "infra"), _short(result)
    assert "compressed" in result["message"], _short(result)
    assert grew < 24, f"the server's peak RSS grew by {grew:.0f} MiB"


# 8 -------------------------------------------------------------------------------------------------


def test_a_body_of_many_small_values_is_refused_before_it_is_parsed(pool: SandboxProcess) -> None:
    """A 31 MiB body of small objects, within the size limit, held ~800 MiB while parsed: one of more
    than 2^20 values is refused (413) unparsed; a large body of a few values (one long string, however many
    commas it holds) is read as before."""
    small_objects = b'{"tool": "python", "input": "print(1)", "extra": [' + b"{}," * (10 << 20) + b"{}]}"
    assert len(small_objects) < 32 << 20
    refused, grew = _with_peak(
        pool, lambda: requests.post(f"{pool.url}/v1/execute", data=small_objects, timeout=120)
    )
    assert refused.status_code == 413, refused.text[:300]
    assert "JSON values" in refused.json()["error"] and "send fewer" in refused.json()["error"], refused.text
    assert grew < 128, f"the server's peak RSS grew by {grew:.0f} MiB (reading the body takes ~90)"
    commas = "# " + "1, " * (2 << 20) + "\nprint('read')"  # 6 MiB, 2^21 commas inside one string
    assert execute(pool, "python", commas)["output"] == "read\n"


# 13 ------------------------------------------------------------------------------------------------

COPY = """\
import shutil
open("src.txt", "w").write("data")
shutil.copy("src.txt", "dst.txt")
"""
POOL = """\
import multiprocessing
with multiprocessing.Pool(2) as pool:
    print(pool.map(abs, [-1, -2]))
"""
SUBPROCESS = "import subprocess\nsubprocess.run(['true'])\n"


@pytest.mark.parametrize(
    ("program", "says"),
    [
        (COPY, "the sandbox refuses chmod and chown, on the call's own files too"),
        (COPY, "use shutil.copyfile"),
        (POOL, "the sandbox refuses new processes"),
        (POOL, "multiprocessing.pool.ThreadPool"),
        (SUBPROCESS, "the sandbox refuses new processes"),
    ],
)
def test_what_the_sandbox_refuses_is_said_in_the_error(pool: SandboxProcess, program: str, says: str) -> None:
    """shutil.copy and multiprocessing.Pool work under `python main.py`; here they fail with an error
    that says what the sandbox refuses, why, and what to use instead (still the code's failure)."""
    answer = pool.post("/run_code", {"code": program, "language": "python"}).json()
    run = answer["run_result"]
    assert answer["status"] == "Failed" and run["return_code"] == 1, answer
    assert "PermissionError: [Errno 1] Operation not permitted: " in run["stderr"], run["stderr"]
    assert says in run["stderr"], run["stderr"]
    native = execute(pool, "python", program)
    assert (native["status"], native["fault"]) == ("error", "code") and says in native["stderr"], native


# 7, 10, 11 (/ws) -------------------------------------------------------------------------------------


def _ws_connect(pool: SandboxProcess, extensions: str = "") -> tuple[socket.socket, str]:
    """A raw WebSocket handshake at /ws: (the socket, the answer's head)."""
    host, port = pool.url.removeprefix("http://").rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    head = [
        "GET /ws HTTP/1.1",
        f"Host: {host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if extensions:
        head.append(f"Sec-WebSocket-Extensions: {extensions}")
    raw.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = raw.recv(4096)
        assert chunk, f"the server closed during the handshake: {got!r}"
        got += chunk
    return raw, got.decode("latin-1")


def _frame(payload: bytes, opcode: int = 1, rsv1: bool = False) -> bytes:
    """A masked client frame."""
    first = 0x80 | (0x40 if rsv1 else 0) | opcode
    size = len(payload)
    if size < 126:
        header = bytes([first, 0x80 | size])
    elif size < 1 << 16:
        header = bytes([first, 0x80 | 126]) + size.to_bytes(2, "big")
    else:
        header = bytes([first, 0x80 | 127]) + size.to_bytes(8, "big")
    mask = os.urandom(4)
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _read_frame(raw: socket.socket) -> tuple[int, bytes] | None:
    """(opcode, payload) of the server's next frame; None when the connection is closed."""

    def exactly(size: int) -> bytes | None:
        got = b""
        while len(got) < size:
            chunk = raw.recv(size - len(got))
            if not chunk:
                return None
            got += chunk
        return got

    head = exactly(2)
    if head is None:
        return None
    size = head[1] & 0x7F
    if size == 126:
        size = int.from_bytes(exactly(2) or b"\0\0", "big")
    elif size == 127:
        size = int.from_bytes(exactly(8) or b"\0" * 8, "big")
    payload = exactly(size)
    return (head[0] & 0x0F, payload) if payload is not None else None


def _next_data_frame(raw: socket.socket) -> tuple[int, bytes] | None:
    """The next frame that is not a ping (answering none of them)."""
    while (frame := _read_frame(raw)) is not None and frame[0] == 9:
        pass
    return frame


def test_the_websocket_refuses_compressed_frames(pool: SandboxProcess) -> None:
    """permessage-deflate is never negotiated, and a compressed frame ends the connection unread: a
    small frame could inflate to gigabytes of JSON."""
    raw, head = _ws_connect(pool, "permessage-deflate; client_max_window_bits")
    with raw:
        assert head.startswith("HTTP/1.1 101"), head
        assert "permessage-deflate" not in head.lower(), head
        message = b'{"type": "state", "data": {}' + b" " * (8 << 20) + b"}"
        squeezed = zlib.compressobj(wbits=-15)
        body = squeezed.compress(message) + squeezed.flush(zlib.Z_SYNC_FLUSH)
        raw.sendall(_frame(body[:-4], rsv1=True))
        answer = _next_data_frame(raw)
        assert answer is None or answer[0] == 8, answer  # closed, never answered
    assert requests.get(pool.url + "/healthz", timeout=10).status_code == 200


def test_a_deeply_nested_websocket_step_is_answered_like_a_step(pool: SandboxProcess) -> None:
    """The same call on /ws and /step gets the same answer at any nesting, and the episode goes on."""
    raw, head = _ws_connect(pool)
    with raw:
        assert head.startswith("HTTP/1.1 101"), head
        raw.sendall(_frame(json.dumps({"type": "reset", "data": {}}).encode()))
        assert (_next_data_frame(raw) or (0, b""))[0] == 1
        steps = 0
        for tool in ("check", "echo", "remote__add"):
            for depth in (600, 800, 900, 930, 950, 960, 970):
                deep = '{"k": ' * depth + "1" + "}" * depth  # as text: json.dumps would recurse here
                step = f'{{"tool": "{tool}", "arguments": {{"a": 1, "b": 2, "items": [{deep}]}}}}'
                over_http = requests.post(pool.url + "/step", data=f'{{"action": {step}}}', timeout=60)
                raw.sendall(_frame(f'{{"type": "step", "data": {step}}}'.encode()))
                answer = _next_data_frame(raw)
                assert answer is not None and answer[0] == 1, (tool, depth, answer, pool.log_tail())
                observed = json.loads(answer[1])
                if over_http.status_code != 200:
                    assert observed["type"] == "error", (tool, depth, observed, over_http.text)
                    continue
                steps += 1
                assert observed["type"] == "observation", (tool, depth, observed)
                seen, want = observed["data"]["observation"], over_http.json()["observation"]
                assert (seen["status"], seen["fault"]) == (want["status"], want["fault"]), (
                    tool,
                    depth,
                    seen,
                    want,
                )
        raw.sendall(_frame(json.dumps({"type": "state"}).encode()))
        state = _next_data_frame(raw)
        assert state is not None and json.loads(state[1])["data"]["step_count"] == steps, state


def test_dead_websocket_clients_free_their_slots(pool: SandboxProcess) -> None:
    """Clients that stop answering (a trainer pod gone without closing) hold no OpenEnv slot for long:
    the server's pings go unanswered and it closes them."""
    dead = [_ws_connect(pool) for _ in range(MAX_SESSIONS)]
    with contextlib.ExitStack() as stack:
        for raw, head in dead:
            stack.enter_context(raw)
            assert head.startswith("HTTP/1.1 101"), head
        full = requests.get(pool.url + "/ws", headers={"Upgrade": "websocket"}, timeout=10)
        assert full.status_code == 429, full.text
        deadline = time.monotonic() + 10 * HEARTBEAT_SECONDS
        while time.monotonic() < deadline:
            raw, head = _ws_connect(pool)
            raw.close()
            if head.startswith("HTTP/1.1 101"):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("sockets whose clients never answer held every OpenEnv slot")
