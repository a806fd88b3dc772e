"""The offline validator and doc generator as commands: clear output, right exit codes."""

from __future__ import annotations

import subprocess
import sys

from kvfleet_operator.tools import crd_validate
from pool_corpus import EXAMPLES, ROOT


def run(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_validator_accepts_the_examples():
    proc = run("kvfleet_operator.tools.crd_validate", *map(str, EXAMPLES))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(": valid") == len(EXAMPLES)


def test_validator_reports_bad_pools_one_line_each(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLES[0].read_text().replace("max: 3", "max: 0"))
    junk = tmp_path / "junk.yaml"
    junk.write_text("spec: [unclosed\n")
    assert crd_validate.main([str(bad), str(junk), str(tmp_path / "missing.yaml")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert any("spec.topology.unified.replicas.max: max must be >= 1 [cel]" in e for e in err)
    assert any("junk.yaml: cannot read" in e for e in err)
    assert any("missing.yaml: cannot read" in e for e in err)
    assert not any("Traceback" in e for e in err)


def test_validator_usage():
    assert crd_validate.main([]) == 2
    assert crd_validate.main(["--help"]) == 0


def test_doc_generator_runs_as_a_module():
    proc = run("kvfleet_operator.tools.crd_docs")
    assert proc.returncode == 0 and proc.stdout.startswith("# InferencePool reference")
