"""`make test`: the whole suite as two pytest processes side by side, then one verdict.

The real node's modules (their verl jobs in pods) and the rest of the suite (the kwok cluster's
e2e tests, the process and pure tiers) each leave a core idle much of the time when run one after
the other: a whole run was 59 min with a third of the CPU idle. Side by side, each stream keeps its
own pytest session (its own cluster, its own tmp directories); what they share on the machine is
serialised where it must be (the one real node's claim, the build caches' file locks).

Each stream's lines are printed as they come, prefixed with its name; each writes its own JUnit
XML, and `harness.test_report` reads them all at the end. Exit status: 0 only if every stream's
pytest exited 0. `python -m harness.test_streams [PYTEST_ARGS...]` (extra arguments go to both).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from harness import test_report

REPO = Path(__file__).resolve().parents[2]
TESTS = "tests"
# the modules that run on the machine's one real node (their fixtures claim it): one stream
REAL_NODE_MODULES = ("tests/e2e/test_real_node.py", "tests/e2e/test_demo_training.py")
# ... and after them, verl's runs launched as processes: the rest of the suite (the kwok cluster's tests,
# then the pure and process tiers) took 50 min beside the real node's 34 (a whole run, 2026-12-06), and
# these four runs are the largest share of its CPU that can move
NODE_STREAM = (
    *REAL_NODE_MODULES,
    "tests/e2e/test_cpu_training.py",
    "tests/unit/trainer_entry/test_smoke_run.py",
)


@dataclass(frozen=True)
class Stream:
    name: str
    paths: tuple[str, ...]
    ignored: tuple[str, ...] = ()

    def results(self, into: Path) -> Path:
        return into / f".test-results-{self.name}.xml"

    def argv(self, extra: list[str], into: Path) -> list[str]:
        ignores = [f"--ignore={path}" for path in self.ignored]
        junit = f"--junitxml={self.results(into)}"
        return [sys.executable, "-m", "pytest", junit, *ignores, *extra, *self.paths]


STREAMS = (
    Stream("node", NODE_STREAM),
    Stream("rest", (TESTS,), ignored=NODE_STREAM),
)


def _follow(
    stream: Stream,
    process: subprocess.Popen[str],
    lock: threading.Lock,
    started: float,
    codes: dict[str, int],
) -> None:
    """Print the stream's lines as they come, then when its pytest exited and how."""
    assert process.stdout is not None
    for line in process.stdout:
        with lock:
            sys.stdout.write(f"{stream.name:>4} | {line}")
            sys.stdout.flush()
    codes[stream.name] = process.wait()
    with lock:
        print(f"{stream.name:>4} | pytest exited {codes[stream.name]} after {_minutes(started)}", flush=True)


def run(streams: tuple[Stream, ...], extra: list[str], cwd: Path = REPO) -> int:
    """Every stream's pytest at once in `cwd` (their JUnit files there too); 0 if all passed."""
    lock = threading.Lock()
    started = time.monotonic()
    codes: dict[str, int] = {}
    followers = []
    for stream in streams:
        stream.results(cwd).unlink(missing_ok=True)
        process = subprocess.Popen(
            stream.argv(extra, cwd),
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        follower = threading.Thread(target=_follow, args=(stream, process, lock, started, codes), daemon=True)
        follower.start()
        followers.append(follower)
    for follower in followers:
        follower.join()
    cases = []
    for stream in streams:
        try:
            cases += test_report.read_cases(stream.results(cwd).read_text(encoding="utf-8"))
        except (OSError, ET.ParseError) as exc:
            print(f"no test report from stream {stream.name}: {exc}")
            codes[stream.name] = codes[stream.name] or 1
    print(test_report.report(cases))
    print(f"== {len(streams)} streams side by side: {_minutes(started)} of wall time ==")
    failed = {name: code for name, code in codes.items() if code}
    if failed:
        print("streams that failed: " + ", ".join(f"{n} (exit {c})" for n, c in failed.items()))
    return 1 if failed else 0


def _minutes(since: float) -> str:
    return f"{(time.monotonic() - since) / 60:.1f} min"


if __name__ == "__main__":
    sys.exit(run(STREAMS, sys.argv[1:]))
