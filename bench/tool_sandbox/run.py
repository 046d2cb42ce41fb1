"""Benchmark of the tool pool: calls/s and p50/p99 latency at concurrency 1, 8 and 32 for two
snippets and for HumanEval's 328 test programs (humaneval.py), through HTTP with every isolation
layer on, side by side with two baselines measured in the same run on the same machine:
  - `fresh python`: a new `python -c` process per call (no server);
  - `subprocess server`: a SandboxFusion-`isolation: none`-style server (temp file, `python file.py`).
Snippets go to the pool's /v1/execute, HumanEval programs to its /run_code (SandboxFusion's
dialect); a call counts as an error unless its output (snippets) or its pass/fail verdict
(HumanEval) is the expected one. Before measuring, every HumanEval program runs once through
SandboxFusion's official client against the pool's /run_code: each canonical solution must pass
and each broken one fail, else the benchmark fails.

Then the pool against the ceiling alone, paired: at concurrency 8, `--rounds` rounds in which the two
run one after the other (the order alternating between rounds), each round's ratio of the pool's
calls/s and p99 to the ceiling's, and their median and range: a host that drifts by +-15 % between
cells moves both sides of a pair alike, which one cell of each measured minutes apart does not.

Usage: python bench/tool_sandbox/run.py [--seconds 8] [--workloads ...] [--rounds 7]
       [--out bench/results/tool_sandbox.json]
Prints a markdown table; writes the figures as JSON."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import humaneval

SNIPPETS = {
    "print(1+1)": ("print(1+1)", "2\n"),
    "numpy sum": ("import numpy; print(numpy.arange(10).sum())", "45\n"),
}
HUMANEVAL = "HumanEval (328 programs)"
# fork_ceiling.py: what the machine gives a warm fork per call with nothing else; the pool is measured
# against it (issue 35: >= 90 % of its calls/s on HumanEval, p99 <= 1.1x)
CEILING = "bare warm fork server (the ceiling)"
HEADER = struct.Struct(">I")  # fork_ceiling.py's frame: a 4-byte big-endian length
WORKLOADS = (*SNIPPETS, HUMANEVAL)
CONCURRENCY = (1, 8, 32)
HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, seconds: float = 120) -> None:
    import urllib.request

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


def wait_path(path: str, process: subprocess.Popen, seconds: float = 120) -> None:
    """Until `process` has made `path`; fails at once if it ended first."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} ended with {process.returncode} before making {path}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} not there after {seconds} s")
        time.sleep(0.1)


Caller = Callable[[int], Awaitable[bool]]


async def measure(call: Caller, concurrency: int, seconds: float, calls: int = 0) -> dict[str, float]:
    """Closed loop: `concurrency` callers for `seconds`, or for exactly `calls` calls when given
    (after a short warm-up); call(i) runs the i-th call and says whether its answer was the
    expected one."""
    latencies: list[float] = []
    errors = 0
    stop_at = 0.0
    issued = 0
    limit = 0

    async def caller() -> None:
        nonlocal errors, issued
        while time.monotonic() < stop_at and (not limit or issued < limit):
            issued += 1
            started = time.perf_counter()
            right = await call(issued)
            latencies.append(time.perf_counter() - started)
            errors += not right

    stop_at = time.monotonic() + min(1.0, seconds / 5)
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    latencies.clear()
    errors = 0
    busy_before = busy_seconds()
    began = time.monotonic()
    stop_at, issued, limit = (began + 3600, 0, calls) if calls else (began + seconds, issued, 0)
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = time.monotonic() - began
    busy = busy_seconds() - busy_before
    latencies.sort()

    def quantile(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(len(latencies) * q))] * 1000, 1)

    return {
        "calls": len(latencies),
        "calls_per_second": round(len(latencies) / elapsed, 1),
        "p50_ms": quantile(0.5),
        "p90_ms": quantile(0.9),
        "p99_ms": quantile(0.99),
        # the whole machine's CPU time per call (client included): steadier than calls/s when the
        # machine is shared, and what bounds calls/s on an idle one (cores / CPU per call)
        "cpu_ms_per_call": round(busy * 1000 / max(len(latencies), 1), 2),
        "errors": errors,
    }


