"""bench/README.md is what the benchmarks wrote.

1. Every registered benchmark has exactly one begin/end marker pair in bench/README.md, and
   every entry script that writes results to bench/results hands its section to
   `kvfleet_bench.readme` at the end of its main.
2. Re-rendering every section from the stored results in bench/results reproduces the
   committed README byte for byte.
3. Outside the generated blocks the README carries no hand-typed figure (see `figures`).

Each check is also run once against a broken copy (a figure typed outside a block, a number
changed inside one, a marker deleted) to show that it fails.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from kvfleet_bench import readme
from kvfleet_bench.sections import SECTIONS

BENCH = Path(readme.__file__).resolve().parents[1]
README = BENCH / "README.md"

# --- what a "figure" is -------------------------------------------------------------------
#
# A number standing on its own (not part of an identifier, a path, a hyphenated name such
# as `h100-llama3-8b-1000.yaml`, a commit hash such as `4a61d63` or a level label such as
# `512:1600`) is a figure when it
#   - has a decimal point (`0.5`, `1.3x`),
#   - carries a percent sign or a unit, attached or after one space (`50%`, `10 ms`,
#     `3x`, `4 ×`, `9.5 MB`, `5 s`, `1 GB/s`, `200 req/s`, ...),
#   - has three or more digits or a thousands separator (`390`, `1,000`), except a year
#     (19xx, 20xx) standing alone and an HTTP status written as `HTTP 404`;
# and `x11` / `×11` (a compression factor written before the number) is one too. Small bare
# counts ("2 cores", "four replicas", "64 requests", "rep 1") are setup words, not figures.

_UNIT = (r"(?:%|x(?![A-Za-z])|×|µs|us|ms|s|sec|seconds?|min|minutes?|h|hours?"
         r"|[KMGT]i?B(?:/s)?|[KMGT]b/s|req/s|tok/s|tokens/s|core-s|replica-s)")
_NUMBER = re.compile(r"(?<![\w.\-/:])(?<!HTTP )(?P<num>[−-]?\d+(?:,\d{3})*(?:\.\d+)?)"
                     r"(?P<unit>\s?" + _UNIT + r"(?![\w/]))?(?![\w/]|:\d|\.\d)")
_PREFIXED = re.compile(r"(?<![\w])[x×]\d+\b")
_YEAR = re.compile(r"(?:19|20)\d\d")


def figures(text: str) -> list[str]:
    """The figures in `text` (see above), as found."""
    found = []
    for m in _NUMBER.finditer(text):
        num, unit = m.group("num"), m.group("unit")
        digits = num.lstrip("−-").replace(",", "")
        if unit or "." in num or "," in num or (len(digits) >= 3 and not _YEAR.fullmatch(digits)):
            found.append(m.group(0))
    found += [m.group(0) for m in _PREFIXED.finditer(text)]
    return found


def outside_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every README line outside the generated blocks."""
    out, inside = [], None
    for number, line in enumerate(text.splitlines(), 1):
        m = re.fullmatch(r"<!-- bench:([\w-]+):(begin|end) -->", line.strip())
        if m and m.group(2) == "begin":
            inside = m.group(1)
            continue
        if m and m.group(2) == "end":
            inside = None
            continue
        if inside is None:
            out.append((number, line))
    return out


def figures_outside(text: str) -> list[str]:
    return [f"line {n}: {fig!r} in {line.strip()!r}"
            for n, line in outside_blocks(text) for fig in figures(line)]


def marker_problems(text: str) -> list[str]:
    problems = []
    for name in SECTIONS:
        begin, end = readme.begin_marker(name), readme.end_marker(name)
        lines = text.splitlines()
        for marker in (begin, end):
            if lines.count(marker) != 1 or text.count(marker) != 1:
                problems.append(f"{marker} appears {text.count(marker)} times (on its own "
                                f"line {lines.count(marker)} times); it must appear once")
        if begin in lines and end in lines and lines.index(end) < lines.index(begin):
            problems.append(f"{end} comes before {begin}")
    stray = set(re.findall(r"<!-- bench:([\w-]+):(?:begin|end) -->", text)) - set(SECTIONS)
    problems += [f"markers of an unregistered section {name!r}" for name in sorted(stray)]
    return problems


def regenerated(text: str) -> str:
    for name in SECTIONS:
        text = readme.replace_section(text, name, readme.render_section(name))
    return text


# --- 1. markers and the entry scripts' hook --------------------------------------------


def test_every_section_has_one_pair_of_markers():
    assert marker_problems(README.read_text(encoding="utf-8")) == []


HOOKS = ("refresh_section", "write_section")


