"""[protocol] What the namespace API's data plane says the same way on both sides (stdlib only:
pyarrow is handed in by the caller, who imported it)."""

from __future__ import annotations

from typing import Any


def release(view: memoryview) -> bool:
    """False while something still points into a shared segment through ``view`` (both sides map one)."""
    try:
        view.release()
    except BufferError:
        return False
    return True


ARROW_EXTRA = "pip install 'ivralo-kernel[arrow]'"


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
