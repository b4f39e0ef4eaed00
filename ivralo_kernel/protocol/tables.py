"""[protocol] What the namespace API's data plane says the same way on both sides (stdlib only:
pyarrow is handed in by the caller, who imported it)."""

from __future__ import annotations

from typing import Any

# numpy kinds whose columns Arrow takes as they are: booleans, integers, floats (only floats need
# the NaN check below). Anything else (objects, strings, dates, categoricals, extension dtypes)
# goes through pyarrow's own conversion.
_PLAIN_KINDS = frozenset("biuf")


def release(view: memoryview) -> bool:
    """False while something still points into a shared segment through ``view`` (both sides map one)."""
    try:
        view.release()
    except BufferError:
        return False
    return True


ARROW_EXTRA = "pip install 'ivralo-kernel[arrow]'"


def table_from_pandas(pa: Any, frame: Any) -> Any:
    """``pa.Table.from_pandas(frame, preserve_index=None)``, the same table (schema and pandas metadata
    included), without its NaN scan of a float column that has no NaN: that scan (NaN becomes null)
    took 15 ms of a 100 MB transfer per 50 MB column, its minimum takes 3. Only a frame of
    numpy booleans, integers and floats under a RangeIndex takes this path; any other goes to pyarrow."""
    columns = list(frame.columns)
    plain = (
        type(frame.index).__name__ == "RangeIndex"
        and all(isinstance(c, str) for c in columns)
        and len(set(columns)) == len(columns)
        and all(
            getattr(dtype, "kind", None) in _PLAIN_KINDS and type(dtype).__module__.split(".")[0] == "numpy"
            for dtype in frame.dtypes
        )
    )
    if not plain:
        return pa.Table.from_pandas(frame, preserve_index=None)
    schema = pa.Schema.from_pandas(frame, preserve_index=None)  # with the same pandas metadata
    if schema.names != columns:
        return pa.Table.from_pandas(frame, preserve_index=None)
    arrays = []
    for i, field in enumerate(schema):
        series = frame.iloc[:, i]
        values = series.to_numpy(copy=False)
        if values.dtype.kind == "f" and _has_nan(values):
            arrays.append(pa.array(series, type=field.type, from_pandas=True))  # NaN becomes null, as pyarrow's
        else:
            arrays.append(pa.array(values, type=field.type))  # zero copy where the column is contiguous
    return pa.Table.from_arrays(arrays, schema=schema)


def _has_nan(values: Any) -> bool:
    """Whether a float array holds a NaN: its minimum is NaN then (one pass, no mask as large as it)."""
    if len(values) == 0:
        return False
    low = values.min()
    return bool(low != low)


def unrepresentable(pa: Any, frame: Any, exc: BaseException) -> str:
    """Which column of a pandas ``frame`` Arrow cannot carry, with its dtype and Arrow's reason."""
    for column in frame.columns:
        try:
            pa.array(frame[column], from_pandas=True)
        except Exception as column_exc:  # noqa: BLE001 - any failure here is the answer
            return (
                f"column {column!r} (dtype {frame[column].dtype}) cannot be represented in Arrow: "
                f"{type(column_exc).__name__}: {column_exc}. Convert it first (e.g. .astype(str)); "
                "ivralo never falls back to pickle"
            )
    return f"the frame cannot be represented in Arrow (its index has dtype {frame.index.dtype}): {exc}"
