"""[kernel] The kernel's half of the namespace API's data plane (the host's is ``host.dataplane``).

The host's namespace requests are silent executions whose ``user_expressions`` call the functions
below; each returns one JSON string. What leaves the kernel is only ever JSON, ``.npy`` bytes of an
array without Python objects, or an Arrow IPC stream: formats the host parses without running code
of the kernel's (no pickle). Anything else is refused with its type's name, or given as a bounded
repr when the host asks for one.

Bulk bytes travel through the exchange segment: a file the host creates (sized, its pages allocated)
in the kernel's exchange folder, on tmpfs. The kernel maps it and unlinks it at once; it keeps the
mapping, so later transfers of up to the same size reuse the same pages (they count in this
process's RSS, like the host's). A value read from it never points into it.

pyarrow and numpy are imported only when a table or an array is on the way, or when the host asks
for them ahead (``warm``, in an idle spare of a pool that has moved tables).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import mmap
import os
import sys
import time
from typing import Any

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.errors import HermeticImportError
from ivralo_kernel.protocol.iopub_topics import comm_topic
from ivralo_kernel.protocol.tables import ARROW_EXTRA, release, table_from_pandas, unrepresentable

REPR_LIMIT = 1000
_held: dict[str, mmap.mmap] = {}  # the exchange segment: its path when the host made it -> its mapping
_pending: list[tuple[str, Any]] = []  # what ``prepare`` measured, for the ``write`` that follows


class RefusedValue(TypeError):  # the host matches this name (names.REFUSED_VALUE_ERROR)
    """This value does not leave the kernel in a form the host could parse without running code."""


class ArrowMissing(ImportError):  # the host matches this name (names.ARROW_MISSING_ERROR)
    """pyarrow is not installed in the kernel's environment."""


assert RefusedValue.__name__ == names.REFUSED_VALUE_ERROR and ArrowMissing.__name__ == names.ARROW_MISSING_ERROR


def _arrow() -> Any:
    try:
        import pyarrow
    except HermeticImportError:
        raise ArrowMissing(
            "tables need pyarrow and pandas, which the hermetic surface does not offer (it sees only the "
            'standard library and ivralo\'s helpers): use the project surface, Session(surface="project")'
        ) from None
    except ImportError:
        raise ArrowMissing(f"pyarrow is not installed in the kernel's environment: {ARROW_EXTRA} there") from None
    return pyarrow


def _user_ns() -> dict[str, Any]:
    from IPython import get_ipython

    shell = get_ipython()
    assert shell is not None
    return shell.user_ns  # type: ignore[no-any-return]


def _public_names(ns: dict[str, Any]) -> list[str]:
    from IPython import get_ipython

    shell = get_ipython()
    hidden = shell.user_ns_hidden if shell is not None else {}
    return sorted(k for k in ns if not k.startswith("_") and k not in hidden)


# --- warm-up --------------------------------------------------------------------------------------


def warm() -> str:
    """Import what a table's transfer needs (pyarrow, pandas, their conversion code) now: the host asks
    for it while this kernel is an idle spare of a pool whose sessions have moved tables, so a fresh
    session's first table does not wait for imports (about 0.4 s, most of its time). Never in every
    kernel: the imports cost about 60 MiB of memory. What is missing is left out, not an error."""
    started = time.perf_counter()
    loaded: list[str] = []
    with contextlib.suppress(ImportError):  # HermeticImportError included: that surface has no tables
        import pyarrow
        import pyarrow.ipc

        loaded.append("pyarrow")
        sink = pyarrow.BufferOutputStream()
        table = pyarrow.table({"x": [1]})
        with pyarrow.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        pyarrow.ipc.open_stream(sink.getvalue()).read_all()
        pandas = importlib.import_module("pandas")  # by name: this package has no pandas stubs to check against
        loaded.append("pandas")
        from_pandas(pandas.DataFrame({"x": [1.0]})).to_pandas()  # pyarrow's pandas_compat and its caches
    return json.dumps({"loaded": loaded, "ms": round(1000 * (time.perf_counter() - started), 1)})


