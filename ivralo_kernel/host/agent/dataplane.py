"""[host] The host's half of the namespace API's data plane (the kernel's is ``kernel.dataplane``).

* **The exchange folder**: one per kernel, made by the provisioner on tmpfs (``/dev/shm`` where it is
  one) and bound into the sandbox at the same path. It holds a file only while a segment waits for
  the kernel to map it.
* **The exchange segment** (``Exchange``): the host creates it with its pages allocated, sized for a
  transfer; the kernel maps it and unlinks it at once; the kernel keeps its mapping and the host its
  descriptor, so the next transfer that fits reuses the same pages (allocating fresh tmpfs pages
  costs more than copying into them). The host never maps it (``pread``/``pwrite``): a file the
  kernel truncates would raise SIGBUS in a process that touches its mapping. A larger transfer gets
  a new segment; a call that fails or times out drops the segment (a late kernel answer can only
  touch the old one). The host unlinks on every path too: after an
  error, a timeout or a killed worker, no file is left.
* **Decoding** parses only JSON, ``.npy`` without objects, and Arrow IPC: nothing that can run code
  the kernel chose. ``pickle`` is never used.
* **Nothing the kernel says is trusted**: the size it declares is checked against the host's cap
  (``transfer_cap_bytes``, by default the kernel's memory limit, and what the host can spare) before
  a byte is reserved (``checked_size``), the length it says it wrote against the segment, and an
  Arrow stream is validated in full (every offset, every UTF-8 string) before it is converted: one
  out-of-order string offset once killed the host with SIGSEGV in ``to_pandas()``.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ivralo_kernel.host.agent.read_buffers import ReadBuffers
from ivralo_kernel.host.sandbox.exchange_folder import SEGMENT_PREFIX
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.errors import IvraloError
from ivralo_kernel.protocol.policy import default_memory_limit
from ivralo_kernel.protocol.tables import ARROW_EXTRA, release, table_from_pandas, unrepresentable

_MIB = 1 << 20
_PARALLEL_BYTES = 16 * _MIB  # reads this large go in two halves at once: 31 -> 17-21 ms per 100 MB here


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class ArrowMissingError(IvraloError, ImportError):
    """pyarrow (the ``arrow`` extra) is not installed where it is needed."""


class UnsupportedValueError(IvraloError, TypeError):
    """The value cannot leave the kernel in a form the host parses without running the kernel's code."""


class TransferRefusedError(IvraloError, ValueError):
    """What the kernel declared or sent for a transfer is refused: more bytes than the host takes, no
    size at all, or data that is not valid. Nothing was reserved or converted; the worker is untouched."""


def transfer_cap(setting: int | None, memory_limit: int | None) -> int:
    """The most bytes one transfer from the kernel may take: the setting, else the kernel's memory
    limit (a value the kernel holds fits in it; a larger declaration is not the truth)."""
    if setting is not None:
        return setting
    return memory_limit if memory_limit is not None else default_memory_limit()


def checked_size(operation: str, answer: dict[str, Any], key: str, cap: int, why: str) -> int:
    """The size the kernel's ``answer`` gives under ``key``, once it is a size within ``cap`` (``why``
    says where the cap comes from). Checked before anything is reserved: the kernel's code answers."""
    size = answer.get(key) if isinstance(answer, dict) else None
    if type(size) is not int or size < 0:
        raise TransferRefusedError(
            f"{operation}: the kernel's answer gives no size ({key}={size!r}), so nothing was transferred. Code in "
            "the kernel may have replaced its data plane; restart the worker if this repeats"
        )
    if size > cap:
        raise TransferRefusedError(
            f"{operation}: the kernel declares {_human(size)} ({size} bytes), more than the host takes in one "
            f"transfer: {_human(cap)}, {why}. Nothing was reserved. Bring the value over in parts (df.iloc[a:b]), "
            "or raise WorkerConfig(transfer_cap_bytes=...) if the host has the memory"
        )
    return size


def _human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", _MIB), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def require_arrow(operation: str) -> Any:
    try:
        import pyarrow
    except ImportError:
        raise ArrowMissingError(f"{operation} needs pyarrow on the host: {ARROW_EXTRA}") from None
    return pyarrow


