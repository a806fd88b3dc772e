"""`make run`: start a local fleet from a pool file, ask it one chat question, stop it."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pool = args[0] if args else "examples/local-cpu.yaml"
    print(f"kvfleet demo: would start `kvfleet up {pool}`, send one chat request, print the answer")
    print("kvfleet demo: the local fleet runtime has not landed yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
