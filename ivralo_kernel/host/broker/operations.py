"""[host] The registry of API operations the broker can call, and how one call is made.

An operation fixes everything that decides where a credential goes: the URL template, the method,
which credential and how it is attached (a header, a bearer token, a query parameter). The code in
the kernel only picks an operation by name and gives parameters, which are checked against the
operation's schema: it can never choose the URL a credential is sent to.

Operations come from the built-in list and from ``apis.json`` in the user's config home (outside
any workspace: a repository must not be able to define where a key is sent), and from the host's
own configuration (``IvraloProvisioner.operations_file``, ``Session``'s ``operations``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

from ivralo_kernel.host.broker.api_http import ApiHttp, ApiRequest, ResponseTooLarge
from ivralo_kernel.protocol.config_files import read_json_file
from ivralo_kernel.protocol.credentials import config_home

APIS_FILE = "apis.json"
PARAM_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}
AUTH_KINDS = ("header", "bearer", "query")
DEFAULT_MAX_RESPONSE_BYTES = 1 << 20
DEFAULT_TIMEOUT_S = 30.0
MAX_STRING_PARAM = 2_000  # when the schema gives no max_length
_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")

BUILTIN: dict[str, dict[str, Any]] = {
    "photos.search": {
        "description": "Search Unsplash photos",
        "url": "https://api.unsplash.com/search/photos",
        "method": "GET",
        "credential": "IVRALO_UNSPLASH_ACCESS_KEY",
        "auth": {"kind": "header", "name": "Authorization", "format": "Client-ID {credential}"},
        "params": {
            "query": {"type": "string", "required": True, "max_length": 200},
            "page": {"type": "integer", "minimum": 1, "maximum": 1000},
            "per_page": {"type": "integer", "minimum": 1, "maximum": 30},
            "orientation": {"type": "string", "choices": ["landscape", "portrait", "squarish"]},
        },
    },
}


class OperationError(Exception):
    """A request the host will not make; the message is safe to show to the code."""


@dataclass(frozen=True)
class Param:
    type: str
    required: bool = False
    max_length: int = MAX_STRING_PARAM
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] = ()

    def check(self, op: str, name: str, value: Any) -> None:
        kinds = PARAM_TYPES[self.type]
        if (isinstance(value, bool) and self.type != "boolean") or not isinstance(value, kinds):
            raise OperationError(f'{op}: parameter "{name}" must be {self.type}, not {type(value).__name__}')
        if isinstance(value, str) and len(value) > self.max_length:
            raise OperationError(f'{op}: parameter "{name}" is longer than {self.max_length} characters')
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        low, high = self.minimum, self.maximum
        if number is not None and ((low is not None and number < low) or (high is not None and number > high)):
            raise OperationError(f'{op}: parameter "{name}" must be between {self.minimum} and {self.maximum}')
        if self.choices and value not in self.choices:
            raise OperationError(f'{op}: parameter "{name}" must be one of {", ".join(map(str, self.choices))}')


@dataclass(frozen=True)
class Operation:
    name: str
    url: str
    credential: str
    auth_kind: str = "bearer"
    auth_name: str = "Authorization"
    auth_format: str = "{credential}"
    method: str = "GET"
    params: Mapping[str, Param] = field(default_factory=dict)
    body: str = "query"  # where the parameters that are not in the URL go: query string, or "json"
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    timeout_s: float = DEFAULT_TIMEOUT_S
    grant: str = ""
    description: str = ""

    @property
    def grant_name(self) -> str:
        return self.grant or self.name.split(".", 1)[0]

    def check(self, params: Any) -> dict[str, Any]:
        if not isinstance(params, dict):
            raise OperationError(f"{self.name}: parameters must be given as name=value")
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            known = ", ".join(self.params) or "none"
            raise OperationError(f"{self.name}: unknown parameter {unknown[0]!r:.60} (it takes: {known})")
        for name, param in self.params.items():
            if name in params:
                param.check(self.name, name, params[name])
            elif param.required:
                raise OperationError(f'{self.name}: parameter "{name}" is required')
        return dict(params)

    def signature(self) -> str:
        parts = [f"{n}: {p.type}" + ("" if p.required else " = None") for n, p in self.params.items()]
        return f"{self.name}({', '.join(parts)})"

    def request(self, params: dict[str, Any], credential: str) -> ApiRequest:
        """The request, with the credential attached where the operation says (never elsewhere).
        The parameters not in the URL's path go after the URL's own query, or as its JSON body."""
        in_url = set(_PLACEHOLDER.findall(self.url))
        url = _PLACEHOLDER.sub(lambda m: quote(str(params[m.group(1)]), safe=""), self.url)
        rest = {k: v for k, v in params.items() if k not in in_url}
        headers = {"User-Agent": "ivralo-kernel broker", "Accept": "*/*"}
        secret = self.auth_format.replace("{credential}", credential)
        if self.auth_kind == "bearer":
            headers["Authorization"] = f"Bearer {credential}"
        elif self.auth_kind == "header":
            headers[self.auth_name] = secret
        body = None
        query = [] if self.body == "json" else [(k, _query_value(v)) for k, v in rest.items()]
        if self.body == "json":
            body = json.dumps(rest, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        if self.auth_kind == "query":
            query.append((self.auth_name, secret))
        return ApiRequest(self.method, _with_query(url, query), headers, body)


def _with_query(url: str, query: list[tuple[str, str]]) -> str:
    """``url`` with its path percent-encoded (a template may hold any character) and ``query`` after
    its own query string."""
    parts = urlsplit(url)
    path = quote(parts.path, safe="/%:@!$&'()*+,;=-._~")
    own = quote(parts.query, safe="/%:@!$&'()*+,;=-._~?")
    extra = urlencode(query)
    joined = "&".join(q for q in (own, extra) if q)
    return urlunsplit((parts.scheme, parts.netloc, path, joined, ""))


def _query_value(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def parse_operation(name: str, spec: Any, where: str) -> Operation:
    """One registry entry, or ``ValueError`` naming the file, the operation and the field."""
    if not _NAME.match(name):
        raise ValueError(f'{where}: operation "{name}": name must look like "group.action" (lowercase)')
    if not isinstance(spec, dict):
        raise ValueError(f'{where}: operation "{name}" must be an object')

    def field_(key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        value = spec.get(key, default)
        if value is None and default is None:
            raise ValueError(f'{where}: operation "{name}": field "{key}" is required')
        if not isinstance(value, kind):
            raise ValueError(f'{where}: operation "{name}": field "{key}" has the wrong type')
        return value

    url = field_("url", str)
    if not url.startswith(("https://", "http://")) or "{credential}" in url:
        raise ValueError(f'{where}: operation "{name}": field "url" must be an http(s) URL without the credential')
    auth = field_("auth", dict, {"kind": "bearer"})
    kind = auth.get("kind", "bearer")
    if kind not in AUTH_KINDS:
        raise ValueError(f'{where}: operation "{name}": field "auth.kind" must be one of {", ".join(AUTH_KINDS)}')
    params: dict[str, Param] = {}
    for pname, pspec in field_("params", dict, {}).items():
        if not isinstance(pspec, dict) or pspec.get("type", "string") not in PARAM_TYPES:
            raise ValueError(
                f'{where}: operation "{name}": parameter "{pname}": "type" must be one of {", ".join(PARAM_TYPES)}'
            )
        where_param = f'{where}: operation "{name}": parameter "{pname}"'
        bounds = {key: pspec.get(key) for key in ("minimum", "maximum")}
        for key, bound in bounds.items():
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int | float)):
                raise ValueError(f'{where_param}: "{key}" must be a number')
        max_length = pspec.get("max_length", MAX_STRING_PARAM)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 0:
            raise ValueError(f'{where_param}: "max_length" must be a whole number of characters')
        choices = pspec.get("choices", [])
        if not isinstance(choices, list):
            raise ValueError(f'{where_param}: "choices" must be a list')
        params[pname] = Param(
            type=pspec.get("type", "string"),
            required=bool(pspec.get("required", False)),
            max_length=max_length,
            minimum=bounds["minimum"],
            maximum=bounds["maximum"],
            choices=tuple(choices),
        )
    missing = set(_PLACEHOLDER.findall(url)) - {n for n, p in params.items() if p.required}
    if missing:
        raise ValueError(
            f'{where}: operation "{name}": URL placeholder {{{sorted(missing)[0]}}} must be a required parameter'
        )
    method = str(field_("method", str, "GET")).upper()
    if method not in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        raise ValueError(f'{where}: operation "{name}": field "method" is not an HTTP method')
    return Operation(
        name=name,
        url=url,
        credential=field_("credential", str),
        auth_kind=kind,
        auth_name=str(auth.get("name", "Authorization" if kind != "query" else "api_key")),
        auth_format=str(auth.get("format", "{credential}")),
        method=method,
        params=params,
        body=field_("body", str, "json" if method in ("POST", "PUT", "PATCH") else "query"),
        max_response_bytes=int(field_("max_response_bytes", int, DEFAULT_MAX_RESPONSE_BYTES)),
        timeout_s=float(field_("timeout_s", (int, float), DEFAULT_TIMEOUT_S)),
        grant=str(field_("grant", str, "")),
        description=str(field_("description", str, "")),
    )


def load_operations(
    env: Mapping[str, str], extra_files: tuple[str, ...] = ()
) -> tuple[dict[str, Operation], list[str]]:
    """Built-in operations, then ``apis.json`` in the config home, then the host's own files.
    A later definition of a name replaces an earlier one. Problems name the file and field."""
    operations = {name: parse_operation(name, spec, "built-in") for name, spec in BUILTIN.items()}
    problems: list[str] = []
    for path in (config_home(env) / APIS_FILE, *map(Path, extra_files)):
        text, data, problem = read_json_file(path)
        if problem is not None:
            problems.append(problem)
            continue
        if text is None:
            continue
        specs = data.get("operations") if isinstance(data, dict) else None
        if not isinstance(specs, dict):
            problems.append(f'{path}: expected {{"operations": {{"group.action": {{...}}}}}}')
            continue
        for name, spec in specs.items():
            try:
                operations[name] = parse_operation(name, spec, str(path))
            except (ValueError, TypeError) as exc:
                problems.append(str(exc))
    return operations, problems


@dataclass(frozen=True)
class ApiAnswer:
    status: int
    body: Any  # parsed JSON, or text
    content_type: str


def perform(client: ApiHttp, op: Operation, request: ApiRequest) -> ApiAnswer:
    """Send it (never following a redirect: it would carry the credential elsewhere), reading at
    most the operation's cap."""
    try:
        response = client.send(request, op.timeout_s, op.max_response_bytes)
    except ResponseTooLarge:
        raise OperationError(
            f"{op.name}: the response is larger than the operation's cap of {op.max_response_bytes} bytes "
            "(max_response_bytes); ask for less (fewer results per page)"
        ) from None
    content_type = response.headers.get("content-type", "")
    text = response.text
    body: Any = text
    if "json" in content_type:
        try:
            body = json.loads(text)
        except ValueError:
            pass
    return ApiAnswer(response.status, body, content_type.split(";")[0])