class Exchange:
    """One worker's exchange segment, on the host's side. Calls of a session never overlap, so one
    segment serves them all in turn.

    The host never maps it: it writes with ``pwrite`` and reads with ``pread`` into memory of its own.
    The kernel holds the file too and can truncate it at any moment; a mapping of a truncated file
    raises SIGBUS in whoever touches it (that would be the host's process), a read or write does not."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.path: str | None = None  # the segment's name, as the kernel knows it (maybe unlinked)
        self.capacity = 0
        self.fd: int | None = None
        self.buffers = ReadBuffers()  # the host's copies: the last one's memory serves the next read

    def reserve(self, size: int) -> tuple[str, int]:
        """A segment of at least ``size`` bytes, its pages allocated: (its path, its capacity)."""
        if self.fd is None or size > self.capacity:
            self.discard()
            # Grown by a quarter at least, so a series of slowly growing transfers reuses it.
            capacity = max(-(-max(size, 1) // _MIB) * _MIB, self.capacity + self.capacity // 4)
            path = os.path.join(self.folder, f"{SEGMENT_PREFIX}{secrets.token_hex(8)}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, capacity)  # its pages now, not one fault at a time later
            except BaseException:
                os.close(fd)
                _unlink(path)
                raise
            self.fd, self.path, self.capacity = fd, path, capacity
        assert self.path is not None
        return self.path, self.capacity

    def write_table(self, table: Any) -> int:
        """Write ``table``'s Arrow IPC stream at the segment's start: its length."""
        pa = require_arrow("inject_dataframe")
        assert self.fd is not None
        # One writer: a second thread's pwrite gained nothing here (a tmpfs file's writes are serialised
        # on its inode), unlike its reads (``read``).
        sink = _SegmentWriter(self.fd)
        with pa.ipc.new_stream(pa.PythonFile(sink, mode="w"), table.schema) as writer:
            writer.write_table(table)
        return sink.position

    def read(self, length: int) -> Any:
        """The segment's first ``length`` bytes, copied into the host's own memory (a bytes-like
        object: a numpy array of uint8 where numpy is installed, else a bytearray)."""
        assert self.fd is not None
        data = self.buffers.take(length)
        view = memoryview(data)
        try:
            half = length // 2 if length >= _PARALLEL_BYTES and _cpus() > 1 else 0
            if half:  # two threads (preadv lets go of the GIL): the copy and the fresh pages' faults, halved
                with ThreadPoolExecutor(1, thread_name_prefix="ivralo-read") as pool:
                    second = pool.submit(self._read_into, view, half, length)
                    self._read_into(view, 0, half)
                    second.result()
            else:
                self._read_into(view, 0, length)
        finally:
            view.release()
        return data

    def _read_into(self, view: memoryview, start: int, end: int) -> None:
        assert self.fd is not None
        done = start
        while done < end:
            got = os.preadv(self.fd, [view[done:end]], done)
            if got == 0:
                raise TransferRefusedError(
                    f"the segment holds {done} bytes, not the {view.nbytes} the kernel said it wrote (it was "
                    "truncated from the kernel's side), so nothing was read. Restart the worker if this repeats"
                )
            done += got

    def settle(self) -> None:
        """After the kernel's answer (or none): the file's name goes, whatever the kernel did."""
        if self.path is not None:
            _unlink(self.path)

    def discard(self) -> None:
        """Forget the segment: its pages are freed once the kernel lets go of it too."""
        self.settle()
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
        self.fd, self.path, self.capacity = None, None, 0

    def close(self) -> None:
        """The worker ends: the segment goes, and the memory kept for the next read."""
        self.discard()
        self.buffers.release()


class _SegmentWriter:
    """A file-like sink for Arrow's ``PythonFile`` that writes straight into the segment with
    ``pwrite``: no buffered file object between (its copy cost a third of an inject), and no mapping."""

    def __init__(self, fd: int) -> None:
        self.fd, self.position, self.closed = fd, 0, False

    def write(self, data: Any) -> int:
        view, done = memoryview(data).cast("B"), 0
        try:
            while done < len(view):
                done += os.pwrite(self.fd, view[done:], self.position + done)
        finally:
            view.release()
        self.position += done
        return done

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


# --- encoding (host -> kernel) --------------------------------------------------------------------


def as_table(frame: Any) -> tuple[Any, str]:
    """(an Arrow table of ``frame``, what the kernel binds: "pandas.DataFrame" or "pyarrow.Table")."""
    pa = require_arrow("inject_dataframe")
    if isinstance(frame, pa.Table):
        return frame, "pyarrow.Table"
    if isinstance(frame, pa.RecordBatch):
        return pa.Table.from_batches([frame]), "pyarrow.Table"
    if type(frame).__module__.split(".")[0] != "pandas" or not hasattr(frame, "columns"):
        raise UnsupportedValueError(
            f"inject_dataframe takes a pandas DataFrame or a pyarrow Table, not {type(frame).__qualname__}"
        )
    try:
        return table_from_pandas(pa, frame), "pandas.DataFrame"
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as exc:
        raise UnsupportedValueError(unrepresentable(pa, frame, exc)) from None


def ipc_size(table: Any) -> int:
    pa = require_arrow("inject_dataframe")
    sink = pa.MockOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return int(sink.size())


def ipc_bytes(table: Any) -> Any:
    """The Arrow IPC stream of ``table`` in memory (a pyarrow Buffer): behind a gateway, where the
    kernel shares no memory with the host (host/agent/gateway/worker.py)."""
    pa = require_arrow("inject_dataframe")
    buffer = pa.allocate_buffer(ipc_size(table))  # its size at once: a growing stream copies as it grows
    sink = pa.FixedSizeBufferWriter(buffer)
    sink.set_memcopy_threads(2)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return buffer.slice(0, sink.tell())


# --- decoding (kernel -> host) --------------------------------------------------------------------


def kernel_json(operation: str, text: Any) -> Any:
    """A JSON answer of the kernel's data plane (what it prepared, what it wrote), parsed; anything
    else (not text, not JSON, nested past the parser) is refused with a sentence, never another error."""
    try:
        if not isinstance(text, str | bytes | bytearray):
            raise TypeError(type(text).__name__)
        return json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        what = "nested too deeply" if isinstance(exc, RecursionError) else "not JSON"
        raise TransferRefusedError(
            f"{operation}: the kernel's answer is {what}, so nothing was transferred. Code in the kernel may have "
            "replaced its data plane; restart the worker if this repeats"
        ) from None


def decode_inline(envelope: dict[str, Any], operation: str = "get_var") -> Any:
    """A JSON value, or the bounded repr the caller asked for: both plain text."""
    if envelope.get("kind") == "json":
        return kernel_json(operation, envelope.get("text"))
    return str(envelope.get("text"))


def decode_segment(envelope: dict[str, Any], segment: Any, length: int) -> Any:
    """The value the kernel wrote, from the host's own copy of the segment (``Exchange.read``) or
    from the bytes that came over a gateway's websocket."""
    view = memoryview(segment)
    try:
        if envelope["kind"] == "npy":
            return _read_npy(view, length)
        pa = require_arrow("get_dataframe")
        value = _from_ipc(pa, envelope, pa.py_buffer(view).slice(0, length), segment)
        if not release(view):  # it points into the segment (Arrow-backed strings, a pyarrow table)
            value = None
            value = _from_ipc(pa, envelope, pa.py_buffer(bytes(view[:length])))  # a copy of its own
        return value
    finally:
        release(view)