# --- snapshot -------------------------------------------------------------------------------------


def describe() -> str:
    """Each variable's type, shape or length and size in bytes: never a value (cheap: no deep sizes)."""
    ns = _user_ns()
    return json.dumps({name: _description(ns[name]) for name in _public_names(ns)})


def _description(value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(value).__name__}
    shape = getattr(value, "shape", None) if _is_data(value) else None
    if isinstance(shape, tuple) and all(isinstance(n, int) for n in shape):
        out["shape"] = list(shape)
    elif isinstance(value, (str, bytes, bytearray, list, tuple, dict, set, frozenset)):
        out["len"] = len(value)
    out["bytes"] = _size(value)
    return out


def _is_data(value: Any) -> bool:
    """numpy, pandas and pyarrow objects: their ``shape``/``nbytes`` are cheap attributes."""
    return type(value).__module__.split(".")[0] in ("numpy", "pandas", "pyarrow")


def _size(value: Any) -> int:
    with contextlib.suppress(Exception):
        if _is_data(value):
            usage = getattr(value, "memory_usage", None)
            if usage is not None:  # pandas: shallow, so object columns count their pointers only
                total = usage(deep=False)
                return int(total.sum() if hasattr(total, "sum") else total)
            nbytes = getattr(value, "nbytes", None)
            if isinstance(nbytes, int):
                return nbytes
        return sys.getsizeof(value)
    return 0


# --- values out -----------------------------------------------------------------------------------


def prepare(name: str, tables_only: bool = False, or_repr: bool = False) -> str:
    """Step one of ``get_var``/``get_dataframe``: a JSON value inline, or the size of the bytes that
    ``write`` will put into the exchange segment."""
    return json.dumps(_prepare(name, tables_only, or_repr))


def prepare_into(name: str, tables_only: bool, or_repr: bool, path: str, capacity: int) -> str:
    """``prepare``, then ``write`` at once when the bytes fit the exchange segment this kernel already
    maps (``path``, which the host holds at ``capacity``): one request instead of two (each costs
    about 4 ms). The answer is ``prepare``'s, with ``written`` (the length) when it wrote; otherwise
    the host reserves a segment for the size and asks ``write`` as before."""
    envelope = _prepare(name, tables_only, or_repr)
    held = _held.get(path)
    if envelope["kind"] in ("arrow", "npy") and held is not None and envelope["size"] <= min(capacity, len(held)):
        envelope["written"] = _write(path, capacity)
    return json.dumps(envelope)


def _prepare(name: str, tables_only: bool, or_repr: bool) -> dict[str, Any]:
    _pending.clear()
    ns = _user_ns()
    if name not in ns:
        raise NameError(f"name {name!r} is not defined")
    value = ns[name]
    kind = _table_kind(value)
    if kind is not None:
        table, extra = _as_table(value, kind)
        _pending.append(("arrow", table))
        return {"kind": "arrow", "size": _ipc_size(table), "as": kind, **extra}
    if tables_only:
        raise RefusedValue(
            f"{name} is a {_type_name(value)}, not a table: get_dataframe returns pandas DataFrames and "
            "Series and pyarrow tables; use get_var for other values"
        )
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic) and not value.dtype.hasobject:
        value = value.item()  # a numpy scalar: its Python number
    elif numpy is not None and isinstance(value, numpy.ndarray):
        if value.dtype.hasobject:
            raise RefusedValue(
                f"{name} is a numpy array of dtype {value.dtype}, which holds Python objects: only arrays of "
                "numbers, booleans, strings, bytes and dates leave the kernel (no pickle); convert it first"
            )
        array = value if value.flags.c_contiguous else numpy.ascontiguousarray(value)
        _pending.append(("npy", array))
        return {"kind": "npy", "size": len(_npy_header(array)) + array.nbytes}
    try:
        return {"kind": "json", "text": json.dumps(value)}
    except (TypeError, ValueError):
        pass
    if or_repr:
        return {"kind": "repr", "text": bounded_repr(value)}
    raise RefusedValue(
        f"{name} is a {_type_name(value)}: get_var returns JSON values, numpy arrays and Arrow-representable "
        f"tables only, never a pickle; get_var({name!r}, or_repr=True) returns its repr "
        f"(at most {REPR_LIMIT} characters)"
    )


