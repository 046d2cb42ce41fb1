"""Regenerate the chart's derived files, or with --check fail if the committed ones are stale.

    python -m chartgen            # chartgen is installed editable (charts/pyproject.toml)
    python -m chartgen --check
"""

from __future__ import annotations

import argparse
import sys

from .outputs import stale_outputs, write_outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chartgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report files that are out of date")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_outputs()
        for path in stale:
            print(f"out of date: {path} (run `make chart-generate`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_outputs():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
