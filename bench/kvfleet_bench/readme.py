"""bench/README.md's generated blocks: each benchmark writes its own section.

Every figure in bench/README.md lives between a pair of markers,

    <!-- bench:NAME:begin -->
    ...generated from bench/results/NAME*.json...
    <!-- bench:NAME:end -->

and the text between them is what `kvfleet_bench.sections.SECTIONS[NAME]` renders from the
stored results files. The prose outside the markers is hand-written and carries no figure
(tests/bench/test_bench_readme.py checks both).

    python -m kvfleet_bench.readme               # re-render every section from bench/results
    python -m kvfleet_bench.readme kv_pool ...   # only these sections
    python -m kvfleet_bench.readme --check       # exit 1 if the README is not what they render

A doc refresh never reruns a benchmark. Each entry script calls `refresh_section(NAME, out)`
at the end of its main, right after writing its results file: when that file is one of the
section's stored results (not a `--quick` run written elsewhere) the section is re-rendered
from every stored variant, this run's included.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parents[1]
README = BENCH_DIR / "README.md"
RESULTS = BENCH_DIR / "results"


class SectionError(ValueError):
    """A section's markers are missing, duplicated or out of order."""


def begin_marker(name: str) -> str:
    return f"<!-- bench:{name}:begin -->"


def end_marker(name: str) -> str:
    return f"<!-- bench:{name}:end -->"


def block(name: str, markdown: str) -> str:
    """The generated block as it stands in the README, markers included."""
    return f"{begin_marker(name)}\n\n{markdown.strip(chr(10))}\n\n{end_marker(name)}"


def replace_section(text: str, name: str, markdown: str, where: str = "README") -> str:
    """`text` with the block of section `name` replaced by `markdown`."""
    begin, end = begin_marker(name), end_marker(name)
    for marker in (begin, end):
        count = text.count(marker)
        if count != 1:
            state = "missing" if count == 0 else f"present {count} times"
            raise SectionError(f"{where}: marker {marker!r} is {state}; it must appear once, "
                               f"on its own line")
    start, stop = text.index(begin), text.index(end)
    if stop < start:
        raise SectionError(f"{where}: {end!r} comes before {begin!r}")
    return text[:start] + block(name, markdown) + text[stop + len(end):]


def write_section(name: str, markdown: str, readme: Path = README) -> bool:
    """Replace the text between section `name`'s markers in `readme`; True if it changed.

    The file is replaced atomically (a temporary file in the same folder, then a rename), so
    a reader never sees half a README.
    """
    readme = Path(readme)
    old = readme.read_text(encoding="utf-8")
    new = replace_section(old, name, markdown, where=str(readme))
    if new == old:
        return False
    fd, tmp = tempfile.mkstemp(dir=readme.parent, prefix=f".{readme.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(new)
        os.chmod(tmp, readme.stat().st_mode & 0o777)
        os.replace(tmp, readme)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def load_results(name: str, results_dir: Path = RESULTS) -> dict[str, Any]:
    """Section `name`'s stored results files, by stem (those that exist), in listed order."""
    from kvfleet_bench.sections import SECTIONS

    section = SECTIONS[name]
    stored: dict[str, Any] = {}
    for stem in section.files:
        path = results_dir / f"{stem}.json"
        if path.exists():
            stored[stem] = json.loads(path.read_text(encoding="utf-8"))
    return stored


def render_section(name: str, results_dir: Path = RESULTS) -> str:
    """Section `name`'s generated markdown, from its stored results files."""
    from kvfleet_bench.sections import SECTIONS

    return SECTIONS[name].render(load_results(name, results_dir))


def refresh_section(name: str, out: Path | str | None = None, readme: Path = README) -> bool:
    """The entry scripts' hook: re-render section `name` after a run wrote `out`.

    Does nothing when `out` is not one of the section's stored results files in
    bench/results (a `--quick` run or a run written elsewhere leaves the README alone).
    """
    from kvfleet_bench.sections import SECTIONS

    if out is not None:
        path = Path(out).resolve()
        stored = {(RESULTS / f"{stem}.json").resolve() for stem in SECTIONS[name].files}
        if path not in stored:
            print(f"bench/README.md: section {name} left alone ({out} is not a stored "
                  f"results file of it)", file=sys.stderr)
            return False
    changed = write_section(name, render_section(name), readme)
    print(f"bench/README.md: section {name} {'rewritten' if changed else 'unchanged'}",
          file=sys.stderr)
    return changed


def main(argv: list[str] | None = None) -> int:
    from kvfleet_bench.sections import SECTIONS

    parser = argparse.ArgumentParser(description="Re-render bench/README.md's generated "
                                     "sections from the stored results (no benchmark runs).")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"of {', '.join(SECTIONS)}")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a section differs from its rendering")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    text = args.readme.read_text(encoding="utf-8")
    stale = []
    for name in args.names or list(SECTIONS):
        new = replace_section(text, name, render_section(name), where=str(args.readme))
        if new != text:
            stale.append(name)
        text = new
    if args.check:
        if stale:
            print(f"{args.readme}: stale section(s): {', '.join(stale)}", file=sys.stderr)
        return 1 if stale else 0
    if stale:
        for name in stale:  # one atomic write per section, as the entry scripts do
            write_section(name, render_section(name), args.readme)
    print(f"{args.readme}: rewrote {', '.join(stale) or 'nothing (up to date)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
