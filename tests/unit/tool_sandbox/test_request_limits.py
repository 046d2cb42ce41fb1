"""What one request may ask and one call may use, against a real server: its files, timeouts,
fetched files, disk and wire frames."""

from __future__ import annotations

import asyncio
import base64

import pytest
import requests
from harness.sandbox_process import SandboxProcess
from tool_sandbox.sandbox import wire


def _run_code(files: object, code: str = "print(open('a').read())") -> dict:
    return {"code": code, "language": "python", "files": files}


def test_bad_files_get_400_and_never_use_up_slots(server: SandboxProcess) -> None:
    cases = {
        "not valid base64": {"a": "%%%not-base64"},
        "must be a base64 string": {"a": 12},
        "cannot be a file and a directory": {"a": "", "a/b": ""},
        "relative file path": {"../x": ""},
    }
    for _ in range(40):  # more bad requests than a worker has slots
        for expected, files in cases.items():
            response = server.post("/run_code", _run_code(files))
            assert response.status_code == 400, response.text
            assert expected in response.json()["error"]
    good = {"a": base64.b64encode(b"still fine").decode(), "d/b": ""}
    result = server.post("/run_code", _run_code(good)).json()
    assert result["status"] == "Success", result
    assert result["run_result"]["stdout"] == "still fine\n"


def test_nan_and_infinite_timeouts_are_rejected(server: SandboxProcess) -> None:
    for raw, expected in (
        ('{"tool": "python", "input": "1", "timeoutSeconds": NaN}', "NaN"),
        ('{"tool": "python", "input": "1", "timeoutSeconds": Infinity}', "Infinity"),
        ('{"tool": "python", "input": "1", "timeoutSeconds": 1e400}', "positive finite number"),
        ('{"code": "1", "language": "python", "run_timeout": 1e400}', "finite number"),
    ):
        path = "/run_code" if "language" in raw else "/v1/execute"
        response = requests.post(server.url + path, data=raw, timeout=30)
        assert response.status_code == 400, response.text
        assert expected in response.json()["error"]


def test_fetch_files_are_capped_in_number_and_total_bytes(server: SandboxProcess) -> None:
    too_many = {"code": "", "language": "python", "fetch_files": [f"f{i}" for i in range(65)]}
    response = server.post("/run_code", too_many)
    assert response.status_code == 400 and "at most 64" in response.json()["error"]
    code = "for name in 'abc':\n    open(name, 'wb').write(b'x' * (7 << 20))"
    body = {"code": code, "language": "python", "fetch_files": ["a", "b", "c"]}
    result = server.post("/run_code", body).json()
    assert result["status"] == "Success", result
    sizes = {name: len(base64.b64decode(data)) for name, data in result["files"].items()}
    assert sizes == {"a": 7 << 20, "b": 7 << 20, "c": 2 << 20}  # 16 MiB in all (zygote.FETCH_BUDGET_BYTES)


def test_a_call_cannot_fill_the_disk(server: SandboxProcess) -> None:
    write = "for i in range(3):\n    open(f'f{i}', 'wb').write(b'x' * (15 << 20))\n"
    for code in (write, write + "import time\ntime.sleep(2.5)\nprint('not reached')"):
        result = server.execute(code)
        assert result["status"] == "killed", result
        assert f"wrote more than {32 << 20} bytes" in result["message"]
        assert "not reached" not in result["stdout"]
    session = server.post("/v1/sessions", {"tool": "python"}).json()["session"]
    result = server.execute(write, session=session)
    assert result["status"] == "killed" and "wrote more than" in result["message"], result
    gone = server.post("/v1/execute", {"tool": "python", "input": "1", "session": session})
    assert gone.status_code == 404, gone.text  # the session's process was killed with it
    assert server.execute("print(1 + 1)")["stdout"] == "2\n"


async def test_the_server_refuses_a_frame_over_max_frame() -> None:
    stream = asyncio.StreamReader()
    stream.feed_data((wire.MAX_FRAME + 1).to_bytes(4, "big") + b"{}")
    with pytest.raises(ValueError, match="exceeds"):
        await wire.read_stream_frame(stream)
