"""Soak of the tool pool (issue 14): hostile and ordinary calls mixed at concurrency 32 for ten
minutes against one server. Counts server deaths and worker restarts, ordinary calls lost or
answered wrong, and samples the memory (RSS) and descriptors of the server and its workers.

Usage: python bench/tool_sandbox_soak/run.py [--seconds 600] [--concurrency 32]
           [--as-uid 65534 --python VENV/bin/python]
The second form is the pod's mode: the server is not root and its children share its uid.
Prints a markdown summary; writes bench/results/tool_sandbox_soak.json. Traffic goes only to the
server it starts on 127.0.0.1; every loop is bounded in time."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from harness.sandbox_process import SandboxProcess, descendants

HERE = Path(__file__).resolve().parent
FORGE = (
    "import json, os, struct\nframe = json.dumps({'done': True, 'exitCode': 0}).encode()\n"
    "os.write(4, struct.pack('>I', len(frame)) + frame)\nwhile True:\n    pass"
)
# (what, request path, body): one of each per round, between the ordinary calls.
HOSTILE: list[tuple[str, str, Any]] = [
    ("fork bomb", "/v1/execute", "import os\nwhile True:\n    os.fork()"),
    ("memory bomb", "/v1/execute", "x = bytearray(1 << 34)"),
    ("infinite loop", "/v1/execute", "while True:\n    pass"),
    ("output flood", "/v1/execute", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)"),
    ("chmod the worker", "/v1/execute", "import os\nos.chmod(os.path.dirname(os.getcwd()), 0)"),
    ("SysV shm", "/v1/execute", "import ctypes\nprint(ctypes.CDLL(None).shmget(0, 1 << 24, 0o1600))"),
    (
        "unreadable dir filled",
        "/v1/execute",
        "import os\nos.mkdir('h', 0o300)\n"
        "for i in range(4):\n    open(f'h/{i}', 'wb').write(b'x' * (12 << 20))",
    ),
    ("inotify", "/v1/execute", "import ctypes\nprint(ctypes.CDLL(None).inotify_init())"),
    ("F_SETOWN", "/v1/execute", "import fcntl, os\nr, w = os.pipe()\nfcntl.fcntl(r, 8, os.getppid())"),
    ("segfault", "/v1/execute", "import ctypes\nctypes.string_at(0)"),
    ("nested JSON body", "/v1/execute", "[" * 100_000),
    ("odd file names", "/run_code", {"code": "", "language": "python", "files": {"\ud800": "", "a\x00": ""}}),
    ("quadratic action", "/get_observation", {"trajectory_ids": ["q"], "actions": ["<python>" * 100_000]}),
    ("forged end of cell", "session", FORGE),
    (
        "control pipe garbage",
        "session",
        "import os, struct\nos.write(4, struct.pack('>I', 50000) + b'[' * 50000)",
    ),
]


def sample(server: int) -> dict[str, Any]:
    """RSS and descriptors of the server and its workers (not of sandboxed children)."""
    rss = fds = 0
    workers = []
    for pid in [server, *descendants(server)]:
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if pid != server and comm != "sandbox-worker":
                continue
            status = Path(f"/proc/{pid}/status").read_text()
            rss += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            fds += len(os.listdir(f"/proc/{pid}/fd"))
            if pid != server:
                workers.append(pid)
        except (OSError, StopIteration):
            continue
    return {"rssMiB": round(rss / 1024, 1), "fds": fds, "workers": sorted(workers)}


async def soak(url: str, server: subprocess.Popen[bytes], seconds: float, concurrency: int) -> dict[str, Any]:
    counts = {"ordinary": 0, "ordinaryLost": 0, "hostile": 0, "hostileUnanswered": 0}
    failures: list[str] = []
    samples: list[dict[str, Any]] = []
    end = time.monotonic() + seconds
    slow_clients: list[socket.socket] = []
    next_index = 0

    async def ordinary(session: aiohttp.ClientSession, i: int) -> None:
        body = {"tool": "python", "input": f"print({i} + 1)"}
        try:
            async with session.post(url + "/v1/execute", json=body) as response:
                answer = await response.json()
            ok = response.status == 200 and answer["status"] == "ok" and answer["stdout"] == f"{i + 1}\n"
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            ok, answer = False, {"error": repr(exc)}
        counts["ordinary"] += 1
        if not ok:
            counts["ordinaryLost"] += 1
            failures.append(f"ordinary {i}: {str(answer)[:200]}")

    async def hostile(session: aiohttp.ClientSession, i: int) -> None:
        what, path, body = HOSTILE[i % len(HOSTILE)]
        counts["hostile"] += 1
        try:
            if path == "session":
                async with session.post(url + "/v1/sessions", json={"tool": "python"}) as response:
                    opened = await response.json()
                if "session" not in opened:
                    return  # the session cap: fine, that is backpressure
                call = {"tool": "python", "input": body, "session": opened["session"], "timeoutSeconds": 2}
                async with session.post(url + "/v1/execute", json=call) as response:
                    await response.read()
                async with session.delete(f"{url}/v1/sessions/{opened['session']}") as response:
                    await response.read()
            elif isinstance(body, str) and path == "/v1/execute" and body.startswith("["):
                async with session.post(url + path, data=body) as response:
                    await response.read()
            else:
                payload = (
                    body
                    if not isinstance(body, str)
                    else {"tool": "python", "input": body, "timeoutSeconds": 2}
                )
                async with session.post(url + path, json=payload) as response:
                    await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            counts["hostileUnanswered"] += 1
            failures.append(f"hostile {what}: {exc!r}")

    async def caller(session: aiohttp.ClientSession) -> None:
        nonlocal next_index
        while time.monotonic() < end:
            i = next_index
            next_index += 1
            if i % 10 == 5:
                await hostile(session, i // 10)
            else:
                await ordinary(session, i)

    async def sampler() -> None:
        while time.monotonic() < end:
            samples.append({"t": round(seconds - (end - time.monotonic()), 1), **sample(server.pid)})
            if len(slow_clients) < 200:  # slow clients too: connections that never finish a request
                sock = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])))
                sock.sendall(b"POST /v1/execute HTTP/1.1\r\nHost: x\r\n")
                slow_clients.append(sock)
            await asyncio.sleep(5)

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=aiohttp.TCPConnector(limit=concurrency)
    ) as session:
        await asyncio.gather(sampler(), *(caller(session) for _ in range(concurrency)))
    for sock in slow_clients:
        sock.close()
    samples.append({"t": seconds, **sample(server.pid)})
    return {"counts": counts, "failures": failures[:50], "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", default=str(HERE.parent / "results" / "tool_sandbox_soak.json"))
    parser.add_argument("--as-uid", type=int, help="run the server as this uid (setpriv; needs root)")
    parser.add_argument("--python", default=sys.executable, help="an interpreter that uid can read")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="toolrl-soak-"))
    prefix: tuple[str, ...] = ()
    if args.as_uid is not None:
        root.chmod(0o755)
        (root / "work").mkdir()
        os.chown(root / "work", args.as_uid, args.as_uid)
        prefix = ("setpriv", f"--reuid={args.as_uid}", f"--regid={args.as_uid}", "--clear-groups")
    with SandboxProcess.start(root, python=args.python, prefix=prefix, ready_seconds=120) as server:
        started = sample(server.process.pid)
        result = asyncio.run(soak(server.url, server.process, args.seconds, args.concurrency))
        result["serverDied"] = server.process.poll() is not None
        result["workerRestarts"] = len({p for s in result["samples"] for p in s["workers"]}) - len(
            started["workers"]
        )
        rss = [s["rssMiB"] for s in result["samples"]]
        fds = [s["fds"] for s in result["samples"]]
        result["summary"] = {
            "seconds": args.seconds,
            "concurrency": args.concurrency,
            "rssMiB": {"start": rss[0], "max": max(rss), "end": rss[-1]},
            "fds": {"start": fds[0], "max": max(fds), "end": fds[-1]},
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    c, s = result["counts"], result["summary"]
    print(
        "| seconds | c | ordinary calls | lost | hostile calls | unanswered | server died | worker restarts "
        "| RSS MiB start/max/end | fds start/max/end |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|---:|---|---|")
    print(
        f"| {s['seconds']:g} | {s['concurrency']} | {c['ordinary']} | {c['ordinaryLost']} | {c['hostile']} "
        f"| {c['hostileUnanswered']} | {result['serverDied']} | {result['workerRestarts']} "
        f"| {s['rssMiB']['start']}/{s['rssMiB']['max']}/{s['rssMiB']['end']} "
        f"| {s['fds']['start']}/{s['fds']['max']}/{s['fds']['end']} |"
    )
    for failure in result["failures"][:10]:
        print("failure:", failure)
    bad = result["serverDied"] or c["ordinaryLost"] or result["workerRestarts"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
