"""[host] ``Session.run_tests``: a test run in a fresh kernel of the chosen surface.

Each run gets its own kernel, started for it and ended after it (the session's namespace stays as it
was, and a test module edited since the last run is read again), with the session's workspace, role,
deadline and limits: one run is one execution, under ``deadline_ms``.

* ``runner="project"``: pytest, in the project's interpreter, which must have pytest itself (ivralo's
  private path would otherwise lend it one the project never declared).
* ``runner="hermetic"``: pytest is third-party, so the hermetic surface cannot have it. The run uses the
  standard library: it collects what pytest would from plain files (``test_*.py`` / ``*_test.py``;
  ``test*`` functions, ``Test*`` classes' ``test*`` methods, ``unittest.TestCase``s) and runs them with
  plain ``assert``s, while the surface's import hook judges every import the tests make. Fixtures and
  plugins need pytest: such a test is skipped, saying so. A module the surface does not have stops its
  file's collection, and the result points to ``runner="project"``.

The runners below are cells (text), sent as one execution; the host never imports them.
"""

from __future__ import annotations

import json
from typing import Any

from ivralo_kernel.protocol import names

RUNNERS = (names.SURFACE_HERMETIC, names.SURFACE_PROJECT)
MARKER = "__ivralo_test_report__ "

_PROJECT_CELL = """\
import json as _ivralo_json
import pytest as _ivralo_pytest


class _IvraloCount:
    def __init__(self):
        self.counts = {{"passed": 0, "failed": 0, "errors": 0, "skipped": 0}}

    def pytest_collectreport(self, report):
        if report.failed:
            self.counts["errors"] += 1

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            key = {{"passed": "passed", "failed": "failed"}}.get(report.outcome, "skipped")
        elif report.failed:
            key = "errors"
        elif report.when == "setup" and report.skipped:
            key = "skipped"
        else:
            return
        self.counts[key] += 1


_ivralo_count = _IvraloCount()
_ivralo_code = _ivralo_pytest.main(
    [{target}, "-p", "no:cacheprovider", "--capture=sys", *{args}], plugins=[_ivralo_count]
)
print({marker!r} + _ivralo_json.dumps({{**_ivralo_count.counts, "exit_code": int(_ivralo_code)}}))
"""

_HERMETIC_CELL = """\
import importlib.util as _ivralo_util
import inspect as _ivralo_inspect
import json as _ivralo_json
import os as _ivralo_os
import sys as _ivralo_sys
import time as _ivralo_time
import traceback as _ivralo_tb
import unittest as _ivralo_unittest


def _ivralo_files(target):
    if not _ivralo_os.path.isdir(target):
        return [target]
    found = []
    for root, dirs, files in _ivralo_os.walk(target):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules"))
        found += [
            _ivralo_os.path.join(root, f)
            for f in sorted(files)
            if f.endswith(".py") and (f.startswith("test_") or f.endswith("_test.py"))
        ]
    return found


def _ivralo_tests(module):
    for name, value in sorted(vars(module).items()):
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if _ivralo_inspect.isclass(value) and issubclass(value, _ivralo_unittest.TestCase):
            yield name, value, None
        elif _ivralo_inspect.isclass(value) and name.startswith("Test"):
            for method in sorted(m for m in dir(value) if m.startswith("test")):
                yield f"{{name}}::{{method}}", value, method
        elif _ivralo_inspect.isfunction(value) and name.startswith("test"):
            yield name, value, None


def _ivralo_call(test, method):
    function = getattr(test(), method) if method else test
    needs = [
        p.name
        for p in _ivralo_inspect.signature(function).parameters.values()
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if needs:
        raise _ivralo_unittest.SkipTest(
            f"needs pytest fixtures ({{', '.join(needs)}}): run it with runner='project'"
        )
    function()


def _ivralo_run(target):
    counts = {{"passed": 0, "failed": 0, "errors": 0, "skipped": 0}}
    missing = []
    started = _ivralo_time.monotonic()
    for index, path in enumerate(_ivralo_files(target)):
        folder = _ivralo_os.path.dirname(_ivralo_os.path.abspath(path))
        if folder not in _ivralo_sys.path:
            _ivralo_sys.path.insert(0, folder)
        try:
            spec = _ivralo_util.spec_from_file_location(f"_ivralo_tests_{{index}}", path)
            module = _ivralo_util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except ModuleNotFoundError as exc:
            counts["errors"] += 1
            if type(exc).__name__ == "HermeticImportError":
                missing.append({{"file": path, "module": exc.name, "message": str(exc)}})
            print(f"ERROR collecting {{path}}: {{type(exc).__name__}}: {{exc}}")
            continue
        except BaseException:
            counts["errors"] += 1
            print(f"ERROR collecting {{path}}:\\n{{_ivralo_tb.format_exc()}}")
            continue
        for name, test, method in _ivralo_tests(module):
            if method is None and _ivralo_inspect.isclass(test):
                result = _ivralo_unittest.TestResult()
                _ivralo_unittest.defaultTestLoader.loadTestsFromTestCase(test).run(result)
                counts["failed"] += len(result.failures)
                counts["errors"] += len(result.errors)
                counts["skipped"] += len(result.skipped)
                counts["passed"] += result.testsRun - len(result.failures) - len(result.errors) - len(result.skipped)
                for case, text in result.failures + result.errors:
                    print(f"FAILED {{path}}::{{case.id()}}\\n{{text}}")
                continue
            try:
                _ivralo_call(test, method)
            except _ivralo_unittest.SkipTest as exc:
                counts["skipped"] += 1
                print(f"SKIPPED {{path}}::{{name}}: {{exc}}")
            except ModuleNotFoundError as exc:
                counts["failed"] += 1
                if type(exc).__name__ == "HermeticImportError":
                    missing.append({{"file": path, "module": exc.name, "message": str(exc)}})
                print(f"FAILED {{path}}::{{name}}: {{type(exc).__name__}}: {{exc}}")
            except BaseException:
                counts["failed"] += 1
                print(f"FAILED {{path}}::{{name}}\\n{{_ivralo_tb.format_exc()}}")
            else:
                counts["passed"] += 1
    summary = ", ".join(f"{{n}} {{k}}" for k, n in counts.items() if n) or "no tests ran"
    print(f"{{summary}} in {{_ivralo_time.monotonic() - started:.2f}}s")
    return {{**counts, "missing_modules": missing}}


print({marker!r} + _ivralo_json.dumps(_ivralo_run({target})))
"""


