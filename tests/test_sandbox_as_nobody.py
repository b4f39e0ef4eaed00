"""The sandbox's cases again as an unprivileged user: user namespaces behave differently for root
(CI, containers) and for everybody else, so ``tests/test_sandbox.py`` runs once more under
``runuser -u nobody``, with its fallback twin and VS Code's raw launch (which builds the sandbox
itself), in its own pytest, from this checkout and interpreter."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
NOBODY = "nobody"


def _as_nobody(*argv: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    # runuser sets HOME and the like from the passwd entry (nobody's is /nonexistent): env sets ours.
    settings = [f"{name}={value}" for name, value in env.items()]
    return subprocess.run(
        ["runuser", "-u", NOBODY, "--", "env", *settings, *argv],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_sandbox_cases_pass_as_an_unprivileged_user() -> None:
    if os.geteuid() != 0:
        pytest.skip("this run is already unprivileged: tests/test_sandbox.py is that case")
    if shutil.which("runuser") is None:
        pytest.fail("runuser (util-linux) is needed to run the sandbox's cases as an unprivileged user")
    import pwd

    uid = pwd.getpwnam(NOBODY).pw_uid
    home = Path(tempfile.mkdtemp(prefix="ivralo-nobody-home-"))  # pytest's tmp_path is private to root
    os.chown(home, uid, -1)
    run_user = Path(f"/run/user/{uid}")  # where the person's sockets live (the unix-socket case)
    made_run_user = not run_user.exists()
    if made_run_user:
        run_user.mkdir(parents=True)
        os.chown(run_user, uid, -1)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "CI": os.environ.get("CI", ""),
    }
    try:
        probe = _as_nobody(sys.executable, "-c", "import ivralo_kernel, pytest", env=env, timeout=60)
        if probe.returncode != 0:
            why = (
                f"{NOBODY} cannot run {sys.executable} with this checkout ({probe.stderr.strip()[-300:]}); give "
                f"the folders above {REPO} and the interpreter's o+x (.ci/run does this on CI)"
            )
            if os.environ.get("CI"):
                pytest.fail(why)
            pytest.skip(why)
        done = _as_nobody(
            sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
            "tests/test_sandbox.py", "tests/test_sandbox_fallback.py", "tests/test_vscode_launch.py",
            "tests/test_closed_links_and_home.py",  # the host covers links from outside the nested namespace
            env=env,
            timeout=840,
        )  # fmt: skip
    finally:
        if made_run_user:
            shutil.rmtree(run_user, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
    assert done.returncode == 0, f"as {NOBODY}:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