def _from_ipc(pa: Any, envelope: dict[str, Any], data: Any, own: Any = None) -> Any:
    """The value of the Arrow stream in ``data`` (a pyarrow Buffer); ``own``: the writable bytes it
    lies in, the host's own copy, which a plain frame's columns may point into (``_plain_frame``)."""
    try:
        table = pa.ipc.open_stream(data).read_all()
        # In full: offsets in order and within their buffers, UTF-8 valid, dictionary indices in range.
        # The cheap validate() checks only buffer sizes, and to_pandas() trusts the rest (a SIGSEGV).
        table.validate(full=True)
    # Every error of pyarrow's (an IPC stream cut short: OSError), and a name in the schema that is
    # no UTF-8 (UnicodeDecodeError, found by tests/test_readers_properties.py's mutations).
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise TransferRefusedError(
            f"the Arrow data the kernel wrote is not valid ({str(exc)[:300]}), so it was not converted. Code in the "
            "kernel may have written it; restart the worker if this repeats"
        ) from None
    kind = envelope.get("as")
    try:
        if kind == "pandas.DataFrame":
            plain = _plain_frame(table, own) if own is not None else None
            return plain if plain is not None else table.to_pandas()
        if kind == "pandas.Series":
            series = table.to_pandas().iloc[:, 0]
            return series.rename(None) if envelope.get("unnamed") else series
        if kind == "pyarrow.ChunkedArray":
            return table.column(0)
    except (pa.ArrowException, ValueError, TypeError, OverflowError, IndexError) as exc:
        # Valid Arrow that pandas cannot hold (a date out of its range), or no column for a Series.
        raise TransferRefusedError(
            f"the Arrow data the kernel wrote cannot become a {kind} ({type(exc).__name__}: {str(exc)[:300]}). "
            "Bring it over as a pyarrow Table (get_dataframe(..., as_arrow=True)) or convert it in the kernel first"
        ) from None
    return table


_NUMERIC = frozenset(f"{k}{b}" for k in ("int", "uint") for b in (8, 16, 32, 64)) | {"float16", "float32", "float64"}


def _arrow_number(kind: Any) -> bool:
    """An Arrow integer or floating-point type (numpy's own layout: no bits, no offsets)."""
    import pyarrow.types as is_type

    return bool(is_type.is_integer(kind) or is_type.is_floating(kind))


