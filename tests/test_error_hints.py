"""The sentence under a FileNotFoundError for the sandbox's own /tmp, /var/tmp and /run (issue 31,
Must 5): which errors get it (no process; the real kernel's is in test_sandbox.py)."""

from __future__ import annotations

import errno

import pytest

from ivralo_kernel.kernel.error_hints import private_tmp_hint

pytestmark = pytest.mark.fast


def missing(*names: object) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "No such file or directory", *names)


def test_which_missing_files_get_the_sentence() -> None:
    hint = private_tmp_hint(missing("/tmp/data.csv"), "/home/me/proj", sandboxed=True)
    assert hint is not None and hint.startswith("ivralo: /tmp/data.csv is not there because this kernel's /tmp")
    assert "put it in the workspace (/home/me/proj)" in hint
    assert "kernel's /var/tmp is its own" in str(private_tmp_hint(missing(b"/var/tmp/x"), "/w", sandboxed=True))
    assert "kernel's /run is its own" in str(private_tmp_hint(missing("/run/user/1000/x"), "/w", sandboxed=True))
    # rename's second path; a library's own FileNotFoundError that names the path only in its message
    assert "/tmp/b" in str(private_tmp_hint(missing("", None, "/tmp/b"), "/w", sandboxed=True))
    said = private_tmp_hint(FileNotFoundError("no file at '/tmp/in.parquet'"), "/w", sandboxed=True)
    assert said is not None and said.startswith("ivralo: /tmp/in.parquet is not there")
    # Not said: a workspace under /tmp is the host's own folder; other folders; no sandbox; other errors.
    assert private_tmp_hint(missing("/tmp/ws/data.csv"), "/tmp/ws", sandboxed=True) is None
    assert private_tmp_hint(missing("/tmpdata/x"), "/w", sandboxed=True) is None
    assert private_tmp_hint(missing("/home/me/x"), "/w", sandboxed=True) is None
    assert private_tmp_hint(missing("/tmp/data.csv"), "/w", sandboxed=False) is None
    assert private_tmp_hint(PermissionError(errno.EACCES, "denied", "/tmp/x"), "/w", sandboxed=True) is None
