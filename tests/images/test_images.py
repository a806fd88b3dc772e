"""kvfleet's image: images/Dockerfile built and run by e2e/images.sh (buildah + podman, a
debootstrap base), plus the checks that need no container tools: the image's uid, entry
point, paths and default name agree with what the operator's builders render.

The e2e test skips with one line where root, podman, buildah, runc or debootstrap is
missing (`.ci/run` installs Debian's)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from kvfleet_operator.runtimes.kubernetes.build import security
from kvfleet_operator.runtimes.kubernetes.build.operator_manifests import build_operator_manifests
from kvfleet_operator.runtimes.kubernetes.build.options import KVFLEET_IMAGE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "e2e" / "images.sh"
BASE_SCRIPT = ROOT / "images" / "debootstrap-base.sh"
DOCKERFILE = ROOT / "images" / "Dockerfile"
SKIP_RC = 77
TOOLS = ("podman", "buildah", "runc", "debootstrap")


def missing_tools() -> str | None:
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return (f"e2e/images.sh needs {', '.join(missing)} "
                f"(Debian: apt-get install {' '.join(TOOLS)})")
    if os.geteuid() != 0:
        return "e2e/images.sh needs root (rootful podman, debootstrap)"
    return None


def dockerfile_final_stage() -> str:
    text = DOCKERFILE.read_text()
    return text[text.rindex("\nFROM "):]


def test_scripts_parse():
    for script in (SCRIPT, BASE_SCRIPT):
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert os.access(script, os.X_OK), f"{script} is not executable"
    if shutil.which("shellcheck"):
        out = subprocess.run(["shellcheck", "-x", "e2e/images.sh", "e2e/lib.sh",
                              "images/debootstrap-base.sh"], cwd=ROOT,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


def test_image_matches_the_builders():
    """uid, entry point, HOME and the default image name are what the pods assume."""
    final = dockerfile_final_stage()
    uid = int(re.search(r"^ARG KVFLEET_UID=(\d+)$", final, re.M).group(1))
    assert uid == security.RUN_AS_UID
    assert re.search(r"^USER \$\{KVFLEET_UID\}:\$\{KVFLEET_UID\}$", final, re.M)
    assert 'ENTRYPOINT ["kvfleet"]' in final
    assert "PATH=/opt/kvfleet/bin:" in final  # the builders exec `kvfleet` through PATH
    # The operator pod mounts only /tmp, so the image's own HOME must live there.
    operator = next(m for m in build_operator_manifests() if m["kind"] == "Deployment")
    container = operator["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["kvfleet"]
    assert [m["mountPath"] for m in container["volumeMounts"]] == [security.TMP_MOUNT]
    assert re.search(rf"^\s+HOME={security.TMP_MOUNT} \\$", final, re.M)
    # e2e/images.sh tags and runs the operator's default image name.
    assert f"IMAGE=${{KVFLEET_IMAGE:-{KVFLEET_IMAGE}}}" in SCRIPT.read_text()


def test_script_runs_containers_like_the_pods():
    """The env and scratch mounts e2e/images.sh gives engines and routers are cache_env()
    and scratch_volumes(); the uid is RUN_AS_UID."""
    text = SCRIPT.read_text()
    for item in security.cache_env():
        assert f"-e {item['name']}={item['value']}" in text, item
    _, mounts = security.scratch_volumes()
    for mount in mounts:
        assert f'--tmpfs "{mount["mountPath"]}:rw,exec' in text, mount
    assert f"RUN_UID={security.RUN_AS_UID} " in text
    for flag in ("--read-only", "--cap-drop ALL", "--security-opt no-new-privileges",
                 '--user "$RUN_UID:$RUN_UID"', "--runtime runc", "--network host"):
        assert flag in text, flag


def test_skips_with_one_line_without_podman(tmp_path):
    """Where podman is missing the script prints one SKIP line and exits 77."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("dirname",):  # all the script runs before it looks for podman
        (bin_dir / tool).symlink_to(shutil.which(tool))
    out = subprocess.run([shutil.which("bash"), str(SCRIPT)], capture_output=True, text=True,
                         env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, timeout=30)
    assert out.returncode == SKIP_RC, out.stderr
    assert out.stdout.splitlines() == [
        "SKIP: e2e/images.sh needs podman (Debian: apt-get install podman buildah runc "
        "debootstrap)"]


@pytest.mark.timeout(1800)
@pytest.mark.skipif(missing_tools() is not None, reason=missing_tools() or "")
def test_images_build_and_run():
    """Build the image and run engine, router and operator read-only as uid 1000."""
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=1700)
    if out.returncode == SKIP_RC:
        pytest.skip(out.stdout.strip())
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "all image checks passed" in out.stdout