def busy_seconds() -> float:
    """CPU seconds spent by all CPUs outside idle and iowait since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


Check = Callable[[dict], bool]


class LightHttp:
    """A keep-alive HTTP/1.1 client of one server, as light as the ceiling's socket client: a connection
    per caller at most, reused, one request in flight on each; the answer's body (Content-Length) as
    JSON. The client shares the machine's cores with the server it measures, and aiohttp's client cost
    ~0.4 ms of CPU a call here against ~0.13 ms for the ceiling's client (2026-12-07): the issue's
    method is one light keep-alive client for every server."""

    def __init__(self, base_url: str) -> None:
        url = urlsplit(base_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, path: str, body: bytes) -> dict:
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        reused = bool(self.idle)
        reader, writer = self.idle.pop() if reused else await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(request)
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
                if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                    raise
                # the server closed the connection while it idled (its keep-alive timeout, between
                # cells) before it read the request: send it once more, on a new connection
                writer.close()
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
            status_line, *lines = head.decode("latin-1").split("\r\n")
            fields = (line.partition(":") for line in lines if line)
            headers = {name.strip().lower(): value.strip() for name, _, value in fields}
            if "content-length" not in headers:
                raise RuntimeError(f"{path}: an answer without Content-Length ({status_line})")
            answer = json.loads(await reader.readexactly(int(headers["content-length"])))
        except BaseException:
            writer.close()  # in an unknown state: never reused
            raise
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self.idle.append((reader, writer))
        return answer

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


def http_caller(client: LightHttp, path: str, bodies: list[dict], checks: list[Check]) -> Caller:
    """POST the i-th body (cycling) to `path`; right when its check accepts the JSON answer."""
    payloads = [json.dumps(body).encode() for body in bodies]

    async def call(i: int) -> bool:
        k = i % len(payloads)
        return checks[k](await client.post(path, payloads[k]))

    return call


def right(exit_code: int | None, stdout: str, want: bool | str) -> bool:
    """A program's answer is the expected one: its exit status says pass (True) or fail (False), or
    its stdout is the expected text."""
    if isinstance(want, bool):
        return (exit_code == 0) == want
    return stdout == want


def fresh_process_caller(codes: list[str], passes: list[bool | str]) -> Caller:
    """`python -c` per call; right when its stdout is the expected text or, for a bool, when its
    exit status says pass (True) or fail (False)."""

    async def call(i: int) -> bool:
        k = i % len(codes)
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            codes[k],
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env=ENV,
        )
        stdout, _ = await process.communicate()
        return right(process.returncode, stdout.decode(), passes[k])

    return call


class CeilingClient:
    """Connections to fork_ceiling.py's servers, one per caller at most (`measure`'s concurrency)."""

    def __init__(self, path: str) -> None:
        self.paths = [f"{path}.{i}" for i in range(int(Path(path).read_text()))]  # one per server
        self.opened = 0
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def run(self, code: str) -> dict:
        if not self.idle:  # a new connection, to the servers in turn
            self.opened += 1
            self.idle.append(await asyncio.open_unix_connection(self.paths[self.opened % len(self.paths)]))
        reader, writer = self.idle.pop()
        payload = code.encode()
        writer.write(HEADER.pack(len(payload)) + payload)
        await writer.drain()
        size = HEADER.unpack(await reader.readexactly(HEADER.size))[0]
        answer = json.loads(await reader.readexactly(size))
        self.idle.append((reader, writer))
        return answer

    def caller(self, codes: list[str], passes: list[bool | str]) -> Caller:

        async def call(i: int) -> bool:
            k = i % len(codes)
            answer = await self.run(codes[k])
            return right(answer["exit"], answer["stdout"], passes[k])

        return call


def pool_and_ceiling(workload: str, pool: LightHttp, ceiling: CeilingClient) -> dict[str, Caller]:
    """The pool's caller and the ceiling's for one workload (name -> caller)."""
    if workload == HUMANEVAL:
        codes, expected, bodies, checks = humaneval_calls()
        return {
            "tool_sandbox (all layers, HTTP /run_code)": http_caller(pool, "/run_code", bodies, checks),
            CEILING: ceiling.caller(codes, list(expected)),
        }
    code, output = SNIPPETS[workload]
    return {
        "tool_sandbox (all layers, HTTP)": http_caller(
            pool, "/v1/execute", [{"tool": "python", "input": code}], [lambda r: r["stdout"] == output]
        ),
        CEILING: ceiling.caller([code], [output]),
    }


@functools.cache  # the pool's, the ceiling's and the baselines' callers share them
def humaneval_calls() -> tuple[list[str], list[bool], list[dict], list[Check]]:
    """HumanEval's programs, whether each should pass, and their /run_code bodies and checks."""
    cases = humaneval.cases()
    codes, expected = [c.code for c in cases], [c.should_pass for c in cases]
    bodies = [{"code": code, "language": "python"} for code in codes]
    checks: list[Check] = [lambda r, want=want: (r["status"] == "Success") == want for want in expected]
    return codes, expected, bodies, checks


