"""[protocol] Which environment variables are credentials, and the scrub that removes them.

One rule, applied in three places (the provisioner before exec, the supervisor before it starts
the kernel, the kernel after it loads ``.env``): a name that ends in ``_KEY``, ``_TOKEN`` or
``_SECRET``, contains ``PASSWORD``, ``SECRET`` or ``WEBHOOK``, is the product's database URL, or
is named by a ``databases.json``. Matching ignores case, because ``api_key`` is as secret as
``API_KEY``. Nothing here ever returns or formats a value: callers get names only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from ivralo_kernel.protocol import names

SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET")
SECRET_PARTS = ("PASSWORD", "SECRET", "WEBHOOK")


def is_secret_name(name: str, extra_names: Iterable[str] = ()) -> bool:
    """True when ``name`` must not reach the kernel's environment."""
    upper = name.upper()
    if upper == names.ENV_PRODUCT_SQL_URL or name in set(extra_names):
        return True
    return upper.endswith(SECRET_SUFFIXES) or any(part in upper for part in SECRET_PARTS)


def scrub(env: Mapping[str, str], extra_names: Iterable[str] = ()) -> tuple[dict[str, str], list[str]]:
    """Return (a copy of ``env`` without credentials, the sorted names removed)."""
    extra = frozenset(extra_names)
    kept: dict[str, str] = {}
    removed: list[str] = []
    for key, value in env.items():
        if is_secret_name(key, extra):
            removed.append(key)
        else:
            kept[key] = value
    return kept, sorted(removed)


def config_home(env: Mapping[str, str]) -> Path:
    """The user's ivralo configuration folder: ``$IVRALO_CONFIG_HOME`` or ``$XDG_CONFIG_HOME/ivralo``."""
    explicit = env.get(names.ENV_CONFIG_HOME)
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(xdg) / "ivralo"


def database_env_names(workspace: str | os.PathLike[str], env: Mapping[str, str]) -> tuple[set[str], list[str]]:
    """Names of the variables that ``databases.json`` (workspace, then config home) say hold a URL.

    Accepted shapes, per database: ``"name": "ENV_VAR"`` or ``"name": {"url_env": "ENV_VAR", ...}``,
    either at the top level or under a ``"databases"`` key. Returns (names, problems); a problem is
    a sentence naming the file, so a malformed file is reported instead of silently ignored.
    """
    found: set[str] = set()
    problems: list[str] = []
    for path in (Path(workspace) / names.DATABASES_FILE, config_home(env) / names.DATABASES_FILE):
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except OSError as exc:
            problems.append(f"{path}: cannot be read ({exc.strerror})")
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}: line {exc.lineno}: not valid JSON ({exc.msg})")
            continue
        if isinstance(data, dict) and isinstance(data.get("databases"), dict):
            data = data["databases"]
        if not isinstance(data, dict):
            problems.append(f"{path}: expected an object mapping database names to their URL variable")
            continue
        for db_name, entry in data.items():
            if isinstance(entry, str):
                found.add(entry)
            elif isinstance(entry, dict) and isinstance(var := entry.get("url_env", entry.get("env")), str):
                found.add(var)
            else:
                problems.append(f'{path}: database "{db_name}": give the variable holding its URL as "url_env"')
    return found, problems
