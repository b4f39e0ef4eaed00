"""[protocol] Which environment variables are credentials, and the scrub that removes them.

One rule, applied wherever an environment is handed on (the hosts before exec, the supervisor
before it starts the kernel, the kernel's own pass). A variable is removed when:

- its name ends in ``_KEY``, ``_TOKEN``, ``_SECRET`` or ``_AUTH``; contains ``PASSWORD``, ``SECRET``,
  ``WEBHOOK``, ``PASS`` or ``CREDENTIAL``; or has ``PAT`` as a word of its own (``GITHUB_PAT``, never
  ``PATH``). ``PWD`` and ``OLDPWD`` are never removed;
- its value is a URL that carries a password (``postgres://app:pw@db/x``), whatever its name;
- it reaches the person's session: agents and IPC (``SSH_AUTH_SOCK``, ``GPG_AGENT_INFO``,
  ``DBUS_SESSION_BUS_ADDRESS``, ``TMUX``, ``TMUX_PANE``, ``DOCKER_HOST``, ``VSCODE_IPC_HOOK*``,
  ``KRB5CCNAME``);
- it is the product's database URL, or is named by a ``databases.json``;
- the person's ``environment.json`` in the config home says so (``"remove"``: names or shell-style
  patterns). Its ``"keep"`` patterns are exceptions to the heuristics above, never to the last
  two rules. The hosts pass the rule on in ``IVRALO_SCRUB_RULE``, so that a scrub inside the
  sandbox, where the config home is hidden, keeps what the person said to keep.

Matching ignores case, because ``api_key`` is as secret as ``API_KEY``. Nothing here ever returns
or formats a value: callers get names only.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ivralo_kernel.protocol.names as names  # the module, not this package (which imports this one)
from ivralo_kernel.protocol.config_files import read_json_file

SECRET_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_AUTH")
SECRET_PARTS = ("PASSWORD", "SECRET", "WEBHOOK", "PASS", "CREDENTIAL")
SECRET_WORDS = frozenset({"PAT"})  # a whole word of the name: GITHUB_PAT, PAT_FOR_CI; never PATH
SESSION_VARIABLES = frozenset(
    {"SSH_AUTH_SOCK", "GPG_AGENT_INFO", "DBUS_SESSION_BUS_ADDRESS", "TMUX", "TMUX_PANE", "DOCKER_HOST", "KRB5CCNAME"}
)
SESSION_PREFIXES = ("VSCODE_IPC_HOOK",)
# The session variables that lead to a socket (an agent, a multiplexer, a bus, a daemon): called session
# sockets, not credentials. KRB5CCNAME names a ticket cache: a credential.
SESSION_SOCKETS = SESSION_VARIABLES - {"KRB5CCNAME"}
NEVER_SECRET = frozenset({"PWD", "OLDPWD"})
RULE_FILE = "environment.json"
# Credential stores: absent in the sandbox, refused by the read guard without it (the broker holds
# what code may use). Relative to the home folder unless absolute; the host's setting may add to them.
CREDENTIAL_STORES = (
    ".ssh",
    ".aws",
    ".azure",
    ".gnupg",
    ".kube",
    ".docker/config.json",
    ".config/gcloud",
    ".config/gh",
    ".netrc",
    ".pgpass",
    ".git-credentials",
    ".pypirc",
    ".vault-token",
    ".password-store",
    ".local/share/keyrings",
)
_WORDS = re.compile(r"[A-Z0-9]+")


@dataclass(frozen=True)
class ScrubRule:
    """The person's additions to the rule (``remove``) and exceptions from its heuristics (``keep``):
    names or shell-style patterns, compared in upper case."""

    remove: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()

    @classmethod
    def load(cls, env: Mapping[str, str]) -> ScrubRule:
        """The config home's ``environment.json``, else what a host passed on; problems are ignored
        here (``rule_problems`` names them, for the host's log and doctor)."""
        rule, _ = _read_rule(env)
        return rule

    def to_env(self) -> str:
        return json.dumps({"remove": list(self.remove), "keep": list(self.keep)})

    def removes(self, upper: str) -> bool:
        return any(fnmatch.fnmatchcase(upper, pattern) for pattern in self.remove)

    def keeps(self, upper: str) -> bool:
        return any(fnmatch.fnmatchcase(upper, pattern) for pattern in self.keep)


def _read_rule(env: Mapping[str, str]) -> tuple[ScrubRule, list[str]]:
    path = config_home(env) / RULE_FILE
    _, data, problem = read_json_file(path)
    where = str(path)
    if data is None and problem is None and env.get(names.ENV_SCRUB_RULE):
        where = names.ENV_SCRUB_RULE
        try:
            data = json.loads(env[names.ENV_SCRUB_RULE])
        except (json.JSONDecodeError, RecursionError):
            return ScrubRule(), [f"{where}: not valid JSON"]
    if data is None:
        return ScrubRule(), [problem] if problem else []
    lists: dict[str, tuple[str, ...]] = {}
    for field in ("remove", "keep"):
        value = data.get(field, []) if isinstance(data, dict) else None
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            return ScrubRule(), [f'{where}: "{field}" must be a list of variable names or patterns']
        lists[field] = tuple(item.upper() for item in value)
    return ScrubRule(lists["remove"], lists["keep"]), []


def rule_problems(env: Mapping[str, str]) -> list[str]:
    return _read_rule(env)[1]


def has_password_url(value: str) -> bool:
    """A URL with a password in it (``scheme://user:password@host``)."""
    if "://" not in value or "@" not in value:
        return False
    try:
        return urlsplit(value.strip()).password is not None
    except ValueError:
        return False


@dataclass(frozen=True)
class DatabaseSpec:
    path: Path  # the databases.json it came from
    name: str
    spec: Any  # {"url_env": ..., options} as written (not yet checked)

    @property
    def url_env(self) -> str | None:
        var = self.spec.get("url_env", self.spec.get("env")) if isinstance(self.spec, dict) else None
        return var if isinstance(var, str) and var else None


def is_secret_name(name: str, extra_names: Iterable[str] = (), rule: ScrubRule | None = None) -> bool:
    """True when ``name`` must not reach the kernel's environment (whatever its value)."""
    upper = name.upper()
    if upper == names.ENV_PRODUCT_SQL_URL or name in set(extra_names):
        return True
    if rule is not None and rule.removes(upper):
        return True
    if upper in NEVER_SECRET or (rule is not None and rule.keeps(upper)):
        return False
    if upper in SESSION_VARIABLES or upper.startswith(SESSION_PREFIXES):
        return True
    if upper.endswith(SECRET_SUFFIXES) or any(part in upper for part in SECRET_PARTS):
        return True
    return any(word in SECRET_WORDS for word in _WORDS.findall(upper))


def is_secret(name: str, value: str, extra_names: Iterable[str] = (), rule: ScrubRule | None = None) -> bool:
    """``is_secret_name``, or a value that is a URL with a password in it (unless the rule keeps the name)."""
    if is_secret_name(name, extra_names, rule):
        return True
    keep = rule is not None and rule.keeps(name.upper())
    return not keep and has_password_url(value)


def scrub(
    env: Mapping[str, str], extra_names: Iterable[str] = (), rule: ScrubRule | None = None
) -> tuple[dict[str, str], list[str]]:
    """Return (a copy of ``env`` without credentials, the sorted names removed). ``rule``: the
    person's; by default, the one ``env`` leads to (its config home, or what a host passed on)."""
    extra = frozenset(extra_names)
    rule = ScrubRule.load(env) if rule is None else rule
    kept: dict[str, str] = {}
    removed: list[str] = []
    for key, value in env.items():
        if is_secret(key, value, extra, rule):
            removed.append(key)
        else:
            kept[key] = value
    if rule.remove or rule.keep:
        kept[names.ENV_SCRUB_RULE] = rule.to_env()  # the next scrub, maybe where the file is hidden
    return kept, sorted(removed)


def is_session_socket(name: str) -> bool:
    """Whether ``name`` is one of the variables that lead to the person's session (an agent's or a
    terminal multiplexer's socket, a bus): kept out like credentials, but not a secret, and named so."""
    upper = name.upper()
    return upper in SESSION_SOCKETS or upper.startswith(SESSION_PREFIXES)


def kept_out_line(removed: Iterable[str]) -> str:
    """What the scrub kept out of a kernel, by name only: "kept out of the kernel: 1 credential variable
    (GITHUB_PAT) and 2 session sockets (TMUX, TMUX_PANE)"."""
    removed = list(removed)
    sockets = [name for name in removed if is_session_socket(name)]
    secrets = [name for name in removed if not is_session_socket(name)]
    parts = []
    if secrets:
        parts.append(f"{len(secrets)} credential variable{'s' if len(secrets) != 1 else ''} ({', '.join(secrets)})")
    if sockets:
        parts.append(f"{len(sockets)} session socket{'s' if len(sockets) != 1 else ''} ({', '.join(sockets)})")
    return "kept out of the kernel: " + (" and ".join(parts) or "nothing")


def config_home(env: Mapping[str, str]) -> Path:
    """The user's ivralo configuration folder: ``$IVRALO_CONFIG_HOME`` or ``$XDG_CONFIG_HOME/ivralo``."""
    explicit = env.get(names.ENV_CONFIG_HOME)
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(xdg) / "ivralo"


def database_entries(
    workspace: str | os.PathLike[str], env: Mapping[str, str], include_workspace: bool = True
) -> tuple[list[DatabaseSpec], list[str]]:
    """Every entry of ``databases.json``: the config home's first, then the workspace's (so that a
    later entry of the same name, the closer one, wins where names matter).

    Accepted shapes, per database: ``"name": "ENV_VAR"`` (given here as ``{"url_env": "ENV_VAR"}``) or
    ``"name": {"url_env": "ENV_VAR", ...}``, either at the top level or under a ``"databases"`` key.
    Returns (entries, problems); a problem is a sentence naming the file, so a malformed file is
    reported instead of silently ignored.
    """
    found: list[DatabaseSpec] = []
    problems: list[str] = []
    paths = [config_home(env) / names.DATABASES_FILE]
    paths += [Path(workspace) / names.DATABASES_FILE] if include_workspace else []
    for path in paths:
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


def credential_store_paths(env: Mapping[str, str], stores: Iterable[str] = CREDENTIAL_STORES) -> tuple[str, ...]:
    """Each store as an absolute path under the home folder ``env`` names (absolute ones as given)."""
    home = env.get("HOME") or os.path.expanduser("~")
    return tuple(os.path.normpath(os.path.join(home, store)) for store in stores)


def home_config_inside(workspace: str, env: Mapping[str, str]) -> tuple[str, ...]:
    """What must stay closed to writing when the workspace holds the person's own configuration
    (JupyterLab started in the home folder): the config home, Jupyter's folders, and, when the
    workspace contains the home folder, every dot-entry directly in it (shell profiles, ~/.config,
    ~/.gitconfig, ~/.ssh, ...), except IPython's folder, which the kernel writes its history to.
    Absolute paths, existing ones only."""
    workspace = os.path.realpath(workspace)

    def inside(path: str) -> bool:
        return path == workspace or path.startswith(workspace.rstrip(os.sep) + os.sep)

    home = os.path.realpath(env.get("HOME") or os.path.expanduser("~"))
    ipython = os.path.realpath(env.get("IPYTHONDIR") or os.path.join(home, ".ipython"))
    candidates = [str(config_home(env))]
    candidates += [env[name] for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR") if env.get(name)]
    if inside(home):
        try:
            candidates += [entry.path for entry in os.scandir(home) if entry.name.startswith(".")]
        except OSError:
            pass
    closed: list[str] = []
    for path in candidates:
        real = os.path.realpath(path)
        if os.path.lexists(path) and inside(real) and real != workspace and real != ipython and real not in closed:
            closed.append(real)
    return tuple(sorted(closed))
