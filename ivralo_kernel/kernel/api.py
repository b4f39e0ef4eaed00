"""ivralo: calls that need a credential, made for you by the ivralo host.

This kernel's environment holds no credentials (no API keys, no database passwords). When code
needs one, it asks the ivralo host, the only holder of it; the host checks this session's grants,
makes the call, and answers. The credential never enters the kernel: results, errors and the
record line name it, never show it.

In every ivralo kernel this module is already imported as ``ivralo``:

    ivralo.operations()                     # what this host can call, and which are granted
    ivralo.call("photos.search", query="mountains", per_page=5)
    ivralo.databases()                      # databases named in databases.json
    ivralo.sql("demo", "select name, price from items where price < :cap", {"cap": 10})
    ivralo.sql("demo", "select * from items", dataframe=True)   # a pandas DataFrame

A call blocks the cell until the answer comes; an interrupt (Esc I I, Ctrl-C) ends the wait at once.
After the cell's output, one line records each call the host made for it, e.g.
``[ivralo answered this code's calls: photos.search with IVRALO_UNSPLASH_ACCESS_KEY (1 call, 0.4s)]``.

Errors: ``BrokerRefused`` (a PermissionError) when the host will not make the call (no grant, an
unknown operation, bad parameters); ``BrokerError`` when the call failed or no host is attached.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import ivralo_kernel.kernel.broker_rows as broker_rows
from ivralo_kernel.kernel.broker_calls import ANSWER_TIMEOUT_S as ANSWER_TIMEOUT_S  # still ivralo.ANSWER_TIMEOUT_S
from ivralo_kernel.kernel.broker_calls import CATALOG_TIMEOUT_S, BrokerError, BrokerRefused
from ivralo_kernel.kernel.broker_calls import ask as _ask
from ivralo_kernel.protocol import names

__all__ = [
    "ApiResponse",
    "BrokerError",
    "BrokerRefused",
    "apropos",
    "call",
    "databases",
    "doc",
    "hosts",
    "operations",
    "sql",
]


class ApiResponse:
    """An API operation's answer: ``status`` (HTTP), ``body`` (parsed JSON, or text), ``ok``."""

    def __init__(self, operation: str, result: dict[str, Any]) -> None:
        self.operation = operation
        self.status: int = int(result.get("status", 0))
        self.body: Any = result.get("body")
        self.content_type: str = str(result.get("type", ""))

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return self.body

    def __repr__(self) -> str:
        return f"<ApiResponse {self.operation}: HTTP {self.status}, {self.content_type or 'no content type'}>"


def call(operation: str, /, **params: Any) -> ApiResponse:
    """Call an API operation by name, e.g. ``call("photos.search", query="cats")``.

    The host attaches the credential and sends the request to the operation's fixed URL; see
    ``operations()`` for the names, their parameters, and which this session is granted.
    """
    __tracebackhide__ = True
    result = _ask(names.BROKER_API, {"operation": operation, "params": params})
    return ApiResponse(operation, result)


def sql(database: str, query: str, params: dict[str, Any] | None = None, *, dataframe: bool = False) -> Any:
    """Run ``query`` on a database named in ``databases.json``; rows come back as dicts.

    Use named parameters (``:name`` in the query, values in ``params``) rather than formatting
    values into the text. ``dataframe=True`` returns a pandas DataFrame. A read-only database
    (the default) refuses writes; rows beyond the database's ``max_rows`` are cut, with a warning.
    """
    __tracebackhide__ = True
    payload: dict[str, Any] = {"database": database, "query": query, "params": params or {}}
    if broker_rows.takes_arrow():
        payload["arrow"] = True  # a large result may come as Arrow, through the exchange folder
    result = _ask(names.BROKER_SQL, payload)
    columns, rows = list(result.get("columns") or []), list(result.get("rows") or [])
    if result.get("cut"):
        import warnings

        warnings.warn(f"ivralo: the result of the query on {database} was {result['cut']}", stacklevel=2)
    arrow = result.get("arrow")
    if isinstance(arrow, dict):
        try:
            table = broker_rows.read_table(arrow)
        except Exception as exc:  # noqa: BLE001 - the segment went (code removed it), or pyarrow failed
            raise BrokerError(f"the host's answer could not be read from the exchange folder: {exc}") from None
        json_columns = [int(i) for i in arrow.get("json_columns") or []]
        if dataframe:
            return broker_rows.frame(table, columns, json_columns)
        return broker_rows.dicts(table, columns, json_columns)
    if dataframe:
        import importlib

        pandas: Any = importlib.import_module("pandas")
        return pandas.DataFrame(rows, columns=columns)
    if not columns:
        return {"rowcount": result.get("rowcount")}
    return [dict(zip(columns, row, strict=True)) for row in rows]


def operations() -> dict[str, str]:
    """The API operations this host can call: name -> signature, description and grant."""
    catalog = _ask(names.BROKER_CATALOG, {}, CATALOG_TIMEOUT_S)
    found: dict[str, str] = {}
    for name, info in (catalog.get("operations") or {}).items():
        granted = "granted" if info.get("granted") else f'needs the "{info.get("grant")}" grant'
        found[name] = f"{info.get('signature')} — {info.get('description') or 'no description'} ({granted})"
    return found


def databases() -> dict[str, str]:
    """The databases this host can query: name -> read-only or not, and whether it is granted."""
    catalog = _ask(names.BROKER_CATALOG, {}, CATALOG_TIMEOUT_S)
    found: dict[str, str] = {}
    for name, info in (catalog.get("databases") or {}).items():
        mode = "read-only" if info.get("read_only") else "read-write"
        grant = "granted" if info.get("granted") else 'needs the "databases" grant'
        found[name] = f"{mode} ({grant})"
    return found


def apropos(word: str) -> str:
    """What this kernel's surface offers matching WORD: helpers, brokered operations and databases,
    hosts code may reach, importable modules (``%apropos WORD`` prints it)."""
    from ivralo_kernel.kernel.surface_magics import apropos as offered

    return offered(word, _helpers())


def doc(name: str) -> str:
    """What NAME is here: an ``ivralo`` helper, a brokered operation or database, or a module of this
    surface (``%doc NAME`` prints it)."""
    from ivralo_kernel.kernel.surface_magics import doc as described

    return described(name, _helpers())


def _helpers() -> dict[str, Any]:
    """The helpers by name (``__all__``), handed to ``%apropos``/``%doc`` as a value so that
    surface_magics need not import this module back."""
    return {name: globals()[name] for name in __all__}


def hosts() -> list[str]:
    """The hosts code here may reach without being asked (hosts.allow, and this kernel's "yes"es)."""
    catalog = _ask(names.BROKER_CATALOG, {}, CATALOG_TIMEOUT_S)
    return [str(host) for host in catalog.get("hosts") or []]


def record_line(records: Sequence[Mapping[str, Any]]) -> str:
    """``[ivralo answered this code's calls: photos.search with IVRALO_UNSPLASH_ACCESS_KEY (1 call, 0.4s)]``"""
    totals: dict[tuple[str, str], list[float]] = {}
    for record in records:
        key = (str(record.get("what")), str(record.get("credential")))
        totals.setdefault(key, []).append(float(record.get("seconds") or 0.0))
    parts = [
        f"{what} with {credential} ({len(times)} call{'s' if len(times) != 1 else ''}, {sum(times):.1f}s)"
        for (what, credential), times in totals.items()
    ]
    return "[ivralo answered this code's calls: " + ", ".join(parts) + "]"
