"""[host] A large query result as an Arrow table: built batch by batch as the rows come, each batch
sized against ``max_bytes`` and searched for every credential before it is kept.

The kernel gets exactly the values the JSON answer would have given it (``databases._json_value``):
a column whose values are all ints, all finite floats, all strings or all booleans (None anywhere)
travels as that Arrow type; a date, a ``Decimal``, bytes and the like are converted first, as for
JSON; a column that is still mixed (an int and a float, a NaN among floats: JSON makes it "nan")
travels as the JSON text of each value, named in ``json_columns``, and the kernel parses it.

Sizes: a batch counts the bytes of its Arrow values (8 per number, 1 per boolean or null, a
string's UTF-8 bytes and its 4-byte offset), so a string-heavy result is cut about where its JSON
would have been; a row where the cap falls is found from the per-row sizes, never by a Python loop
over values.

Redaction: every string of every batch (the JSON text of a mixed column too) is searched for every
form of every value the vault holds (``CredentialVault.forms``: as written, URL-encoded, JSON-escaped)
before it becomes Arrow; the values of a batch where one is found are replaced by
``CredentialVault.redact``, as the JSON answer's are. A credential that could be written as a number
(digits only) is looked for in the number columns too (``pyarrow.compute``, RE2 over their text):
such a result is refused rather than sent with the number.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from ivralo_kernel.host.broker.vault import CredentialVault

_NUMBER_TEXT = re.compile(r"[0-9.eE+-]+")  # a form that could be inside a number's text
_FLOATS = frozenset({float, type(None)})
_JSON_KINDS = frozenset({int, float, str, bool})  # what ``_json_value`` leaves as it is
_REDACTED = re.compile(r"<([A-Za-z_][A-Za-z0-9_]*)>")  # a name ``CredentialVault.redact`` wrote


class ArrowRows:
    """The rows kept so far, as Arrow arrays per batch and column; ``table()`` makes the result."""

    def __init__(
        self,
        pa: Any,
        width: int,
        max_bytes: int,
        vault: CredentialVault,
        json_value: Callable[[Any], Any],
        refused: Callable[[str], Exception],
    ) -> None:
        import pyarrow.compute as pc

        self._pa, self._pc = pa, pc
        self._width, self._max_bytes, self._vault = width, max_bytes, vault
        self._json_value, self._refused = json_value, refused
        self._batches: list[list[Any]] = []  # per batch, one array per column
        self._json_chunks: set[tuple[int, int]] = set()  # (batch, column) carried as JSON text
        self.size = 0  # bytes kept (as counted above)
        self.count = 0  # rows kept
        self._forms = [form for form in vault.forms() if "\0" not in form]
        # The forms a number's text could hold, as one RE2 pattern (pyarrow.compute's regex engine),
        # each character written as its code point: RE2 reads that as the literal character.
        numbers = [form for form in self._forms if _NUMBER_TEXT.fullmatch(form)]
        self._pattern = "|".join("".join(f"\\x{{{ord(c):x}}}" for c in form) for form in numbers) or None

    def add(self, rows: Sequence[Sequence[Any]]) -> bool:
        """Keep ``rows`` while the size stays within the cap: False once it is reached (the rows past
        it are dropped)."""
        if not rows:
            return True
        columns = list(zip(*rows, strict=False))  # rows of one result: one width (strict costs a third of add)
        built = [self._array(column) for column in columns]
        arrays = [self._numbers_checked(i, array) for i, (array, _) in enumerate(built)]
        sizes = [self._sizes(a) for a in arrays]
        total = sum(s if isinstance(s, int) else int(s.sum()) for s in sizes)
        fits = len(rows)
        if self.size + total > self._max_bytes:
            import numpy

            per_row = numpy.zeros(len(rows), dtype=numpy.int64)
            for s in sizes:
                per_row += s // len(rows) if isinstance(s, int) else s
            fits = int(numpy.searchsorted(numpy.cumsum(per_row), self._max_bytes - self.size, side="right"))
            arrays, total = [a.slice(0, fits) for a in arrays], int(per_row[:fits].sum())
        if fits:
            number = len(self._batches)
            self._json_chunks.update((number, i) for i, (_, is_json) in enumerate(built) if is_json)
            self._batches.append(arrays)
            self.count += fits
            self.size += total
        return fits == len(rows)

    # -- one column of one batch --------------------------------------------------------------
    def _array(self, values: Sequence[Any], converted: bool = False) -> tuple[Any, bool]:
        """The column's values as an Arrow array, and whether it is their JSON text. pyarrow infers
        the type first: int64, bool and string it infers only for values all of that kind (or None),
        so only a double (an int or a bool among floats) needs the values' own types looked at."""
        pa, pc = self._pa, self._pc
        try:
            array = pa.array(values)
        except (OverflowError, UnicodeEncodeError, TypeError, ValueError, pa.ArrowException):
            array = None  # an int past int64, a lone surrogate, kinds mixed
        if array is not None:
            kind = array.type
            if kind in (pa.int64(), pa.bool_(), pa.null()):
                return array, False
            if kind == pa.string():
                cleaned = self._clean(values, False)
                return (array if cleaned is values else pa.array(cleaned, pa.string())), False
            if kind == pa.float64() and set(map(type, values)) <= _FLOATS:
                if pc.all(pc.is_finite(array)).as_py() is not False:
                    return array, False
                return self._json_text(values), True  # NaN, inf: JSON carries them as text ("nan")
        if not converted and any(v is not None and type(v) not in _JSON_KINDS for v in values):
            # Dates, Decimals, bytes...: what JSON would carry (only this column's values are touched).
            return self._array([v if v is None else self._json_value(v) for v in values], converted=True)
        return self._json_text(values), True

    def _json_text(self, values: Sequence[Any]) -> Any:
        dump, value = json.dumps, self._json_value
        texts = self._clean([None if v is None else dump(value(v)) for v in values], True)
        return self._pa.array(texts, self._pa.string())

    def _clean(self, values: Sequence[str | None], is_json: bool) -> Sequence[str | None]:
        """``values`` with every credential's value replaced. Found first in all of them at once: one
        ``str.find`` per form over the values joined by NUL, which no form holds (an environment value
        cannot), so a form found there is inside one value; only then is each value redacted."""
        if not self._forms:
            return values
        joined = "\0".join(filter(None, values))
        if not any(form in joined for form in self._forms):
            return values
        return [v if not v else self._redact_value(v, is_json) for v in values]

    def _sizes(self, array: Any) -> Any:
        """Bytes per value: their sum for fixed widths (an int), else a numpy array per value (a
        string's UTF-8 bytes and its offset)."""
        pa, pc = self._pa, self._pc
        if pa.types.is_string(array.type):
            lengths = pc.fill_null(pc.binary_length(array), 0)
            return lengths.to_numpy(zero_copy_only=False).astype("int64") + 4
        width = 8 if array.type in (pa.int64(), pa.float64()) else 1
        return width * len(array)

    def _numbers_checked(self, index: int, array: Any) -> Any:
        """``array``, unless it is numbers and the text of one holds a credential's value (refused)."""
        pa, pc, pattern = self._pa, self._pc, self._pattern
        if pattern is None or len(array) == 0:
            return array
        if array.type in (pa.int64(), pa.float64()):
            found = pc.match_substring_regex(pc.cast(array, pa.string()), pattern)
            if pc.any(found).as_py():
                texts = [str(v) for v in pc.filter(array, found).to_pylist()]
                names = sorted({name for text in texts for name in _REDACTED.findall(self._vault.redact(text))})
                raise self._refused(
                    f"a number in column {index + 1} of the result holds the value of "
                    f"{', '.join(names) or 'a credential'}: the broker does not send it (select it as text to have "
                    "it redacted)"
                )
        return array

    def _redact_value(self, text: str, is_json: bool) -> str:
        redacted = self._vault.redact(text)
        if not is_json:
            return redacted
        try:  # a JSON text: still one after the replacement, unless the match was inside a number
            json.loads(redacted)
        except ValueError:
            return json.dumps(redacted)
        return redacted

    # -- the result ----------------------------------------------------------------------------
    def table(self) -> tuple[Any, list[int]]:
        """(the Arrow table, its columns carried as JSON text). Fields are named by position ("0",
        "1", ...): the column names go in the answer's JSON, redacted, and may repeat."""
        pa = self._pa
        columns: list[Any] = []
        json_columns: list[int] = []
        for index in range(self._width):
            chunks = [batch[index] for batch in self._batches]
            types = {c.type for c in chunks if c.type != pa.null()}
            as_json = [(number, index) in self._json_chunks for number in range(len(chunks))]
            if any(as_json) or len(types) > 1:
                # Batches that disagree (ints, then floats): the whole column goes as JSON text.
                chunks = [c if done else self._dumped(c) for c, done in zip(chunks, as_json, strict=True)]
                types = {pa.string()}
                json_columns.append(index)
            target = next(iter(types)) if types else pa.null()
            columns.append(pa.chunked_array([c.cast(target) for c in chunks], type=target))
        return pa.table(columns, names=[str(i) for i in range(self._width)]), json_columns

    def _dumped(self, chunk: Any) -> Any:
        """A chunk of plain values (already redacted) as the JSON text of each."""
        return self._pa.array([None if v is None else json.dumps(v) for v in chunk.to_pylist()], self._pa.string())
