"""[protocol] Which environment variables are credentials, and the scrub that removes them.

One rule, applied in three places (the provisioner before exec, the supervisor before it starts
the kernel, the kernel after it loads ``.env``): a name that ends in ``_KEY``, ``_TOKEN`` or
``_SECRET``, contains ``PASSWORD``, ``SECRET`` or ``WEBHOOK``, is the product's database URL, or
is named by a ``databases.json``. Matching ignores case, because ``api_key`` is as secret as
``API_KEY``. Nothing here ever returns or formats a value: callers get names only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.config_files import read_json_file

SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET")
SECRET_PARTS = ("PASSWORD", "SECRET", "WEBHOOK")


@dataclass(frozen=True)
class DatabaseSpec:
    path: Path  # the databases.json it came from
    name: str
    spec: Any  # {"url_env": ..., options} as written (not yet checked)

    @property
    def url_env(self) -> str | None:
        var = self.spec.get("url_env", self.spec.get("env")) if isinstance(self.spec, dict) else None
        return var if isinstance(var, str) and var else None


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


def database_entries(workspace: str | os.PathLike[str], env: Mapping[str, str]) -> tuple[list[DatabaseSpec], list[str]]:
    """Every entry of ``databases.json``: the config home's first, then the workspace's (so that a
    later entry of the same name, the closer one, wins where names matter).

    Accepted shapes, per database: ``"name": "ENV_VAR"`` (given here as ``{"url_env": "ENV_VAR"}``) or
    ``"name": {"url_env": "ENV_VAR", ...}``, either at the top level or under a ``"databases"`` key.
    Returns (entries, problems); a problem is a sentence naming the file, so a malformed file is
    reported instead of silently ignored.
    """
    found: list[DatabaseSpec] = []
    problems: list[str] = []
    for path in (config_home(env) / names.DATABASES_FILE, Path(workspace) / names.DATABASES_FILE):
        _, data, problem = read_json_file(path)
        if problem is not None:
            problems.append(problem)
            continue
        if data is None:
            continue
        if isinstance(data, dict) and isinstance(data.get("databases"), dict):
            data = data["databases"]
        if not isinstance(data, dict):
            problems.append(f"{path}: expected an object mapping database names to their URL variable")
            continue
        for db_name, entry in data.items():
            found.append(DatabaseSpec(path, db_name, {"url_env": entry} if isinstance(entry, str) else entry))
    return found, problems


def database_env_names(workspace: str | os.PathLike[str], env: Mapping[str, str]) -> tuple[set[str], list[str]]:
    """Names of the variables that ``databases.json`` (config home and workspace) say hold a URL."""
    entries, problems = database_entries(workspace, env)
    found: set[str] = set()
    for entry in entries:
        var = entry.url_env
        if var is None:
            problems.append(f'{entry.path}: database "{entry.name}": give the variable holding its URL as "url_env"')
        else:
            found.add(var)
    return found, problems
