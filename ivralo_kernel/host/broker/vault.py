"""[host] The credentials the host holds for brokered calls, and the redaction that keeps them out
of everything the kernel, a log or a person sees.

Values come from the host's own environment and, under it, the workspace's ``.env`` (the kernel
loads that file too, then scrubs it: the host is where its credentials live). Nothing here formats
a value: callers get names, and ``redact`` replaces any value that leaks into a text (an endpoint
that echoes the key, a driver error quoting a URL) with ``<NAME>``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

from dotenv import dotenv_values

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.credentials import is_secret_name

MIN_REDACTED_LENGTH = 4  # shorter values would redact ordinary words


class CredentialVault:
    def __init__(
        self,
        workspace: str,
        env: Mapping[str, str] = os.environ,
        extra_names: Iterable[str] = (),
        use_dotenv: bool = True,
    ) -> None:
        values: dict[str, str] = {}
        dotenv = os.path.join(workspace, names.DOTENV_FILE)
        if use_dotenv and os.path.isfile(dotenv):
            values.update({k: v for k, v in dotenv_values(dotenv).items() if v is not None})
        values.update(env)  # what the host set wins over the file, as in the kernel
        extra = frozenset(extra_names)
        self._values = {k: v for k, v in values.items() if is_secret_name(k, extra)}
        self._parts: dict[str, str] = {}  # pieces of values that may appear alone (a URL's password)
        self._compiled: tuple[re.Pattern[str] | None, dict[str, str]] | None = None

    def also_redact(self, name: str, value: str) -> None:
        self._parts[name] = value
        self._compiled = None

    def get(self, name: str) -> str | None:
        return self._values.get(name)

    def names(self) -> list[str]:
        return sorted(self._values)

    def _pattern(self) -> tuple[re.Pattern[str] | None, dict[str, str]]:
        if self._compiled is None:
            forms: dict[str, str] = {}
            for name, value in [*self._values.items(), *self._parts.items()]:
                if len(value) >= MIN_REDACTED_LENGTH:
                    # As written, URL-encoded, and escaped inside JSON text.
                    for form in (value, quote(value, safe=""), quote_plus(value), json.dumps(value)[1:-1]):
                        forms.setdefault(form, name)
            # Longest first: a URL is replaced whole before the password inside it.
            alternatives = sorted(forms, key=len, reverse=True)
            pattern = re.compile("|".join(map(re.escape, alternatives))) if alternatives else None
            self._compiled = (pattern, forms)
        return self._compiled

    def forms(self) -> list[str]:
        """Every text ``redact`` replaces (each value as written, URL-encoded, JSON-escaped)."""
        return list(self._pattern()[1])

    def redact(self, text: str) -> str:
        pattern, forms = self._pattern()
        return text if pattern is None else pattern.sub(lambda m: f"<{forms[m.group(0)]}>", text)

    def redact_json(self, value: Any) -> Any:
        """The same, over a whole JSON-able answer in one pass (a 100k-row result stays fast)."""
        pattern, _ = self._pattern()
        return value if pattern is None else self.redacted_dump(value, json.dumps(value))

    def redacted_dump(self, value: Any, text: str) -> Any:
        """``value``, given ``text``, its JSON dump already made (the broker sizes each batch of rows
        by it): the value itself when no credential is in the text, else the redacted text parsed."""
        pattern, _ = self._pattern()
        return value if pattern is None or pattern.search(text) is None else json.loads(self.redact(text))