def _plain_frame(table: Any, data: Any) -> Any:
    """The DataFrame of a table of numbers without nulls under a RangeIndex (what a pandas frame of
    numpy integers and floats becomes), its columns numpy views of ``data``: the host's own copy of
    the bytes, which the frame then owns. ``to_pandas()`` would copy all of them again (13 ms of a
    100 MB ``get_dataframe``). None for any other table: ``to_pandas()`` converts it.

    The views are writable (``data`` is), unlike those ``to_pandas(split_blocks=True)`` would give."""
    meta = table.schema.pandas_metadata or {}
    index = meta.get("index_columns") or []
    columns = meta.get("columns") or []
    column_index_names = [c.get("name") if isinstance(c, dict) else c for c in meta.get("column_indexes") or [None]]
    if meta.get("attributes") or column_index_names != [None] or len(index) > 1:
        return None
    if table.num_columns == 0 or len(columns) != table.num_columns:  # no columns: pyarrow's own empty index
        return None
    if index and (not isinstance(index[0], dict) or index[0].get("kind") != "range"):
        return None  # an index stored as a column (not a RangeIndex): pyarrow rebuilds it
    import numpy

    pandas = importlib.import_module("pandas")  # by name: this package has no pandas stubs to check against
    names = table.column_names
    for field, column, info in zip(table.schema, table.columns, columns, strict=True):
        kind = numpy.dtype(field.type.to_pandas_dtype()).name if _arrow_number(field.type) else None
        if (
            kind not in _NUMERIC
            or not isinstance(info, dict)
            or info.get("name") != field.name
            or info.get("pandas_type") != kind
            or info.get("numpy_type") != kind
            or info.get("metadata") is not None
            or column.num_chunks > 1
            or column.null_count
        ):
            return None
    if len(set(names)) != len(names):
        return None
    rows = table.num_rows
    if index:
        start, stop, step = (index[0].get(k) for k in ("start", "stop", "step"))
        if not all(type(v) is int for v in (start, stop, step)) or step == 0 or len(range(start, stop, step)) != rows:
            return None
        labels = pandas.RangeIndex(start, stop, step, name=index[0].get("name"))
    else:
        labels = pandas.RangeIndex(rows)
    base = numpy.frombuffer(data, dtype=numpy.uint8)
    origin = base.ctypes.data
    arrays = {}
    for name, column in zip(names, table.columns, strict=True):
        dtype = numpy.dtype(column.type.to_pandas_dtype())
        if column.num_chunks == 0 or rows == 0:
            arrays[name] = numpy.empty(0, dtype=dtype)
            continue
        chunk = column.chunk(0)
        buffer = chunk.buffers()[1]
        offset = buffer.address - origin + chunk.offset * dtype.itemsize
        if offset < 0 or offset + rows * dtype.itemsize > base.nbytes:
            return None  # not in ``data`` (it cannot be: the stream was read from it)
        arrays[name] = numpy.frombuffer(data, dtype=dtype, count=rows, offset=offset)
    return pandas.DataFrame(arrays, index=labels, copy=False)


def _read_npy(view: memoryview, length: int) -> Any:
    try:
        import numpy
        from numpy.lib import format as npy
    except ImportError:
        raise ArrowMissingError(f"get_var of a numpy array needs numpy on the host: {ARROW_EXTRA}") from None
    head = io.BytesIO(view[: min(length, 65_536 + 12)])
    try:
        version = npy.read_magic(head)
        reader = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, fortran, dtype = reader(head)  # a literal, parsed without eval; allow_pickle is never on
    except Exception as exc:  # noqa: BLE001 - numpy's parser of the header raises many kinds (SyntaxError, TokenError)
        raise TransferRefusedError(
            f"the kernel's .npy data has no valid header ({type(exc).__name__}: {str(exc)[:200]}), so it was not "
            "read. Code in the kernel may have written it; restart the worker if this repeats"
        ) from None
    if dtype.hasobject:
        raise UnsupportedValueError(f"the kernel sent a numpy array of dtype {dtype}, which holds Python objects")
    count = math.prod(shape)
    if count < 0 or dtype.itemsize == 0 or head.tell() + count * dtype.itemsize > length:
        raise TransferRefusedError(
            f"the kernel's .npy header says {shape} of {dtype} ({count * dtype.itemsize} bytes) and it wrote "
            f"{length} bytes, so it was not read. Code in the kernel may have written it"
        )
    flat = numpy.frombuffer(view, dtype=dtype, count=count, offset=head.tell())
    array = flat.reshape(shape, order="F" if fortran else "C").copy(order="K")
    del flat
    return array


def refusal(operation: str, error: dict[str, Any]) -> Exception:
    """The exception a kernel-side refusal or failure becomes on the host."""
    ename, evalue = str(error.get("ename")), str(error.get("evalue"))
    if ename == names.REFUSED_VALUE_ERROR:
        return UnsupportedValueError(f"{operation}: {evalue}")
    if ename == names.ARROW_MISSING_ERROR:
        return ArrowMissingError(f"{operation}: {evalue}")
    return ValueError(f"{operation}: {ename}: {evalue}")
