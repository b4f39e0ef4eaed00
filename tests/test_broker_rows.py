"""The broker's row batches (host side, no process): one JSON pass sizes and redacts each batch, and
values JSON cannot carry as they are still take the per-value conversion."""

from __future__ import annotations

import decimal
import json

import pytest

from ivralo_kernel.host.broker.databases import DatabaseEntry, _add_sized
from ivralo_kernel.host.broker.vault import CredentialVault

SECRET = "s3cret-value-of-the-db"


@pytest.fixture
def vault(tmp_path) -> CredentialVault:  # type: ignore[no-untyped-def]
    return CredentialVault(str(tmp_path), {"SHOP_DB_URL": SECRET}, ["SHOP_DB_URL"], use_dotenv=False)


@pytest.mark.fast
def test_a_batch_is_redacted_and_odd_values_are_converted(vault: CredentialVault) -> None:
    entry = DatabaseEntry("shop", "SHOP_DB_URL")
    rows: list = []
    batch = [(1, "plain", 1.5, None, True), (2, f"x {SECRET} y", float("nan"), decimal.Decimal("2.5"), b"\x00\x01")]
    size, cut = _add_sized(rows, batch, 0, entry, vault)
    assert cut is None and size >= len(json.dumps(rows, separators=(",", ":")))  # counted before redaction
    assert [list(r) for r in rows] == [
        [1, "plain", 1.5, None, True],
        [2, "x <SHOP_DB_URL> y", "nan", 2.5, "AAE="],
    ]


@pytest.mark.fast
def test_plain_rows_pass_as_they_are_and_a_cut_row_is_redacted_too(vault: CredentialVault) -> None:
    entry = DatabaseEntry("shop", "SHOP_DB_URL", max_bytes=60)
    rows: list = []
    batch = [(1, SECRET), (2, "b" * 10), (3, "c" * 40)]
    _size, cut = _add_sized(rows, batch, 0, entry, vault)
    assert cut is not None and cut.startswith("cut at 2 rows")
    assert [list(r) for r in rows] == [[1, "<SHOP_DB_URL>"], [2, "b" * 10]]
