"""Regenerate the derived files (outputs.py lists them), or with --check fail if the committed ones are stale.

    python -m chartgen            # chartgen is installed editable (charts/pyproject.toml)
    python -m chartgen --check
    python -m chartgen --crd changed.yaml --out DIR   # everything from another CRD, under DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .outputs import CRD_SOURCE, REPO, stale_outputs, write_outputs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="chartgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report files that are out of date")
    parser.add_argument("--crd", type=Path, default=CRD_SOURCE, help="the CRD manifest to generate from")
    parser.add_argument("--out", type=Path, default=REPO, help="the directory that stands for the repository")
    args = parser.parse_args(argv)
    if args.check:
        if (args.crd, args.out) != (CRD_SOURCE, REPO):
            parser.error("--check compares the repository's files with its CRD: give no --crd or --out")
        stale = stale_outputs()
        for path in stale:
            print(f"out of date: {path} (run `make chart-generate`)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_outputs(args.out, args.crd):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
