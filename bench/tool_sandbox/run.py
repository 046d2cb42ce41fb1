"""Benchmark of the tool pool: calls/s and p50/p99 latency at concurrency 1, 8 and 32 for two
snippets, through HTTP with every isolation layer on, side by side with two baselines measured
in the same run on the same machine:
  - `fresh python`: a new `python -c` process per call (no server);
  - `subprocess server`: a SandboxFusion-`isolation: none`-style server (temp file, `python file.py`).

Usage: python bench/tool_sandbox/run.py [--seconds 8] [--out bench/results/tool_sandbox.json]
Prints a markdown table; writes the figures as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

SNIPPETS = {
    "print(1+1)": ("print(1+1)", "2\n"),
    "numpy sum": ("import numpy; print(numpy.arange(10).sum())", "45\n"),
}
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


async def measure(
    call: Callable[[], Awaitable[str]], expected: str, concurrency: int, seconds: float
) -> dict[str, float]:
    """Closed loop: `concurrency` callers for `seconds` (after a short warm-up)."""
    latencies: list[float] = []
    errors = 0
    stop_at = 0.0

    async def caller() -> None:
        nonlocal errors
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            output = await call()
            latencies.append(time.perf_counter() - started)
            errors += output != expected

    stop_at = time.monotonic() + min(1.0, seconds / 5)
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    latencies.clear()
    errors = 0
    busy_before = busy_seconds()
    began = time.monotonic()
    stop_at = began + seconds
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


def http_caller(
    session: aiohttp.ClientSession, url: str, body: dict, key: Callable[[dict], str]
) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        async with session.post(url, json=body) as response:
            return key(await response.json())

    return call


def fresh_process_caller(code: str) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, env=ENV
        )
        stdout, _ = await process.communicate()
        return stdout.decode()

    return call


async def bench(seconds: float) -> list[dict]:
    rows = []
    sandbox_port, baseline_port = free_port(), free_port()
    sandbox = subprocess.Popen(
        [sys.executable, "-m", "tool_sandbox", "serve", "--host", "127.0.0.1", "--port", str(sandbox_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    baseline = subprocess.Popen(
        [sys.executable, str(HERE / "baseline_server.py"), str(baseline_port)], env=ENV
    )
    try:
        wait_http(f"http://127.0.0.1:{sandbox_port}/readyz")
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as session:
            for label, (code, expected) in SNIPPETS.items():
                systems = {
                    "tool_sandbox (all layers, HTTP)": http_caller(
                        session,
                        f"http://127.0.0.1:{sandbox_port}/v1/execute",
                        {"tool": "python", "input": code},
                        lambda r: r["stdout"],
                    ),
                    "fresh python -c per call": fresh_process_caller(code),
                    "subprocess-per-call server": http_caller(
                        session,
                        f"http://127.0.0.1:{baseline_port}/run_code",
                        {"code": code, "language": "python"},
                        lambda r: r["run_result"]["stdout"],
                    ),
                }
                for system, call in systems.items():
                    for concurrency in CONCURRENCY:
                        load = os.getloadavg()[0]
                        result = await measure(call, expected, concurrency, seconds)
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
        for process in (sandbox, baseline):
            process.terminate()
            process.wait(20)
    return rows


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
        "| snippet | system | concurrency | calls/s | p50 ms | p90 ms | p99 ms | CPU ms/call | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['snippet']} | {r['system']} | {r['concurrency']} | {r['calls_per_second']} | "
            f"{r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['cpu_ms_per_call']} | {r['errors']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per cell")
    parser.add_argument("--out", default=str(HERE.parent / "results" / "tool_sandbox.json"))
    args = parser.parse_args()
    info = machine()
    rows = asyncio.run(bench(args.seconds))
    info["loadavg_end"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": info, "results": rows}, indent=2) + "\n")
    print(
        f"Machine: {info['cpus']} CPUs ({info['cpu_model']}), Linux {info['kernel']}, "
        f"Python {info['python']}, load average at start {info['loadavg_start'][0]:.2f}\n"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
