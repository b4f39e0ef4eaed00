"""In a container: ``doctor`` and the banner name the container's own settings for the full sandbox,
and those settings work. The container is emulated (tests/container.py): ``docker-default`` is
Docker's default seccomp profile without CAP_SYS_ADMIN, ``docker-userns`` the same container given
the seccomp settings docs/remote.md shows. Every outcome is judged from outside the kernel: the
``.git`` file on disk, doctor's own JSON (the host's report, not the kernel's words)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from container import command, run
from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from sandbox_cases import sh
from test_vscode_launch import raw_launch

from ivralo_kernel.protocol.sandbox.container import ENV_CONTAINER_ROOT

pytestmark = pytest.mark.timeout(240)
HOST_ADVICE = ("sysctl", "unprivileged_userns_clone")
GIT_WRITE = "mkdir -p .git/hooks && echo 'touch pwned' > .git/hooks/pre-commit"

# A host under the emulation: one kernel through the ivralo host (sandbox="auto", the default), the
# banner's notes and the result of a shell that writes a git hook, as JSON on stdout.
HOST_SCRIPT = """
import asyncio, json, sys
from ivralo_kernel.host import Session

async def main():
    async with Session(workspace=sys.argv[1]) as session:
        code = "import subprocess; subprocess.run(['sh', '-c', %r]); print('ran')" % sys.argv[2]
        result = await session.run(code)
        info = session.kernel_info.get("ivralo", {})
    print(json.dumps({"result": result, "notes": info.get("notes", []), "layers": info.get("layers", {})}))

asyncio.run(main())
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    return {**env, **extra}


def _doctor(profile: str, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    done = run(profile, [sys.executable, "-m", "ivralo_kernel", "doctor", "--json"], env=env, cwd=cwd, timeout=180)
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"doctor printed no report (status {done.returncode}): {done.stdout[-2000:]} {done.stderr[-2000:]}")
    return report


def _sandbox_check(report: dict[str, Any]) -> dict[str, str]:
    (check,) = [c for c in report["checks"] if c["mechanism"] == "OS sandbox"]
    return check


def _kernel(profile: str, workspace: Path, env: dict[str, str]) -> dict[str, Any]:
    done = run(profile, [sys.executable, "-c", HOST_SCRIPT, str(workspace), GIT_WRITE], env=env, cwd=workspace)
    assert done.returncode == 0, done.stderr[-3000:]
    reported: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    assert reported["result"] == "ran\n", reported
    return reported


