import subprocess
import sys

from kvfleet_operator.cli import main as cli


def test_help_lists_every_subcommand_and_each_one_answers_help(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("up", "status", "engine", "router", "sim"):
        assert f"  {name} " in out
    for name in cli.SUBCOMMANDS:  # nothing listed that only says "not available"
        proc = subprocess.run([sys.executable, "-m", "kvfleet_operator.cli.main", name, "--help"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, (name, proc.stderr[-500:])
        assert "usage" in proc.stdout.lower(), name
    for name in ("bench",):  # not in this build: unknown, one line, exit 2
        assert cli.main([name]) == 2
        assert "unknown command" in capsys.readouterr().err
    assert cli.main(["operator"]) == 2  # `run` or `render` is needed: one line, exit 2
    assert "say `run`, `render` or `manifests`" in capsys.readouterr().err


def test_unknown_subcommand_is_one_line_error(capsys):
    assert cli.main(["frobnicate"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown command" in err[0]


def test_console_script_runs_without_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "kvfleet_operator.cli", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0
    assert "Traceback" not in proc.stderr


def test_stdlib_operator_module_is_not_shadowed():
    import operator

    assert hasattr(operator, "itemgetter")
