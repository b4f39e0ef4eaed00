"""[host] Answer what a kernel asks over the broker comm: egress questions, and calls that need a
credential (an API operation, a database query), which the host makes because it alone holds it.

Every request is untrusted (user code can read the kernel's HMAC key and forge messages): it must
come from a live execution (its parent is an execute_request the watchdog saw start and not end),
it is validated against its kind's schema (and an operation's parameter schema), each execution
gets a bounded number of requests, and no answer, error or log line carries a credential's value:
they name it. Calls run on a small thread pool, never on the watchdog's thread.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ivralo_kernel.host.broker.api_http import ApiHttp
from ivralo_kernel.host.broker.databases import Databases, QueryRefused, load_databases
from ivralo_kernel.host.broker.operations import OperationError, load_operations, perform
from ivralo_kernel.host.broker.result_segments import ResultSegments
from ivralo_kernel.host.broker.vault import CredentialVault
from ivralo_kernel.host.sandbox.egress import RELAYED_ANSWER, Asker, EgressDesk, valid_target
from ivralo_kernel.host.settings.workspace_files import DATABASES, DOTENV, WorkspaceFiles
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.messages import BrokerAnswer, CallRecord
from ivralo_kernel.protocol.terminal import terminal_safe

Reply = Callable[[BrokerAnswer], None]
Pause = Callable[[bool], None]
REQUESTS_PER_EXECUTION = 200
CALLS_PER_EXECUTION = 100  # brokered calls (API + SQL) one execution may make
CALL_THREADS = 4
GRANT_DATABASES = "databases"
MAX_SQL_CHARS = 100_000
MAX_SQL_PARAMS = 100
EXECUTIONS_COUNTED = 64  # the newest executions whose requests are counted (a kernel may run cells for weeks)

log = logging.getLogger(__name__)

__all__ = ["GRANT_DATABASES", "Asker", "BrokerResponder"]


class BrokerResponder:
    def __init__(
        self,
        workspace: str,
        trusted: bool,
        asker: Asker | None = None,
        grants: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        operations_files: tuple[str, ...] = (),
        files: WorkspaceFiles | None = None,
        exchange_dir: str | None = None,
    ) -> None:
        """``exchange_dir``: the kernel's exchange folder (the data plane's), where a large SQL result
        goes as Arrow (``result_segments``); without it, every result is JSON."""
        env = os.environ if env is None else env
        self.workspace = workspace
        self.egress = EgressDesk(workspace, trusted, asker, files)
        self.grants = frozenset(grants)
        # Read when the kernel starts: code cannot add an operation or a database to a running broker.
        # The workspace's files only as they were before any kernel of it could change them.
        self.operations, problems = load_operations(env, operations_files)
        databases, db_problems = load_databases(workspace, env, files is None or files.usable(DATABASES))
        self.problems = problems + db_problems
        for problem in self.problems:
            log.warning("ivralo broker: %s", problem)
        # A database's URL variable is a credential even when its name does not say so.
        names_ = [entry.url_env for entry in databases.values()]
        self.vault = CredentialVault(workspace, env, names_, use_dotenv=files is None or files.usable(DOTENV))
        self.databases = Databases(databases, self.vault, workspace)
        self._counts: dict[str, int] = {}
        self._calls: dict[str, int] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._http = ApiHttp()
        self._segments = _result_segments(exchange_dir)

    # The agent Session sets these after the kernel starts (the provisioner's are the default).
    @property
    def asker(self) -> Asker | None:
        return self.egress.asker

    @asker.setter
    def asker(self, asker: Asker | None) -> None:
        self.egress.asker = asker

    @property
    def trusted(self) -> bool:
        return self.egress.trusted

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()
        self.databases.close()
        if self._segments is not None:
            self._segments.close()

    def answer(self, request: Any, execution: str | None, reply: Reply, pause: Pause) -> None:
        """Reply now, or from another thread later (``reply`` must be thread-safe)."""
        if not isinstance(request, dict) or not isinstance(request.get("req_id"), str):
            return  # nothing to answer to
        kind, payload = request.get("kind"), request.get("payload")
        if execution is None:
            reply(_refusal("the request is not from a running execution (a forged or late message)"))
            return
        if _count(self._counts, execution) > REQUESTS_PER_EXECUTION:
            reply(_refusal(f"more than {REQUESTS_PER_EXECUTION} broker requests from one execution"))
            return
        if kind == names.BROKER_EGRESS:
            target = valid_target(payload)
            if target is None:
                reply({"allowed": False, "reason": "malformed egress request"})
                return
            self.egress.judge({"host": target[0], "port": target[1]}, execution, reply, pause)
        elif kind == names.BROKER_EGRESS_ANSWER:  # what older kernels sent; code in a kernel can send it
            reply({"allowed": False, "reason": RELAYED_ANSWER})
        elif kind == names.BROKER_CATALOG:
            reply({"ok": True, "result": self.catalog()})
        elif kind in (names.BROKER_API, names.BROKER_SQL):
            self._call(kind, payload, execution, reply)
        else:
            reply(_refusal(f"unknown request kind {str(kind)[:40]!r}"))

    def catalog(self) -> dict[str, Any]:
        """What the code may ask for (names only: no URL, no credential value)."""
        return {
            "operations": {
                name: {
                    "signature": op.signature(),
                    "description": op.description,
                    "grant": op.grant_name,
                    "granted": op.grant_name in self.grants,
                }
                for name, op in sorted(self.operations.items())
            },
            "databases": {
                name: {"read_only": entry.read_only, "granted": GRANT_DATABASES in self.grants}
                for name, entry in sorted(self.databases.entries.items())
            },
            "hosts": self.egress.allowed_hosts(),
        }

    # -- brokered calls --------------------------------------------------------------------
    def _call(self, kind: str, payload: Any, execution: str, reply: Reply) -> None:
        try:
            job, what, credential = self._check_api(payload) if kind == names.BROKER_API else self._check_sql(payload)
        except (OperationError, QueryRefused) as exc:
            reply(_refusal(str(exc)))
            return
        if _count(self._calls, execution) > CALLS_PER_EXECUTION:
            reply(_refusal(f"more than {CALLS_PER_EXECUTION} brokered calls from one execution; split the work"))
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="ivralo-broker")
        self._pool.submit(self._run, job, what, credential, reply)

    def _run(self, job: Callable[[], BrokerAnswer], what: str, credential: str, reply: Reply) -> None:
        started = time.monotonic()
        try:
            answer = job()
        except (OperationError, QueryRefused) as exc:  # the call was made and failed (a cap, a SQL error)
            answer = BrokerAnswer(ok=False, error=self.vault.redact(str(exc)))
        except Exception as exc:  # noqa: BLE001 - the code gets a sentence; the log gets the type
            text = self.vault.redact(f"{type(exc).__name__}: {exc}")
            log.warning("ivralo broker: a call failed: %s", terminal_safe(text))
            answer = BrokerAnswer(ok=False, error=f"the host's call failed: {text}")
        seconds = time.monotonic() - started
        if self.vault.get(credential):  # the credential was used, whatever the outcome: on the record
            shown = (terminal_safe(what), terminal_safe(credential), terminal_safe(_outcome(answer)))
            log.info("ivralo broker: %s with %s: %s in %.3fs", *shown, seconds)
            answer["record"] = CallRecord(what=what, credential=credential, seconds=seconds)
        reply(answer)

    def _check_api(self, payload: Any) -> tuple[Callable[[], BrokerAnswer], str, str]:
        if not isinstance(payload, dict) or not isinstance(payload.get("operation"), str):
            raise OperationError("malformed call: give the operation's name and its parameters")
        name = payload["operation"][:100]
        op = self.operations.get(name)
        if op is None:
            known = ", ".join(sorted(self.operations)) or "none"
            raise OperationError(f"unknown operation {name!r} (this host knows: {known})")
        if op.grant_name not in self.grants:
            raise OperationError(f'refused: this kernel has no "{op.grant_name}" grant (needed by {name})')
        params = op.check(payload.get("params", {}))

        def job() -> BrokerAnswer:
            credential = self.vault.get(op.credential)
            if not credential:
                raise OperationError(
                    f"{name}: the host has no value for {op.credential}; set it where the host starts "
                    "(the environment of JupyterLab or the agent, or the workspace's .env)"
                )
            api = perform(self._http, op, op.request(params, credential))
            result = {"status": api.status, "body": self.vault.redact_json(api.body), "type": api.content_type}
            return BrokerAnswer(ok=True, result=result)

        return job, name, op.credential

    def _check_sql(self, payload: Any) -> tuple[Callable[[], BrokerAnswer], str, str]:
        if not isinstance(payload, dict) or not isinstance(payload.get("database"), str):
            raise QueryRefused("malformed query: give the database's name and the SQL text")
        name, sql, params = payload["database"][:100], payload.get("query"), payload.get("params") or {}
        if GRANT_DATABASES not in self.grants:
            raise QueryRefused(f'refused: this kernel has no "{GRANT_DATABASES}" grant')
        entry = self.databases.entries.get(name)
        if entry is None:
            known = ", ".join(sorted(self.databases.entries)) or "none (add one to databases.json)"
            raise QueryRefused(f"unknown database {name!r} (this host knows: {known})")
        if not isinstance(sql, str) or not sql.strip() or len(sql) > MAX_SQL_CHARS:
            raise QueryRefused(f"the query must be SQL text of at most {MAX_SQL_CHARS} characters")
        if not isinstance(params, dict) or len(params) > MAX_SQL_PARAMS or not all(isinstance(k, str) for k in params):
            raise QueryRefused(f"params must be a dict of at most {MAX_SQL_PARAMS} named values")
        if not all(v is None or isinstance(v, bool | int | float | str) for v in params.values()):
            raise QueryRefused("params values must be None, bool, int, float or str")

        # The kernel says it can read Arrow (pyarrow imports there); where the host writes it is the host's.
        segments = self._segments if payload.get("arrow") is True else None

        def job() -> BrokerAnswer:
            pa = _pyarrow() if segments is not None else None  # here: its first import is not the watchdog's
            answer = self.databases.query(name, sql, params, pa)
            # The rows were redacted batch by batch as they were sized (one pass over each batch, not two).
            result = self.vault.redact_json({"columns": answer.columns, "cut": answer.cut, "rowcount": answer.rowcount})
            if answer.table is None or segments is None or pa is None:
                return BrokerAnswer(ok=True, result={**result, "rows": answer.rows})
            path, length = segments.write(pa, answer.table)
            arrow = {"path": path, "length": length, "rows": answer.table.num_rows, "json_columns": answer.json_columns}
            return BrokerAnswer(ok=True, result={**result, "rows": [], "arrow": arrow})

        return job, f"{name} database", entry.url_env


def _count(counts: dict[str, int], execution: str) -> int:
    """One more for ``execution``: its count now. Only the newest executions are kept (an older one
    is over: the watchdog answers none of its requests)."""
    counts[execution] = counts.pop(execution, 0) + 1  # to the end: the newest last
    while len(counts) > EXECUTIONS_COUNTED:
        del counts[next(iter(counts))]
    return counts[execution]


def _refusal(reason: str) -> BrokerAnswer:
    return {"ok": False, "refused": True, "allowed": False, "reason": reason, "error": reason}


def _outcome(answer: BrokerAnswer) -> str:
    if not answer.get("ok"):
        return "failed"
    result = answer.get("result") or {}
    if "status" in result:
        return f"HTTP {result['status']}"
    arrow = result.get("arrow")
    return f"{arrow['rows']} rows (Arrow)" if arrow else f"{len(result.get('rows') or [])} rows"


def _result_segments(folder: str | None) -> ResultSegments | None:
    """Where large SQL results go, or None (no exchange folder: every result is JSON)."""
    if not folder:
        return None
    try:
        return ResultSegments(folder)
    except OSError as exc:
        log.warning("ivralo broker: SQL results go as JSON only: the exchange folder %s: %s", folder, exc)
        return None


def _pyarrow() -> Any:
    """pyarrow, if the host has it (the ``arrow`` extra); without it, every result is JSON."""
    try:
        import pyarrow
    except ImportError:
        return None
    return pyarrow