def runner_cell(runner: str, target: str, args: tuple[str, ...] = ()) -> str:
    """The cell that runs the tests at ``target`` (relative to the workspace) on ``runner``'s surface."""
    if runner == names.SURFACE_PROJECT:
        return _PROJECT_CELL.format(target=json.dumps(target), args=json.dumps(list(args)), marker=MARKER)
    return _HERMETIC_CELL.format(target=json.dumps(target), marker=MARKER)


def hermetic_hint(modules: list[str]) -> str:
    shown = ", ".join(sorted(set(modules))) or "a module"
    return (
        f"the hermetic run stopped at an import of {shown}, which the hermetic surface does not have (the "
        "standard library and ivralo's helpers only). Run these tests on the project surface: "
        'run_tests(path, runner="project")'
    )


def run_report(runner: str, result: str | dict[str, str]) -> dict[str, Any]:
    """The run's result: ``{"runner", "status", "passed", "failed", "errors", "skipped", "output"}``,
    with ``"error"`` when the run did not complete or a module was missing."""
    report: dict[str, Any] = {"runner": runner, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    text = result if isinstance(result, str) else result.get("result", "")
    lines = text.splitlines()
    found = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith(MARKER)), None)
    if found is None:
        error = result.get("error", "") if isinstance(result, dict) else "the test run printed no report"
        missing = "HermeticImportError" in error or "on the hermetic surface" in error
        if missing:
            error = f"{error}. {hermetic_hint([])}"
        return {**report, "status": "error", "output": text, "error": error}
    counts = json.loads(lines[found][len(MARKER) :])
    output = "\n".join(lines[:found] + lines[found + 1 :]).rstrip("\n") + "\n"
    report.update({k: int(counts.get(k, 0)) for k in ("passed", "failed", "errors", "skipped")})
    report["output"] = output
    missing_modules = [m.get("module") or "?" for m in counts.get("missing_modules", [])]
    if missing_modules:
        report["status"] = "error"
        report["error"] = hermetic_hint(missing_modules)
    elif report["failed"] or report["errors"] or counts.get("exit_code", 0) not in (0, 5):
        report["status"] = "failed"
    elif not report["passed"]:
        report["status"] = "no tests"
    else:
        report["status"] = "passed"
    return report
