"""[host] The JupyterLab extension's server side: a jupyter_server extension, in the server's own
process, beside the provisioners of the kernels it runs.

The page asks it, never the kernel, for what the host knows: whether a kernel is sandboxed, its
deadline and memory limit (``GET /ivralo/kernels/<id>/facts``); and it answers the host's egress
questions through it (``POST .../dialogs`` says which of the page's connections shows them as
dialogs; ``GET .../questions`` lists the open ones, ``POST .../questions/<qid>`` answers one:
host/jupyter/person_dialogs.py); and it restores a changed file's previous version from the
workspace's history (``POST .../restore``: host/history/store.py, which restores only the copies
the host itself recorded, so a copy named by the kernel's effects report is checked there).

Everything the kernel writes is untrusted (code in it can answer ``kernel_info`` as it likes), so
these facts come from the kernel's ``IvraloProvisioner``. A kernel that is not ivralo's (no such
provisioner) is a 404: the page shows nothing for it.

Enabled by ``etc/jupyter/jupyter_server_config.d/ivralo-kernel.json`` (the wheel's shared data).
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ivralo_kernel.host.history.store import HistoryError, HistoryStore
from ivralo_kernel.host.jupyter.person_dialogs import DIALOGS
from ivralo_kernel.host.off_loop import off_loop
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.policy import default_memory_limit
from ivralo_kernel.protocol.sandbox.modes import FALLBACK_GAPS, SANDBOX_GAPS

KERNEL_ID = r"(?P<kernel_id>[\w-]+)"
DOCTOR_HINT = "ivralo-kernel doctor names each layer in force on this machine and the next step for each gap."


def host_facts(provisioner: Any) -> dict[str, Any]:
    """What the host itself knows of a running kernel, for the status bar (host facts only)."""
    sandboxed = bool(provisioner.sandboxed)
    limit = provisioner.memory_limit_bytes
    return {
        "sandboxed": sandboxed,
        "mode": "OS sandbox (bubblewrap)" if sandboxed else f"no OS sandbox ({provisioner.sandbox_reason or 'off'})",
        "not_stopped": SANDBOX_GAPS if sandboxed else FALLBACK_GAPS,
        "doctor": DOCTOR_HINT,
        "deadline_ms": provisioner.deadline_ms,
        "memory_limit_bytes": limit if limit is not None else default_memory_limit(),
        "memory_hard_limit_bytes": provisioner.memory_hard_limit_bytes,
    }


def ivralo_provisioner(kernel_manager: Any, kernel_id: str) -> Any:
    """The ivralo provisioner of a running kernel of this server; 404 for any other kernel."""
    from ivralo_kernel.host.jupyter.provisioner import IvraloProvisioner  # the server's import stays light

    try:
        manager = kernel_manager.get_kernel(kernel_id)
    except KeyError:
        raise web.HTTPError(404, "no such kernel") from None
    provisioner = getattr(manager, "provisioner", None)
    if not isinstance(provisioner, IvraloProvisioner):
        raise web.HTTPError(404, "not an ivralo kernel")
    return provisioner


class FactsHandler(APIHandler):  # type: ignore[misc]
    auth_resource = "kernels"

    @web.authenticated  # type: ignore[misc]
    def get(self, kernel_id: str) -> None:
        provisioner = ivralo_provisioner(self.kernel_manager, kernel_id)
        self.finish(json.dumps(host_facts(provisioner)))


def _body(handler: APIHandler) -> dict[str, Any]:
    body = handler.get_json_body()
    if not isinstance(body, dict):
        raise web.HTTPError(400, "a JSON object is expected")
    return body


class DialogsHandler(APIHandler):  # type: ignore[misc]
    """The page's connection (``{"client": <its session id>}``) shows the host's questions as dialogs."""

    auth_resource = "kernels"

    @web.authenticated  # type: ignore[misc]
    def post(self, kernel_id: str) -> None:
        ivralo_provisioner(self.kernel_manager, kernel_id)
        client = _body(self).get("client")
        if not isinstance(client, str) or not 0 < len(client) <= 200:
            raise web.HTTPError(400, "client: the connection's session id")
        DIALOGS.register(kernel_id, client)
        self.finish(json.dumps({"registered": True}))


class QuestionsHandler(APIHandler):  # type: ignore[misc]
    auth_resource = "kernels"

    @web.authenticated  # type: ignore[misc]
    def get(self, kernel_id: str) -> None:
        ivralo_provisioner(self.kernel_manager, kernel_id)
        self.finish(json.dumps(DIALOGS.open_questions(kernel_id)))


class AnswerHandler(APIHandler):  # type: ignore[misc]
    auth_resource = "kernels"

    @web.authenticated  # type: ignore[misc]
    def post(self, kernel_id: str, question_id: str) -> None:
        ivralo_provisioner(self.kernel_manager, kernel_id)
        choice = _body(self).get("answer")
        if not isinstance(choice, str) or not DIALOGS.answer(kernel_id, question_id, choice):
            raise web.HTTPError(404, "no such open question, or not one of its choices")
        self.finish(json.dumps({"answered": choice}))


UNDO = "ivralo-kernel history restore {id}"  # in a terminal: no cell shows the copy a restore keeps


def restore_copy(provisioner: Any, path: str, copy: str) -> tuple[bool, str]:
    """(blocks) Put ``path`` back as the history's ``copy`` holds it: (restored, what was done or why not).
    Never over a newer change (the person restores that one with ``ivralo-kernel history``)."""
    if provisioner.role == names.ROLE_READONLY:
        return False, "not restored: this kernel's role is readonly, so it changes no files, restores included"
    recorder = provisioner.history_recorder
    if recorder is None:
        return False, "not restored: this kernel keeps no history"
    recorder.record()  # what the write guard copied during the cell, recorded by the host now
    store = HistoryStore(recorder.workspace, provisioner.tool_files)
    try:
        entry = store.find(copy)
        if entry.path != store.resolve(path, base=store.workspace):
            return False, f"not restored: the copy {entry.id} is not one of {path}"
        restored = store.restore(entry, force_flag="`ivralo-kernel history restore ID --force` in a terminal")
    except HistoryError as exc:
        return False, f"not restored: {exc}"
    return True, restored.describe(UNDO)


class RestoreHandler(APIHandler):  # type: ignore[misc]
    """``{"path": <relative to the workspace>, "copy": <the history's copy>}`` -> ``{"restored", "text"}``."""

    auth_resource = "contents"

    @web.authenticated  # type: ignore[misc]
    async def post(self, kernel_id: str) -> None:
        provisioner = ivralo_provisioner(self.kernel_manager, kernel_id)
        body = _body(self)
        path, copy = body.get("path"), body.get("copy")
        if not isinstance(path, str) or not isinstance(copy, str) or not path or not copy:
            raise web.HTTPError(400, "path and copy: the changed file and its history copy")
        restored, text = await off_loop(restore_copy, provisioner, path, copy)
        self.finish(json.dumps({"restored": restored, "text": text}))


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": __name__}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    base = url_path_join(serverapp.web_app.settings["base_url"], "ivralo", "kernels", KERNEL_ID)
    serverapp.web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "facts"), FactsHandler),
            (url_path_join(base, "dialogs"), DialogsHandler),
            (url_path_join(base, "questions"), QuestionsHandler),
            (url_path_join(base, "questions", r"(?P<question_id>[0-9a-f]{32})"), AnswerHandler),
            (url_path_join(base, "restore"), RestoreHandler),
        ],
    )
