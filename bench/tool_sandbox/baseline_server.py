"""Baseline: a subprocess-per-call server in the style of SandboxFusion's `isolation: none`
(write the code to a temp file, run `python file.py`, kill the process tree on timeout)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time

from aiohttp import web


async def run_code(request: web.Request) -> web.Response:
    body = await request.json()
    timeout = float(body.get("run_timeout", 10))
    with tempfile.TemporaryDirectory() as workdir:
        path = os.path.join(workdir, "main.py")
        with open(path, "w") as handle:
            handle.write(body["code"])
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            path,
            cwd=workdir,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), timeout)
            status = "Finished"
        except TimeoutError:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = await process.communicate()
            status = "TimeLimitExceeded"
    result = {
        "status": status,
        "execution_time": time.monotonic() - started,
        "return_code": process.returncode,
        "stdout": stdout.decode(errors="replace"),
        "stderr": stderr.decode(errors="replace"),
    }
    ok = status == "Finished" and process.returncode == 0
    # `message` as SandboxFusion sends it (its official client requires the field)
    return web.json_response({"status": "Success" if ok else "Failed", "message": "", "run_result": result})


def main() -> None:
    app = web.Application()
    app.router.add_post("/run_code", run_code)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)


if __name__ == "__main__":
    main()
