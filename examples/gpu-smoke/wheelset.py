"""The wheel set of the smoke run, from its lock (requirements.txt, `uv pip compile --generate-hashes`).

    python wheelset.py requirements LOCK [--without-torch] [--only NAME ...]   # a requirements file
    python wheelset.py torch-stack LOCK                                        # names, one a line

`--without-torch` leaves out torch and what only torch needs (its CUDA runtime wheels, triton, ...),
for a machine that has PyTorch installed already: the lock's "# via" notes say who needs what.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(?P<version>[^\s;\\]+)")
HASH = re.compile(r"--hash=(sha256:[0-9a-f]{64})")
VIA_ONE = re.compile(r"^\s*#\s+via\s+(?P<name>\S+)\s*$")
VIA_MORE = re.compile(r"^\s*#\s+(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*$")
TORCH = "torch"


class LockError(ValueError):
    """A lock file that is not what `uv pip compile --generate-hashes` writes."""


@dataclass
class Locked:
    name: str
    version: str
    hashes: list[str]
    needed_by: list[str]

    def lines(self) -> str:
        hashes = "".join(f" \\\n    --hash={h}" for h in self.hashes)
        return f"{self.name}=={self.version}{hashes}\n"


def normal(name: str) -> str:
    """PEP 503 normal form."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(text: str) -> list[Locked]:
    """Each locked package with its hashes and the packages (or input files) that need it."""
    out: list[Locked] = []
    current: Locked | None = None
    in_via = False
    for line in text.splitlines():
        match = REQUIREMENT.match(line)
        if match:
            current = Locked(normal(match["name"]), match["version"], [], [])
            out.append(current)
            in_via = False
        elif current is None:
            continue
        current.hashes += HASH.findall(line)
        one = VIA_ONE.match(line)
        if one:
            current.needed_by.append(normal(one["name"]) if "/" not in one["name"] else one["name"])
            continue
        if re.match(r"^\s*#\s+via\s*$", line):
            in_via = True
            continue
        more = VIA_MORE.match(line)
        if in_via and more:
            current.needed_by.append(normal(more["name"]))
        elif in_via and line.strip().startswith("#") and "/" in line:
            entry = line.strip().lstrip("#").strip()
            if not entry.startswith("-c "):  # a constraint file holds a version, not a need
                current.needed_by.append(entry)
        elif not line.startswith(" "):
            in_via = False
    missing = [p.name for p in out if not p.hashes]
    if not out or missing:
        raise LockError(f"not a hash-locked requirements file (no hashes for {missing or 'anything'})")
    return out


def torch_stack(packages: list[Locked]) -> set[str]:
    """torch and every package that only torch (or only what only torch needs) needs."""
    stack = {TORCH}
    grew = True
    while grew:
        grew = False
        for p in packages:
            if p.name not in stack and p.needed_by and set(p.needed_by) <= stack:
                stack.add(p.name)
                grew = True
    return stack & {p.name for p in packages}


def select(packages: list[Locked], without_torch: bool, only: list[str] | None) -> list[Locked]:
    if only:
        wanted = {normal(n) for n in only}
        unknown = wanted - {p.name for p in packages}
        if unknown:
            raise LockError(f"not in the lock: {', '.join(sorted(unknown))}")
        return [p for p in packages if p.name in wanted]
    drop = torch_stack(packages) if without_torch else set()
    return [p for p in packages if p.name not in drop]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wheelset.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    req = sub.add_parser("requirements", help="write a requirements file with hashes to stdout")
    req.add_argument("lock", type=Path)
    req.add_argument("--without-torch", action="store_true", help="leave out torch and what only it needs")
    req.add_argument("--only", nargs="+", default=None, help="just these packages")
    stack = sub.add_parser("torch-stack", help="print the names --without-torch leaves out")
    stack.add_argument("lock", type=Path)
    args = parser.parse_args(argv)
    try:
        packages = parse(args.lock.read_text())
        if args.command == "torch-stack":
            print("\n".join(sorted(torch_stack(packages))))
        else:
            sys.stdout.write("".join(p.lines() for p in select(packages, args.without_torch, args.only)))
    except (OSError, LockError) as exc:
        print(f"error: {args.lock}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