def systems(workload: str, pool: LightHttp, baseline: LightHttp, ceiling: CeilingClient) -> dict[str, Caller]:
    """The four systems for one workload: (name -> caller)."""
    found = pool_and_ceiling(workload, pool, ceiling)
    if workload == HUMANEVAL:
        codes, expected, bodies, checks = humaneval_calls()
        found["fresh python -c per call"] = fresh_process_caller(codes, list(expected))
        found["subprocess-per-call server"] = http_caller(baseline, "/run_code", bodies, checks)
        return found
    code, output = SNIPPETS[workload]
    found["fresh python -c per call"] = fresh_process_caller([code], [output])
    found["subprocess-per-call server"] = http_caller(
        baseline,
        "/run_code",
        [{"code": code, "language": "python"}],
        [lambda r: r["run_result"]["stdout"] == output],
    )
    return found


async def bench(
    seconds: float, workloads: list[str], rounds: int
) -> tuple[list[dict], list[dict], dict[str, list[str]]]:
    """The measured rows, the paired rounds against the ceiling, and what the HumanEval check found wrong
    on each server."""
    rows = []
    rounds_found: list[dict] = []
    wrong: dict[str, list[str]] = {}
    sandbox_port, baseline_port, metrics_port = free_port(), free_port(), free_port()
    serve = ["serve", "--host", "127.0.0.1", "--port", str(sandbox_port), "--metrics-port", str(metrics_port)]
    sandbox = subprocess.Popen(
        [sys.executable, "-m", "tool_sandbox", *serve],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    baseline = subprocess.Popen(
        [sys.executable, str(HERE / "baseline_server.py"), str(baseline_port)], env=ENV
    )
    sandbox_url, baseline_url = f"http://127.0.0.1:{sandbox_port}", f"http://127.0.0.1:{baseline_port}"
    sockets = tempfile.TemporaryDirectory()
    ceiling_path = os.path.join(sockets.name, "ceiling.sock")
    ceiling = subprocess.Popen(
        [sys.executable, str(HERE / "fork_ceiling.py"), ceiling_path], env=ENV, start_new_session=True
    )
    try:
        wait_http(f"{sandbox_url}/readyz")
        wait_path(ceiling_path, ceiling)
        if HUMANEVAL in workloads:
            for name, url in (("tool_sandbox", sandbox_url), ("subprocess-per-call server", baseline_url)):
                began = time.monotonic()
                wrong[name] = await humaneval.check(url)
                print(
                    f"  HumanEval through the sandbox-fusion client, {name}: {len(wrong[name])} of 328"
                    f" verdicts wrong ({time.monotonic() - began:.1f} s)",
                    file=sys.stderr,
                )
        pool, baseline_client = LightHttp(sandbox_url), LightHttp(baseline_url)
        try:
            for label in workloads:
                calls = systems(label, pool, baseline_client, CeilingClient(ceiling_path))
                for system, call in calls.items():
                    for concurrency in CONCURRENCY:
                        load = os.getloadavg()[0]
                        # HumanEval: one whole pass (each program once), so every system and
                        # concurrency runs the same mix of fast and slow programs
                        passes = len(humaneval.cases()) if label == HUMANEVAL else 0
                        result = await measure(call, concurrency, seconds, passes)
                        rows.append(
                            {
                                "snippet": label,
                                "system": system,
                                "concurrency": concurrency,
                                "load_before": round(load, 2),
                                **result,
                            }
                        )
                        print(f"  {label:10s} {system:32s} c={concurrency:2d} {result}", file=sys.stderr)
        finally:
            await pool.close()
            await baseline_client.close()
        if rounds:
            rounds_found = await paired(sandbox_url, ceiling_path, workloads, rounds)
    finally:
        os.killpg(ceiling.pid, signal.SIGTERM)  # its servers, one per CPU, and their spares
        for process in (sandbox, baseline):
            process.terminate()
        for process in (ceiling, sandbox, baseline):
            process.wait(20)
        sockets.cleanup()
    return rows, rounds_found, wrong


PAIRED_CONCURRENCY = 8  # where the target is set, and where the ceiling is a fair reference
PAIRED_PASSES = 3  # HumanEval: three passes a cell (984 calls: its p99 is then about the tenth slowest)
PAIRED_SECONDS = 4.0  # a snippet's cell


async def paired(sandbox_url: str, ceiling_path: str, workloads: list[str], rounds: int) -> list[dict]:
    """The pool and the ceiling measured in turn, `rounds` times per workload (the pool first in even
    rounds, the ceiling first in odd ones): each round's calls/s and p99 of both and their ratios."""
    found = []
    pool = LightHttp(sandbox_url)
    try:
        for label in workloads:
            calls = pool_and_ceiling(label, pool, CeilingClient(ceiling_path))
            [pool_call] = [call for system, call in calls.items() if system != CEILING]
            pair = {"pool": pool_call, "ceiling": calls[CEILING]}
            passes = PAIRED_PASSES * len(humaneval.cases()) if label == HUMANEVAL else 0
            for round_ in range(rounds):
                order = ("pool", "ceiling") if round_ % 2 == 0 else ("ceiling", "pool")
                cells = {}
                for side in order:
                    cells[side] = await measure(pair[side], PAIRED_CONCURRENCY, PAIRED_SECONDS, passes)
                pool_cell, top = cells["pool"], cells["ceiling"]
                row = {
                    "snippet": label,
                    "round": round_,
                    "first": order[0],
                    "pool": pool_cell,
                    "ceiling": top,
                    "calls_ratio": round(pool_cell["calls_per_second"] / top["calls_per_second"], 3),
                    "p99_ratio": round(pool_cell["p99_ms"] / top["p99_ms"], 3),
                }
                found.append(row)
                print(
                    f"  paired {label:10s} round {round_} ({order[0]} first): pool"
                    f" {pool_cell['calls_per_second']} calls/s p99 {pool_cell['p99_ms']} ms, ceiling"
                    f" {top['calls_per_second']} p99 {top['p99_ms']}: {row['calls_ratio']:.2f}x,"
                    f" p99 {row['p99_ratio']:.2f}x",
                    file=sys.stderr,
                )
    finally:
        await pool.close()
    return found


def paired_summary(rows: list[dict]) -> str:
    """Per workload: the median and range of the rounds' ratios, and whether issue 35's target holds on
    the median (calls/s >= 90 % of the ceiling's, p99 <= 1.1x its)."""
    lines = [
        f"| workload (c={PAIRED_CONCURRENCY}, paired rounds) | rounds | pool/ceiling calls/s: median (range)"
        " | pool/ceiling p99: median (range) | errors | >= 0.90 and <= 1.10 |",
        "|---|---:|---|---|---:|---|",
    ]
    for label in dict.fromkeys(r["snippet"] for r in rows):
        mine = [r for r in rows if r["snippet"] == label]
        calls = sorted(r["calls_ratio"] for r in mine)
        p99 = sorted(r["p99_ratio"] for r in mine)
        errors = sum(r["pool"]["errors"] + r["ceiling"]["errors"] for r in mine)
        mid_calls, mid_p99 = calls[len(calls) // 2], p99[len(p99) // 2]
        held = "yes" if mid_calls >= 0.9 and mid_p99 <= 1.1 else "no"
        lines.append(
            f"| {label} | {len(mine)} | {mid_calls:.2f} ({calls[0]:.2f}-{calls[-1]:.2f}) |"
            f" {mid_p99:.2f} ({p99[0]:.2f}-{p99[-1]:.2f}) | {errors} | {held} |"
        )
    return "\n".join(lines)


def machine() -> dict:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
    }


def table(rows: list[dict]) -> str:
    lines = [
        "| workload | system | concurrency | calls/s | p50 ms | p90 ms | p99 ms | CPU ms/call | errors"
        " | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['snippet']} | {r['system']} | {r['concurrency']} | {r['calls_per_second']} | "
            f"{r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['cpu_ms_per_call']} | {r['errors']} | "
            f"{r['load_before']} |"
        )
    return "\n".join(lines)


def ratios(rows: list[dict]) -> str:
    """Per workload and concurrency: the pool's calls/s over the ceiling's and the subprocess-per-call
    server's, and its p99 over the ceiling's."""
    lines = []
    for r in rows:
        if not r["system"].startswith("tool_sandbox"):
            continue

        def beside(system: str, r: dict = r) -> dict | None:
            cell = (r["snippet"], r["concurrency"], system)
            found = (b for b in rows if (b["snippet"], b["concurrency"], b["system"]) == cell)
            return next((b for b in found if b["calls_per_second"]), None)

        rate = r["calls_per_second"]
        line = f"- {r['snippet']}, c={r['concurrency']}: {rate} calls/s, p99 {r['p99_ms']} ms"
        top = beside(CEILING)
        if top:
            line += (
                f"; {100 * rate / top['calls_per_second']:.0f} % of the ceiling's calls/s"
                f" ({top['calls_per_second']}), p99 {r['p99_ms'] / top['p99_ms']:.2f}x its {top['p99_ms']} ms"
            )
        base = beside("subprocess-per-call server")
        if base:
            line += f"; {rate / base['calls_per_second']:.1f}x the subprocess-per-call server"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per cell")
    parser.add_argument(
        "--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS), help="what to measure (all)"
    )
    parser.add_argument(
        "--rounds", type=int, default=7, help="paired rounds of the pool against the ceiling (0: none)"
    )
    parser.add_argument("--out", default=str(HERE.parent / "results" / "tool_sandbox.json"))
    args = parser.parse_args()
    info = machine()
    rows, rounds, wrong = asyncio.run(bench(args.seconds, args.workloads, args.rounds))
    info["loadavg_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": info, "results": rows, "paired_rounds": rounds, "humaneval_wrong_verdicts": wrong}
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"Machine: {info['cpus']} CPUs ({info['cpu_model']}), Linux {info['kernel']}, "
        f"Python {info['python']}, load average at start {info['loadavg_start'][0]:.2f}, "
        f"at end {info['loadavg_end'][0]:.2f}\n"
    )
    print(table(rows))
    print()
    print(ratios(rows))
    if rounds:
        print()
        print(paired_summary(rounds))
    for name, found in wrong.items():
        print(f"\nHumanEval via the sandbox-fusion client against {name}: {328 - len(found)}/328 right")
        for line in found[:20]:
            print(f"  {line}")
    if wrong.get("tool_sandbox"):
        sys.exit(1)


if __name__ == "__main__":
    main()
