"""[kernel] A large SQL result as the host sends it: an Arrow IPC stream in a segment of the kernel's
exchange folder (``host/broker/result_segments.py``), turned into the rows ``ivralo.sql`` returns.

The host sends the same values a JSON answer would carry (``host/broker/arrow_rows.py``); a column
named in ``json_columns`` holds the JSON text of each value. The segment is read into memory of the
kernel's own and unlinked at once: nothing returned points into it.

The kernel asks for Arrow only where pyarrow imports (not on the hermetic surface, not where it is
not installed); a small result comes as JSON anyway, so pyarrow is imported for a large one only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

_takes: list[bool] = []  # the answer of takes_arrow, once known
MAX_DISPLAY_WIDTH = 64  # wider results build their dicts with dict(zip(...))


def takes_arrow() -> bool:
    """Whether this kernel can read an Arrow answer (pyarrow is there for it to import)."""
    if not _takes:
        try:
            _takes.append(importlib.util.find_spec("pyarrow") is not None)
        except (ImportError, ValueError):  # the hermetic surface refuses it; a broken install
            _takes.append(False)
    return _takes[0]


def read_table(arrow: Mapping[str, Any]) -> Any:
    """The table the host wrote (its answer says where and how long), read once and unlinked."""
    import pyarrow

    path, length = str(arrow.get("path")), int(arrow.get("length") or 0)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # ours now: no other process needs its name (the host sweeps too)
            os.unlink(path)
        data = bytearray(length)
        view, done = memoryview(data), 0
        try:
            while done < length:
                got = os.readv(fd, [view[done:]])
                if got == 0:
                    raise OSError(f"the segment ends after {done} of {length} bytes")
                done += got
        finally:
            view.release()
    finally:
        os.close(fd)
    return pyarrow.ipc.open_stream(pyarrow.py_buffer(data)).read_all()


def _values(column: Any, is_json: bool) -> list[Any]:
    values: list[Any] = column.to_pylist()
    if is_json:
        loads = json.loads
        return [None if v is None else loads(v) for v in values]
    return values


def dicts(table: Any, columns: Sequence[str], json_columns: Sequence[int]) -> list[dict[str, Any]]:
    """One dict per row, as from a JSON answer (a repeated column name keeps its last value)."""
    values = [_values(table.column(i), i in json_columns) for i in range(table.num_columns)]
    rows: list[dict[str, Any]] = _row_maker(len(values))(*columns, values)
    return rows


_makers: dict[int, Any] = {}


def _row_maker(width: int) -> Any:
    """``(*names, columns) -> [dict per row]`` for ``width`` columns: a dict display per row, which
    builds each dict at twice the speed of ``dict(zip(names, row))`` (no call per row). Its source
    holds only the width; the names are its arguments."""
    if width > MAX_DISPLAY_WIDTH:
        return lambda *args: [dict(zip(args[:-1], row)) for row in zip(*args[-1])]  # noqa: B905 - one length
    maker = _makers.get(width)
    if maker is None:
        names = ", ".join(f"n{i}" for i in range(width))
        keys = ", ".join(f"n{i}: v{i}" for i in range(width))
        row = ", ".join(f"v{i}" for i in range(width)) + ("," if width == 1 else "")
        maker = eval(f"lambda {names}, values: [{{{keys}}} for {row} in zip(*values)]")  # noqa: S307 - our own text
        _makers[width] = maker
    return maker


def frame(table: Any, columns: Sequence[str], json_columns: Sequence[int]) -> Any:
    """A pandas DataFrame with the dtypes ``pandas.DataFrame(rows, columns=...)`` would infer."""
    import importlib

    pandas: Any = importlib.import_module("pandas")  # no stubs for mypy; the kernel has it where Arrow is
    result = table.to_pandas()
    result.columns = list(columns)
    for i in json_columns:
        result.isetitem(i, pandas.Series(_values(table.column(i), True), index=result.index))
    return result