def _called_names(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def _hooks_of(module: str) -> set[str]:
    """The functions of kvfleet_bench.`module` that call the hook."""
    path = BENCH / "kvfleet_bench" / f"{module}.py"
    if not path.exists():
        return set()
    return {node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef) and _called_names(node) & set(HOOKS)}


def _calls_readme_hook(path: Path) -> bool:
    """The script calls the hook itself or a kvfleet_bench function it imports that calls
    it (a script may end through a shared helper, such as fidelity_run.finish)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    hooks = set(HOOKS)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvfleet_bench."):
            helpers = _hooks_of(node.module.split(".", 1)[1])
            hooks |= {alias.asname or alias.name for alias in node.names
                      if alias.name in helpers}
    return bool(_called_names(tree) & hooks)


def _writes_results(path: Path) -> bool:
    """An entry script that names bench/results as where its results go."""
    text = path.read_text(encoding="utf-8")
    names = r"""\bRESULTS(?:_DIR)?\b|["']results["']|bench/results/\w+\.json"""
    return bool(re.search(names, text)) and "__main__" in text


def test_every_results_writing_script_is_registered_and_calls_the_hook():
    scripts = sorted(p for p in BENCH.glob("*.py") if _writes_results(p))
    assert scripts, "found no entry script writing bench/results"
    stems = {p.stem for p in scripts}
    assert set(SECTIONS) <= stems, f"sections without a script: {set(SECTIONS) - stems}"
    assert stems <= set(SECTIONS), f"scripts writing results with no README section: " \
        f"{sorted(stems - set(SECTIONS))}"
    missing = [p.name for p in scripts if not _calls_readme_hook(p)]
    assert missing == [], f"entry scripts not calling kvfleet_bench.readme: {missing}"


def test_every_registered_results_file_is_stored():
    for section in SECTIONS.values():
        for stem in section.files:
            assert (readme.RESULTS / f"{stem}.json").is_file(), f"{section.name}: {stem}.json"


# --- 2. the README is what the benchmarks wrote -----------------------------------------


def test_regenerating_every_section_reproduces_the_readme_byte_for_byte():
    text = README.read_text(encoding="utf-8")
    assert regenerated(text) == text, (
        "bench/README.md differs from what its sections render from bench/results; run "
        "`cd bench && ../.venv/bin/python -m kvfleet_bench.readme` (do not edit the blocks)")


# --- 3. no hand-typed figure outside the blocks -----------------------------------------


def test_no_figure_outside_the_generated_blocks():
    assert figures_outside(README.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize("text, expected", [
    ("took 0.5 s", ["0.5 s"]), ("10 ms apart", ["10 ms"]), ("36.4% of", ["36.4%"]),
    ("1.3x the", ["1.3x"]), ("a 3x gain", ["3x"]), ("peak 790 MB", ["790 MB"]),
    ("1,000 pools", ["1,000"]), ("at 12.5 GB/s", ["12.5 GB/s"]), ("replayed at x11", ["x11"]),
    ("−0.014 per rep", ["−0.014"]), ("(1.72–2.06)", ["1.72", "2.06"]), ("390 requests", ["390"]),
    ("2 cores, 64 requests, rep 1", []), ("in 2026", []), ("h100-llama3-8b-1000.yaml", []),
    ("commit 4a61d63", []), ("`512:1600` level", []), ("kv_pool_c16_probe.md", []),
    ("prefix 1 / queue 4 / kv 0", []), ("bf16, fp32, p50 / p99", []), ("HTTP 429", []),
    ("returns 429", ["429"]),
])
def test_figure_definition(text, expected):
    assert figures(text) == expected


# --- each check, broken once ---------------------------------------------------------------


def _first_block_line(text: str, name: str) -> int:
    lines = text.splitlines()
    start = lines.index(readme.begin_marker(name))
    return next(i for i in range(start + 1, len(lines)) if re.search(r"\d\.\d", lines[i]))


def test_a_figure_typed_outside_a_block_is_caught():
    text = README.read_text(encoding="utf-8")
    broken = text.replace("## Router overhead:", "## Router overhead (about 3.2 ms added):", 1)
    assert broken != text
    assert any("3.2 ms" in problem for problem in figures_outside(broken))
    assert regenerated(broken) == broken  # the blocks alone cannot see it


def test_a_number_changed_inside_a_block_is_caught():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    i = _first_block_line(text, "kv_pool")
    lines[i] = re.sub(r"(\d)\.(\d)", lambda m: f"{m.group(1)}.{(int(m.group(2)) + 1) % 10}",
                      lines[i], count=1)
    broken = "".join(lines)
    assert broken != text
    assert regenerated(broken) != broken
    assert figures_outside(broken) == []  # only the byte-for-byte check sees it


@pytest.mark.parametrize("which", ["begin", "end"])
def test_a_deleted_marker_is_caught(which, tmp_path):
    text = README.read_text(encoding="utf-8")
    marker = getattr(readme, f"{which}_marker")("sim_scale")
    broken = text.replace(marker + "\n", "", 1)
    assert broken != text
    assert any(marker in problem for problem in marker_problems(broken))
    with pytest.raises(readme.SectionError, match="missing"):
        regenerated(broken)
    copy = tmp_path / "README.md"
    copy.write_text(broken, encoding="utf-8")
    with pytest.raises(readme.SectionError, match="missing"):
        readme.write_section("sim_scale", "x", copy)
    assert copy.read_text(encoding="utf-8") == broken  # nothing written


def test_a_duplicated_marker_is_caught():
    text = README.read_text(encoding="utf-8")
    marker = readme.end_marker("kv_pool")
    broken = text.replace(marker, marker + "\n\n" + marker, 1)
    assert any(marker in problem for problem in marker_problems(broken))
    with pytest.raises(readme.SectionError, match="2 times"):
        readme.replace_section(broken, "kv_pool", "x")


# --- write_section and the entry scripts' hook ---------------------------------------------


def test_write_section_replaces_only_its_block(tmp_path):
    path = tmp_path / "README.md"
    path.write_text("intro\n\n<!-- bench:a:begin -->\nold\n<!-- bench:a:end -->\n\n"
                    "<!-- bench:b:begin -->\nkeep\n<!-- bench:b:end -->\nend\n", encoding="utf-8")
    assert readme.write_section("a", "new | 1.5\n", path) is True
    assert path.read_text(encoding="utf-8") == (
        "intro\n\n<!-- bench:a:begin -->\n\nnew | 1.5\n\n<!-- bench:a:end -->\n\n"
        "<!-- bench:b:begin -->\nkeep\n<!-- bench:b:end -->\nend\n")
    assert readme.write_section("a", "new | 1.5", path) is False
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_refresh_ignores_results_written_elsewhere(tmp_path):
    copy = tmp_path / "README.md"
    copy.write_text("unchanged", encoding="utf-8")
    assert readme.refresh_section("kv_pool", tmp_path / "kv_pool.json", copy) is False
    assert copy.read_text(encoding="utf-8") == "unchanged"


def test_refresh_of_a_stored_results_file_rewrites_its_section(tmp_path):
    copy = tmp_path / "README.md"
    text = README.read_text(encoding="utf-8")
    copy.write_text(readme.replace_section(text, "kv_pool", "stale"), encoding="utf-8")
    assert readme.refresh_section("kv_pool", readme.RESULTS / "kv_pool_c8.json", copy) is True
    assert copy.read_text(encoding="utf-8") == text


def test_the_command_line_checks_and_rewrites(tmp_path):
    copy = tmp_path / "README.md"
    text = README.read_text(encoding="utf-8")
    copy.write_text(readme.replace_section(text, "sim_scale", "stale"), encoding="utf-8")
    assert readme.main(["--readme", str(copy), "--check"]) == 1
    assert readme.main(["--readme", str(copy), "kv_pool"]) == 0  # another section: still stale
    assert readme.main(["--readme", str(copy), "--check", "sim_scale"]) == 1
    assert readme.main(["--readme", str(copy)]) == 0
    assert copy.read_text(encoding="utf-8") == text
    assert readme.main(["--readme", str(copy), "--check"]) == 0


def _seeded_entry(spent: list[float]) -> dict:
    summary = {"slo_attainment": 0.99, "prefix_hit_rate": 0.0, "ttft_p50_s": 0.05,
               "ttft_p90_s": 0.2, "imbalance_mean": 0.5, "replica_seconds": sorted(spent)[1],
               "num_failed": 0, "spread": {"slo_attainment": [0.98, 1.0],
                                           "replica_seconds": [min(spent), max(spent)]}}
    run = {"variant": {"pool_path": "sim/pools/p.yaml", "scaler": "kvfleet", "policy": None},
           "summary": summary}
    return {"result": {"args": {"command": "compare", "pool": ["sim/pools/p.yaml"],
                                "scaler": ["kvfleet"]}, "runs": [run], "medians": [summary]}}


@pytest.mark.parametrize("spent, cell", [
    ([2013.0, 2044.0, 2073.0], "| 2,044 (2,013–2,073) |"),  # the seeds moved the scaler
    ([4800.0, 4800.0, 4800.0], "| 4,800 |"),  # a fixed fleet: the figure bare
])
def test_seeded_replica_seconds_show_their_spread_where_it_varies(spent, cell):
    from kvfleet_bench.sections.sim_policies import _compare

    assert cell in _compare(_seeded_entry(spent))
