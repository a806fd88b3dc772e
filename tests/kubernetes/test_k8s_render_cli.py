"""`kvfleet operator render`: every example prints parseable YAML whose documents are
exactly `build_children`'s (with placeholder tokens); bad pools get one line and exit 2;
`kvfleet operator` without `run` or `render` says so in one line; `run`'s options."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from k8s_pools import EXAMPLES, ROOT
from kmock_shim import write_kubeconfig
from kvfleet_bench.procs import free_port
from kvfleet_operator.api import load_pool
from kvfleet_operator.cli import main as kvfleet_cli
from kvfleet_operator.cli.operator_cmd import (
    PLACEHOLDER_TOKEN,
    PLACEHOLDER_TOKENS,
    PLACEHOLDER_UID,
    main,
)
from kvfleet_operator.runtimes.kubernetes import build_children


def _kvfleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvfleet_operator.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _expected(path, namespace=None):
    pool = load_pool(path)
    if namespace:
        pool.namespace = namespace
    pool.uid = PLACEHOLDER_UID
    return build_children(pool, tokens=PLACEHOLDER_TOKENS)


def test_listed_as_a_subcommand():
    assert "operator" in kvfleet_cli.SUBCOMMANDS


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_render_prints_the_builders_documents(path, capsys):
    assert main(["render", str(path)]) == 0
    out = capsys.readouterr().out
    assert list(yaml.safe_load_all(out)) == _expected(path)
    assert out.count("# PLACEHOLDER token") == 2


def test_render_through_the_console_script_with_namespace_and_without_secrets():
    path = ROOT / "examples" / "vllm-disaggregated.yaml"
    proc = _kvfleet("operator", "render", str(path), "--namespace", "staging")
    assert proc.returncode == 0, proc.stderr
    docs = list(yaml.safe_load_all(proc.stdout))
    assert docs == _expected(path, "staging")
    assert {d["metadata"]["namespace"] for d in docs} == {"staging"}
    proc = _kvfleet("operator", "render", str(path), "--without-secrets", "--pool-uid", "abc")
    docs = list(yaml.safe_load_all(proc.stdout))
    assert "Secret" not in {d["kind"] for d in docs} and PLACEHOLDER_TOKEN not in proc.stdout
    assert {d["metadata"]["ownerReferences"][0]["uid"] for d in docs} == {"abc"}


BAD = {
    "not-yaml": "a: [",
    "bad-field": "apiVersion: kvfleet.io/v1alpha1\nkind: InferencePool\nmetadata: {name: p}\n"
                 "spec: {model: {name: m, source: 'hf://a/b'}, topology: {unified: {}},"
                 " engine: {blockSize: 3}}\n",
    "unservable": "apiVersion: kvfleet.io/v1alpha1\nkind: InferencePool\nmetadata: {name: p}\n"
                  "spec: {model: {name: m, source: 'file:///m.gguf'}, engine: {kind: builtin},"
                  " topology: {unified: {}}}\n",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_pool_is_one_line_and_exit_2(case, tmp_path):
    path = tmp_path / f"{case}.yaml"
    path.write_text(BAD[case])
    proc = _kvfleet("operator", "render", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvfleet operator render: "), proc.stderr
    assert str(path) in lines[0] and "Traceback" not in proc.stderr


def test_missing_file_is_one_line(capsys):
    assert main(["render", "no/such/pool.yaml"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot read" in err[0]


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["--all-namespaces"]])
def test_run_or_render_is_needed(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "say `run`, `render` or `manifests`" in err[0]


@pytest.mark.parametrize("argv", [["run"], ["run", "-n", "a", "--all-namespaces"],
                                  ["run", "-A", "--max-tick", "0"],
                                  ["run", "-A", "--metrics-port", "70000"]])
def test_run_needs_one_scope_and_sane_options(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvfleet operator run: ")


def test_help():
    proc = _kvfleet("operator", "--help")
    assert proc.returncode == 0 and "usage" in proc.stdout.lower() and "render" in proc.stdout
    proc = _kvfleet("operator", "render", "--help")
    assert proc.returncode == 0 and "--namespace" in proc.stdout
    proc = _kvfleet("operator", "run", "--help")
    assert proc.returncode == 0
    for option in ("--namespace", "--all-namespaces", "--liveness", "Recreate"):
        assert option in proc.stdout


def test_run_starts_kopf_standalone_with_the_scope_asked_for(monkeypatch, tmp_path):
    import kopf

    seen = {}

    async def fake_operator(**kwargs):
        seen.update(kwargs)

    monkeypatch.setattr(kopf, "operator", fake_operator)
    monkeypatch.setattr(kopf, "configure", lambda **_: None)  # leave the tests' logging be
    # `run` checks for credentials before kopf starts
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "https://127.0.0.1:6443")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    liveness, metrics = f"http://0.0.0.0:{free_port()}/healthz", free_port()  # and the ports
    assert main(["run", "-n", "a", "-n", "b", "--liveness", liveness,
                 "--metrics-port", str(metrics)]) == 0
    assert seen["standalone"] is True  # no peering: exactly one replica (Recreate) acts
    assert seen["clusterwide"] is False and seen["namespaces"] == ["a", "b"]
    assert seen["liveness_endpoint"] == liveness
    assert seen["memo"].config.metrics_port == metrics
    assert main(["run", "-A"]) == 0
    assert seen["clusterwide"] is True and seen["namespaces"] == []