def test_with_the_userns_settings_doctor_reports_the_sandbox_and_a_kernel_is_sandboxed(tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    env = _env(KUBERNETES_SERVICE_HOST="127.0.0.1")  # a pod given hostUsers: false and the seccomp profile
    report = _doctor("docker-userns", workspace, env)
    check = _sandbox_check(report)
    assert check["status"] == "ok" and check["detail"].startswith("bwrap"), check
    assert report["container"]["runtime"] == "Kubernetes", report["container"]

    _kernel("docker-userns", workspace, env)
    hook = workspace / ".git" / "hooks" / "pre-commit"
    assert not hook.exists(), f"a shell in the kernel wrote {hook}: {hook.read_text()!r}"


def test_with_docker_defaults_doctor_names_dockers_settings_not_a_sysctl(tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    fake_root = tmp_path / "container-root"
    fake_root.mkdir()
    (fake_root / ".dockerenv").write_text("")
    report = _doctor("docker-default", workspace, _env(**{ENV_CONTAINER_ROOT: str(fake_root)}))
    check = _sandbox_check(report)
    assert check["status"] == "missing", check
    assert report["container"]["runtime"] == "Docker", report["container"]
    for setting in ("--security-opt seccomp=", "apparmor=unconfined", "systempaths=unconfined"):
        assert setting in check["next_step"], check
    text = json.dumps(report)
    assert not any(word in text for word in HOST_ADVICE), [c for c in report["checks"] if "sysctl" in json.dumps(c)]
    closers = check["detail"].partition("the full sandbox closes each gap: ")[2]
    for gap in (".git/", ".env"):  # each gap not_stopped names, with what closes it
        assert gap in closers, check
    assert ("unix sockets" in closers) == ("unix socket" in report["kernel"]["layers"]["not_stopped"]), check


def test_in_a_pod_with_defaults_the_banner_names_each_gap_with_the_pods_settings(tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    reported = _kernel("docker-default", workspace, _env(KUBERNETES_SERVICE_HOST="127.0.0.1"))
    (note,) = [n for n in reported["notes"] if n.startswith("no OS sandbox")]
    for words in ("hostUsers: false", "procMount: Unmasked", "seccompProfile", "appArmorProfile", ".git/", ".env"):
        assert words in note, note
    assert not any(word in note for word in HOST_ADVICE), note
    # The gap the banner names is real: the fallback lets a shell write the hook (judged on disk).
    assert (workspace / ".git" / "hooks" / "pre-commit").exists()


def test_outside_a_container_doctor_says_nothing_of_one(tmp_path: Path) -> None:
    from ivralo_kernel.protocol.sandbox.container import detect

    empty = tmp_path / "root"
    empty.mkdir()
    assert detect({ENV_CONTAINER_ROOT: str(empty)}) is None
    (empty / "run").mkdir()
    (empty / "run" / ".containerenv").write_text("")
    found = detect({ENV_CONTAINER_ROOT: str(empty)})
    assert found is not None and found.runtime == "Podman" and "unmask=ALL" in found.settings
    (empty / "run" / ".containerenv").unlink()
    (empty / "proc" / "1").mkdir(parents=True)
    (empty / "proc" / "1" / "cgroup").write_text("0::/kubepods/besteffort/pod1234/abcd\n")
    found = detect({ENV_CONTAINER_ROOT: str(empty)})
    assert found is not None and found.runtime == "Kubernetes"


def test_the_tailored_seccomp_profile_allows_what_the_userns_emulation_allows() -> None:
    """deploy/container/make_seccomp_profile.py adds to Docker's default exactly what docker-userns
    allows beyond docker-default (so the test above, under docker-userns, shows that profile works)."""
    import importlib.util

    import container

    path = Path(__file__).resolve().parents[1] / "deploy" / "container" / "make_seccomp_profile.py"
    spec = importlib.util.spec_from_file_location("make_seccomp_profile", path)
    assert spec is not None and spec.loader is not None
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    without_admin = {"excludes": {"caps": ["CAP_SYS_ADMIN"]}}
    default = {  # the shape of Docker's default profile: the rules that matter here
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [
            {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
            {
                "names": ["mount", "unshare", "setns", "clone"],
                "action": "SCMP_ACT_ALLOW",
                "includes": {"caps": ["CAP_SYS_ADMIN"]},
            },
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ALLOW",
                "args": [{"index": 0, "value": 2114060288}],
                **without_admin,
            },
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38, **without_admin},
            {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_BPF"]}},
        ],
    }
    rules = maker.tailored(default)["syscalls"]
    unconditional = {
        n
        for r in rules
        if r["action"] == "SCMP_ACT_ALLOW" and set(r) <= {"names", "action", "comment"}
        for n in r["names"]
    }
    assert set(container.NAMESPACE_CALLS) | {"clone", "clone3"} <= unconditional
    assert not any(r["action"] == "SCMP_ACT_ERRNO" for r in rules), "clone3 would still answer ENOSYS"
    assert not unconditional & set(container.ALWAYS_REFUSED), "the profile allows what every container is refused"


@pytest.mark.parametrize("profile", ["docker-default", "docker-userns"])
def test_vs_code_s_raw_launch_in_a_pod_says_and_does_the_same(profile: str, workspace: Path, tmp_path: Path) -> None:
    """Must 5: kernel.json's argv run as VS Code runs it, in the emulated pod: with the defaults the
    banner names the pod's settings (no sysctl) and the gap is real; with them, the hook is refused."""
    spec = KernelSpecManager().get_kernel_spec("ivralo")
    pod = KernelSpec(**{**spec.to_dict(), "argv": command(profile, spec.argv)})
    pod.env = {**spec.env, "KUBERNETES_SERVICE_HOST": "127.0.0.1"}
    with raw_launch(workspace, tmp_path, spec=pod) as kernel:
        kernel.client.kernel_info()
        info = kernel.client.get_shell_msg(timeout=30)["content"]["ivralo"]
        sh(kernel.client, GIT_WRITE)
    hook = workspace / ".git" / "hooks" / "pre-commit"
    fallback = [n for n in info["notes"] if n.startswith("no OS sandbox")]
    if profile == "docker-userns":
        assert not fallback and info["layers"]["sandbox"].startswith("bwrap"), info["notes"]
        assert not hook.exists(), f"a shell in the kernel wrote {hook}"
        return
    (note,) = fallback
    assert "hostUsers: false" in note and "procMount: Unmasked" in note and ".git/" in note, note
    assert not any(word in note for word in HOST_ADVICE), note
    assert hook.exists(), "the fallback's named gap (a git hook written by a shell) is not what it says"