def bounded_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= REPR_LIMIT else text[: REPR_LIMIT - 1] + "…"


def write(path: str, capacity: int) -> str:
    """Step two: the prepared bytes into the exchange segment (the host made it, ``capacity`` long)."""
    return json.dumps({"size": _write(path, capacity)})


def _write(path: str, capacity: int) -> int:
    if not _pending:
        raise RuntimeError("nothing prepared: the host's request came out of order")
    kind, value = _pending.pop()
    segment = _map(path, capacity)
    if kind == "arrow":
        view = memoryview(segment)
        try:
            size = _write_ipc(value, view)
        finally:
            release(view)
    else:
        header = _npy_header(value)
        size = len(header) + value.nbytes
        segment[: len(header)] = header
        segment[len(header) : size] = value.reshape(-1).view("u1").data
    return size


def send(comm_id: str, chunk_bytes: int) -> str:
    """Step two behind a Kernel Gateway (no shared memory): the prepared bytes as the buffers of
    ``comm_msg``s on IOPub, ``chunk_bytes`` each, parented by the host's request."""
    if not _pending:
        raise RuntimeError("nothing prepared: the host's request came out of order")
    kind, value = _pending.pop()
    if kind == "arrow":
        pa = _arrow()
        # Into a buffer of the stream's size: a growing BufferOutputStream copied and faulted its way
        # to 100 MB in 127 ms here, this takes a fifth of that.
        buffer = pa.allocate_buffer(_ipc_size(value))
        sink = pa.FixedSizeBufferWriter(buffer)
        sink.set_memcopy_threads(2)
        with pa.ipc.new_stream(sink, value.schema) as writer:
            writer.write_table(value)
        data = memoryview(buffer)[: sink.tell()]
    else:
        data = memoryview(_npy_header(value) + value.reshape(-1).view("u1").tobytes())
    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        raise RuntimeError("no kernel to send the bytes through")
    starts = range(0, max(len(data), 1), chunk_bytes)
    for start in starts:
        kernel.session.send(
            kernel.iopub_socket,
            "comm_msg",
            {"comm_id": comm_id, "data": {"offset": start}},
            parent=kernel.get_parent(),
            ident=comm_topic(comm_id),
            buffers=[data[start : start + chunk_bytes]],
        )
    return json.dumps({"size": len(data), "chunks": len(starts)})


_inbox: dict[str, list[Any]] = {}  # behind a gateway: a table's pieces as they arrive, by the host's ref


def take_chunk(ref: str, buffers: list[Any]) -> None:
    """(the ``ivralo_data_chunk`` handler) One piece of a table the host is sending, kept as it came
    (joined once, in ``receive_sent``: a bytearray grown piece by piece copied it again as it grew)."""
    if ref not in _inbox:
        _inbox.clear()  # one transfer at a time: what an abandoned one left goes
        _inbox[ref] = []
    for buffer in buffers:
        _inbox[ref].append(getattr(buffer, "buffer", buffer))  # a zmq Frame's memory, or bytes


def receive_sent(name: str, ref: str, length: int, kind: str) -> str:
    """Bind ``name`` to the table the host sent in ``ivralo_data_chunk`` messages."""
    pieces = _inbox.pop(ref, None)
    data = None if pieces is None else bytearray().join(pieces)
    del pieces
    if data is None or len(data) != length:
        got = "nothing" if data is None else f"{len(data)} bytes"
        raise RuntimeError(f"the host sent {length} bytes and {got} arrived")
    pa = _arrow()
    value = _from_ipc(pa, pa.py_buffer(data), kind)
    _user_ns()[name] = value
    return json.dumps({"rows": value.shape[0]})


