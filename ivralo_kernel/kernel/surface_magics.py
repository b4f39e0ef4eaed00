"""[kernel] ``%apropos WORD`` and ``%doc NAME``: what this kernel's surface offers, asked of the
surface itself rather than assumed: ivralo's helpers (``ivralo.*``), the brokered operations and
databases the host knows (and whether this kernel is granted each), the hosts code may reach, and
the modules this surface can import (the standard library on the hermetic surface; the
interpreter's packages too on the project surface)."""

from __future__ import annotations

import importlib.util
import inspect
import pkgutil
import sys
from collections.abc import Mapping
from typing import Any

import ivralo_kernel.kernel.broker_calls as broker_calls
from ivralo_kernel.kernel.launch_state import STATE
from ivralo_kernel.protocol import names

MAX_MODULES = 30


def _surface() -> str:
    return STATE.policy.surface if STATE.policy is not None else names.SURFACE_PROJECT


def _catalog() -> dict[str, Any] | str:
    """The host's catalog, or why there is none (no host attached: VS Code's raw launch)."""
    try:
        return broker_calls.ask(names.BROKER_CATALOG, {}, broker_calls.CATALOG_TIMEOUT_S)
    except broker_calls.BrokerError as exc:
        return str(exc)


def _modules() -> list[str]:
    found = set(sys.stdlib_module_names) | {"ivralo"}
    if _surface() != names.SURFACE_HERMETIC:
        found |= {m.name for m in pkgutil.iter_modules() if not m.name.startswith("_")}
    return sorted(m for m in found if not m.startswith("_"))


def _first_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else "no description"


def apropos(word: str, helpers: Mapping[str, Any]) -> str:
    """``%apropos WORD``: ``helpers`` (``api.__all__``'s), operations, databases, hosts and modules
    matching WORD."""
    word = word.strip().lower()
    lines = [f"What this kernel offers ({_surface()} surface) matching {word!r}:"]
    matched = [
        f"  ivralo.{n}: {_first_line(item.__doc__)}"
        for n, item in helpers.items()
        if word in n.lower() or word in (item.__doc__ or "").lower()
    ]
    lines += ["helpers:", *(matched or ["  (none)"])]
    catalog = _catalog()
    if isinstance(catalog, str):
        lines.append(f"operations, databases, hosts: unknown here ({catalog})")
    else:
        ops = [
            f"  {name}{info.get('signature', '')}: {info.get('description') or 'no description'}"
            f" ({'granted' if info.get('granted') else 'needs the ' + repr(info.get('grant')) + ' grant'})"
            for name, info in (catalog.get("operations") or {}).items()
            if word in name.lower() or word in str(info.get("description") or "").lower()
        ]
        dbs = [
            f"  {name} ({'granted' if info.get('granted') else 'needs the databases grant'})"
            for name, info in (catalog.get("databases") or {}).items()
            if word in name.lower()
        ]
        hosts = [f"  {host}" for host in catalog.get("hosts") or [] if word in str(host).lower()]
        lines += ["brokered operations (ivralo.call):", *(ops or ["  (none)"])]
        lines += ["databases (ivralo.sql):", *(dbs or ["  (none)"])]
        lines += ["hosts code may reach without asking:", *(hosts or ["  (none)"])]
    modules = [m for m in _modules() if word in m.lower()]
    shown = modules[:MAX_MODULES] + (
        [f"... and {len(modules) - MAX_MODULES} more"] if len(modules) > MAX_MODULES else []
    )
    lines += ["importable modules:", *(f"  {m}" for m in shown or ["(none)"])]
    return "\n".join(lines)


def doc(name: str, helpers: Mapping[str, Any]) -> str:
    """``%doc NAME``: what NAME is among ``helpers`` (``api.__all__``'s), the host's catalog and the
    importable modules."""
    name = name.strip()
    helper = name.removeprefix("ivralo.")
    if helper in helpers:
        item = helpers[helper]
        signature = str(inspect.signature(item)) if callable(item) and not inspect.isclass(item) else ""
        return f"ivralo.{helper}{signature}\n\n{inspect.getdoc(item) or 'no description'}"
    catalog = _catalog()
    if isinstance(catalog, dict):
        op = (catalog.get("operations") or {}).get(name)
        if op is not None:
            grant = "granted" if op.get("granted") else f"needs the {op.get('grant')!r} grant"
            return f"ivralo.call({name!r}, ...) {op.get('signature', '')}\n\n{op.get('description') or ''}\n({grant})"
        database = (catalog.get("databases") or {}).get(name)
        if database is not None:
            mode = "read-only" if database.get("read_only") else "read-write"
            return f"ivralo.sql({name!r}, query, params): a {mode} database from databases.json"
    top = name.split(".")[0]
    if top in _modules():
        spec = importlib.util.find_spec(top)
        where = spec.origin if spec is not None and spec.origin else "built in"
        return f"module {name} ({where}): import it and use help({name}) for its documentation"
    other = "project" if _surface() == names.SURFACE_HERMETIC else "hermetic"
    return (
        f"{name}: not offered by this kernel's {_surface()} surface (no such helper, operation, database "
        f"or importable module); %apropos WORD lists what is. The {other} surface offers different modules."
    )


def register(shell: Any, helpers: Mapping[str, Any]) -> None:
    """Registers ``%apropos`` and ``%doc`` on ``shell``, describing ``helpers``."""
    shell.register_magic_function(lambda line: print(apropos(line, helpers)), "line", "apropos")
    shell.register_magic_function(lambda line: print(doc(line, helpers)), "line", "doc")
