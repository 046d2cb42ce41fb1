"""Issue 24: HTTP and lifecycle faults. One request, or a few, could take the server's memory, its
execution slots or another caller's session, or outlive its shutdown; each class is tested with the
server as root and as in its pod (children share its uid)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path

import pytest
import requests
from harness.localcluster.cluster import free_port
from harness.sandbox_process import SandboxProcess, recovered

BODY_LIMIT = 32 << 20  # the server's default --max-body-bytes


@pytest.fixture(scope="module", params=["root", "pod"])
def any_server(request: pytest.FixtureRequest) -> SandboxProcess:
    return request.getfixturevalue("server" if request.param == "root" else "pod_server")


@pytest.fixture(params=["root", "pod"])
def make_any_server(
    request: pytest.FixtureRequest,
    make_server: Callable[..., SandboxProcess],
    make_pod_server: Callable[..., SandboxProcess],
) -> Callable[..., SandboxProcess]:
    """A dedicated server with extra flags, as root or as in its pod."""
    return make_server if request.param == "root" else make_pod_server


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError(f"no VmRSS for {pid}")


def _peak_rss_while(pid: int, work: Callable[[], object]) -> tuple[int, object]:
    """The highest RSS of `pid` (sampled every 10 ms) while `work()` runs, and what it returned."""
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(work)
        peak = _rss(pid)
        while not running.done():
            peak = max(peak, _rss(pid))
            time.sleep(0.01)
        return max(peak, _rss(pid)), running.result()


def _post_raw(server: SandboxProcess, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    connection = HTTPConnection("127.0.0.1", int(server.url.rsplit(":", 1)[1]), timeout=120)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@functools.cache
def _bomb(encoding: str) -> bytes:
    """A JSON call whose body inflates to 1 GiB, compressed to about 1 MiB (5 s of a core each: made
    once per encoding)."""
    wbits = {"deflate": zlib.MAX_WBITS, "gzip": 16 + zlib.MAX_WBITS}[encoding]
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    spaces = b" " * (1 << 20)
    parts = [packer.compress(b'{"tool": "python", "input": "')]
    parts += [packer.compress(spaces) for _ in range(1024)]
    return b"".join([*parts, packer.compress(b'"}'), packer.flush()])


def _send_bomb(server: SandboxProcess, encoding: str, body: bytes) -> int:
    """The answer's status, or 0 when the server closed the connection while the body was still
    being sent (it refuses without reading the rest)."""
    try:
        status, _ = _post_raw(
            server, "/v1/execute", body, {"Content-Encoding": encoding, "Content-Type": "application/json"}
        )
    except (BrokenPipeError, ConnectionResetError):
        return 0
    return status


def test_a_compressed_body_is_refused_before_it_inflates(any_server: SandboxProcess) -> None:
    """A small deflate body inflating to 1 GiB got 413, but the server went on inflating and held
    ~250 MiB per request for seconds: a handful at once OOM-killed it (every call and session)."""
    encodings = ["deflate", "gzip"] * 2
    bombs = [_bomb(encoding) for encoding in encodings]
    pid = any_server.process.pid
    before = _rss(pid)

    def send_all() -> list[int]:
        with ThreadPoolExecutor(len(bombs)) as pool:
            return list(
                pool.map(lambda pair: _send_bomb(any_server, *pair), zip(encodings, bombs, strict=True))
            )

    started = time.monotonic()
    peak, statuses = _peak_rss_while(pid, send_all)
    took = time.monotonic() - started
    assert set(statuses) <= {415, 0}, statuses  # refused, or cut off while still sending
    assert peak - before < BODY_LIMIT, (
        f"the server grew by {(peak - before) >> 20} MiB for 4 compressed bodies"
    )
    assert took < 10, took
    small = zlib.compress(json.dumps({"tool": "python", "input": "print(1)"}).encode())
    status, answer = _post_raw(any_server, "/v1/execute", small, {"Content-Encoding": "deflate"})
    assert status == 415 and "send the body uncompressed" in json.loads(answer)["error"], answer
    recovered(any_server)


def test_liveness_runs_no_code_and_takes_no_call_slot(make_any_server: Callable[..., SandboxProcess]) -> None:
    """/healthz ran code in every worker outside admission: a burst of probes took the sandbox
    slots (real calls rejected: "no free sandbox slot", counted as infra) and answered 503 (the
    kubelet restarts the pod). Readiness may run code, but only in a free execution slot."""
    server = make_any_server("--workers", "1", "--capacity", "2", "--max-sessions", "1")
    with ThreadPoolExecutor(64) as pool:
        busy = [pool.submit(server.execute, "import time\ntime.sleep(2)\nprint('done')") for _ in range(2)]
        probes = [pool.submit(requests.get, server.url + path, timeout=30) for path in ["/healthz"] * 40]
        probes += [pool.submit(requests.get, server.url + "/readyz", timeout=30) for _ in range(20)]
        answers = [probe.result() for probe in probes]
        calls = [pool.submit(server.execute, f"print({i})") for i in range(4)]
        assert [(c.result()["status"], c.result()["stdout"]) for c in calls] == [
            ("ok", f"{i}\n") for i in range(4)
        ]
        assert [b.result()["stdout"] for b in busy] == ["done\n", "done\n"]
    assert [a.status_code for a in answers] == [200] * 60, [a.text for a in answers if a.status_code != 200]
    assert "no free sandbox slot" not in server.log.read_text(errors="replace")


def _observe(server: SandboxProcess, body: dict) -> dict:
    response = server.post("/get_observation", body)
    assert response.status_code == 200, response.text
    return response.json()


def test_verltool_sessions_are_reached_only_through_get_observation(any_server: SandboxProcess) -> None:
    """A trajectory's session was caller-scoped on /get_observation only: anyone could run code in
    it, read it or close it through /v1/execute and DELETE /v1/sessions/..., and its owner's next
    step then ran in an empty session without an error."""
    _observe(any_server, {"trajectory_ids": ["owned"], "actions": ["<python>secret = 41</python>"]})
    digest = hashlib.blake2b(b"127.0.0.1\0s:owned", digest_size=16).hexdigest()
    for name in ("verltool:127.0.0.1:s:owned", f"verltool:{digest}"):  # before and after issue 24
        run = any_server.post("/v1/execute", {"tool": "python", "input": "print(secret)", "session": name})
        assert run.status_code == 404, run.text
        closed = requests.delete(f"{any_server.url}/v1/sessions/{name}", timeout=30)
        assert closed.status_code == 404, closed.text
    mine = _observe(
        any_server, {"trajectory_ids": ["owned"], "actions": ["<python>print(secret + 1)</python>"]}
    )
    assert mine["observations"] == ["42\n"], mine
    _observe(any_server, {"trajectory_ids": ["owned"], "actions": [""], "finish": [True]})
    recovered(any_server)


def _sessions(server: SandboxProcess) -> float:
    metrics = requests.get(server.metrics_url, timeout=30).text
    return float(re.search(r"^toolrl_sandbox_sessions (\S+)$", metrics, re.MULTILINE).group(1))


def test_a_step_and_a_finish_of_one_trajectory_in_one_request_leave_no_session(
    any_server: SandboxProcess,
) -> None:
    """Both ran at once: the finish found no session yet, and the step opened one after it, live
    and unreachable (the id was finished) until the idle timeout."""
    before = _sessions(any_server)
    both = _observe(
        any_server,
        {
            "trajectory_ids": ["once", "once"],
            "actions": ["<python>print(7)</python>", ""],
            "finish": [False, True],
        },
    )
    assert both["observations"] == ["7\n", ""] and both["dones"] == [False, True], both
    assert _sessions(any_server) == before
    late = _observe(any_server, {"trajectory_ids": ["once"], "actions": ["<python>print(8)</python>"]})
    assert late["valids"] == [False] and "was finished" in late["observations"][0], late
    recovered(any_server)


def test_finished_trajectory_ids_take_bounded_memory(any_server: SandboxProcess) -> None:
    """Finished ids were kept whole (100,000 of any length): a few requests with long ids took
    hundreds of MiB for as long as the server ran."""

    def finish(batch: int) -> None:  # 24 MiB of ids, in a body under the 32 MiB limit
        ids = [f"{batch}-{i}-" + "x" * (1 << 20) for i in range(24)]
        body = json.dumps({"trajectory_ids": ids, "actions": [""] * len(ids), "finish": [True] * len(ids)})
        status, answer = _post_raw(
            any_server, "/get_observation", body.encode(), {"Content-Type": "application/json"}
        )
        assert status == 200, answer[:300]

    pid = any_server.process.pid
    finish(0)  # the allocator's high water mark for such a request: reused by the next ones
    before = _rss(pid)
    for batch in range(1, 5):
        finish(batch)
    grown = _rss(pid) - before
    # ids kept whole grow it by the 96 MiB; the allocator's own noise reached 24 MiB once (loaded machine)
    assert grown < 48 << 20, f"96 MiB of finished ids more kept {grown >> 20} MiB more"
    again = _observe(
        any_server, {"trajectory_ids": ["3-0-" + "x" * (1 << 20)], "actions": ["<python>1</python>"]}
    )
    assert again["valids"] == [False], again["observations"][0][:200]  # still remembered as finished
    recovered(any_server)


@pytest.mark.parametrize(
    ("path", "raw", "field"),
    [
        ("/v1/execute", '{"tool": "python", "input": "1", "timeoutSeconds": 1%s}', "timeoutSeconds"),
        ("/run_code", '{"code": "1", "language": "python", "run_timeout": 1%s}', "run_timeout"),
        ("/run_code", '{"code": "1", "language": "python", "memory_limit_MB": 1%s}', "memory_limit_MB"),
    ],
)
def test_integers_past_a_floats_range_get_a_400(
    any_server: SandboxProcess, path: str, raw: str, field: str
) -> None:
    """10**400 is a valid JSON integer; comparing it with a float raised OverflowError: a 500
    "retry the call" for a request that can never succeed."""
    for digits in (400, 5000):  # past a float; past what Python reads as an int at all
        response = requests.post(any_server.url + path, data=raw % ("0" * digits), timeout=30)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (field in error and "finite number" in error) or "too long" in error, error


def test_sigterm_drains_then_fails_what_is_left_as_the_pools(
    make_any_server: Callable[..., SandboxProcess],
) -> None:
    """On SIGTERM the workers died at once, but calls in flight answered only after their timeout
    + 10 s, past the pod's grace period. Now: nothing new starts (503, infra), calls in flight
    have --drain-seconds to end, the rest answer at once as the pool's failure."""
    tools = [{"name": "python", "type": "python", "timeoutSeconds": 60}]
    server = make_any_server("--drain-seconds", "3", tools=tools)
    with ThreadPoolExecutor(4) as pool:
        long = pool.submit(server.execute, "import time\ntime.sleep(50)\nprint('never')")
        short = pool.submit(server.execute, "import time\ntime.sleep(2)\nprint('in time')")
        deadline = time.monotonic() + 30
        while _inflight(server) < 2:
            assert time.monotonic() < deadline, "the two calls did not start"
            time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        refused = requests.post(server.url + "/v1/execute", json={"tool": "python", "input": "1"}, timeout=30)
        assert refused.status_code == 503 and refused.json()["fault"] == "infra", refused.text
        assert short.result(timeout=30)["stdout"] == "in time\n"
        answer = long.result(timeout=30)
        answered = time.monotonic() - signalled
    assert (answer["status"], answer["fault"]) == ("error", "infra"), answer
    assert "shutting down" in answer["message"], answer
    assert answered < 3 + 5, answered
    assert server.process.wait(30) == 0


def _inflight(server: SandboxProcess) -> float:
    metrics = requests.get(server.metrics_url, timeout=30).text
    return float(re.search(r"^toolrl_tool_inflight (\S+)$", metrics, re.MULTILINE).group(1))


def test_readiness_fails_without_landlock_unless_allowed(make_server: object, tmp_path: Path) -> None:
    allowed = make_server("--no-landlock", "--allow-no-landlock")
    body = requests.get(allowed.url + "/readyz", timeout=10).json()
    assert body["ready"] is True and body["sandbox"]["landlockAbi"] == 0
    port, metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "tool_sandbox", "serve", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--metrics-port", str(metrics_port), "--workdir", str(tmp_path / "work"), "--no-landlock"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # until the workers reported their layers (before: "starting")
            assert process.poll() is None
            with contextlib.suppress(requests.ConnectionError):
                response = requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
                if not response.json().get("problem", "starting").startswith("starting"):
                    break
            time.sleep(0.2)
        assert response.status_code == 503
        assert "--allow-no-landlock" in response.json()["problem"]
    finally:
        process.terminate()
        process.wait(15)