def _type_name(value: Any) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _table_kind(value: Any) -> str | None:
    """What comes back on the host: "pandas.DataFrame", "pandas.Series", "pyarrow.Table",
    "pyarrow.ChunkedArray" (from an array or a chunked array), or None (not a table)."""
    pandas, pyarrow = sys.modules.get("pandas"), sys.modules.get("pyarrow")
    if pandas is not None and isinstance(value, pandas.DataFrame):
        return "pandas.DataFrame"
    if pandas is not None and isinstance(value, pandas.Series):
        return "pandas.Series"
    if pyarrow is not None and isinstance(value, (pyarrow.Table, pyarrow.RecordBatch)):
        return "pyarrow.Table"
    if pyarrow is not None and isinstance(value, (pyarrow.Array, pyarrow.ChunkedArray)):
        return "pyarrow.ChunkedArray"
    return None


def _as_table(value: Any, kind: str) -> tuple[Any, dict[str, Any]]:
    pa = _arrow()
    if kind == "pandas.DataFrame":
        return from_pandas(value), {}
    if kind == "pandas.Series":
        return from_pandas(value.to_frame()), {"unnamed": value.name is None}
    if kind == "pyarrow.Table":
        return (value if isinstance(value, pa.Table) else pa.Table.from_batches([value])), {}
    return pa.table({"values": value}), {}


def from_pandas(frame: Any) -> Any:
    """An Arrow table of ``frame``; where Arrow cannot carry a column, the error names it and its dtype."""
    pa = _arrow()
    try:
        return table_from_pandas(pa, frame)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
        raise RefusedValue(unrepresentable(pa, frame, exc)) from None


def _ipc_size(table: Any) -> int:
    pa = _arrow()
    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return int(sink.size())


def _write_ipc(table: Any, segment: memoryview) -> int:
    pa = _arrow()
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(segment))
    sink.set_memcopy_threads(2)  # large buffers copied by two threads (one core's copy is the limit)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    size = int(sink.tell())
    sink.close()
    return size


def _npy_header(array: Any) -> bytes:
    from numpy.lib import format as npy

    out = io.BytesIO()
    npy.write_array_header_2_0(out, npy.header_data_from_array_1_0(array))
    return out.getvalue()


# --- tables in ------------------------------------------------------------------------------------


def receive(name: str, path: str, capacity: int, length: int, kind: str) -> str:
    """Bind ``name`` to the table the host wrote into the exchange segment. The value never points
    into the segment, whose pages the next transfer reuses."""
    pa = _arrow()
    segment = _map(path, capacity)
    view = memoryview(segment)
    try:
        value = _from_ipc(pa, pa.py_buffer(view).slice(0, length), kind)
        if not release(view):  # e.g. pandas' Arrow-backed strings: read again, from a copy of their own
            value = None
            value = _from_ipc(pa, pa.py_buffer(segment[:length]), kind)
    finally:
        release(view)
    _user_ns()[name] = value
    return json.dumps({"rows": value.shape[0]})


def _from_ipc(pa: Any, data: Any, kind: str) -> Any:
    table = pa.ipc.open_stream(data).read_all()
    return table.to_pandas() if kind == "pandas.DataFrame" else table


def _map(path: str, capacity: int) -> mmap.mmap:
    """The exchange segment, mapped. The first time a path is seen, the file is opened, mapped and
    unlinked at once: from then on only the two processes hold it, and the next transfers that fit
    reuse its pages (fresh tmpfs pages cost more than the copy into them)."""
    held = _held.get(path)
    if held is not None:
        return held
    for old in _held.values():  # the host made a new, larger segment: the old one is freed
        with contextlib.suppress(BufferError):
            old.close()
    _held.clear()
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        segment = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):  # the host unlinks it too, if this did not
        os.unlink(path)
    _held[path] = segment
    return segment
