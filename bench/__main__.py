"""`make bench`: run every benchmark (`bench/<name>/run.py`) in turn, or those named.

    python -m bench [name ...]      # e.g. python -m bench tool_sandbox operator

Each script prints a markdown table and writes JSON to bench/results/<name>.json.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(names: list[str]) -> int:
    available = sorted(p.parent.name for p in HERE.glob("*/run.py"))
    unknown = sorted(set(names) - set(available))
    if unknown:
        print(f"bench: unknown benchmark(s) {unknown}; available: {available}", file=sys.stderr)
        return 2
    failed = []
    for name in names or available:
        print(f"\n## bench: {name}\n", flush=True)
        if subprocess.run([sys.executable, str(HERE / name / "run.py")], cwd=HERE.parent).returncode:
            failed.append(name)
    if failed:
        print(f"bench: failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
