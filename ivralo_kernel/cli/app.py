"""[cli] Command table of ``ivralo-kernel`` (also ``python -m ivralo_kernel``)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import ivralo_kernel.cli.history as history
from ivralo_kernel import __version__
from ivralo_kernel.protocol import IvraloError, names
from ivralo_kernel.protocol.terminal import terminal_safe


def _install(args: argparse.Namespace) -> int:
    from ivralo_kernel.cli.install import install

    flags = {
        "deadline_ms": args.deadline_ms,
        "sandbox": args.sandbox,
        "interrupt_grace_ms": args.interrupt_grace_ms,
        "memory_limit_bytes": args.memory_limit,
        "memory_hard_limit_bytes": args.memory_hard_limit,
        "grants": args.grant,
    }
    settings = _chosen(args.settings, flags)  # a grace longer than the deadline is refused here
    prefix = sys.prefix if args.sys_prefix else args.prefix
    # Both surfaces by default, so that the message that names the other one is true; --name or
    # --surface writes one spec.
    config = {k: v for k, v in settings.items() if v is not None}
    chosen = args.surface or config.pop("surface", None)
    config.pop("surface", None)
    if chosen is not None or args.name or args.project:
        surfaces = [chosen or names.SURFACE_PROJECT]
    else:
        surfaces = [names.SURFACE_PROJECT, names.SURFACE_HERMETIC]
    for surface in surfaces:
        where = install(
            user=args.user,
            prefix=prefix,
            name=args.name,
            python=args.python,
            display_name=args.display_name,
            provisioner_config=config,
            surface=surface,
            project=args.project,
        )
        print(f"Installed kernelspec {os.path.basename(where)} in {where}")
        if args.project:
            print(f"  interpreter: {_spec_interpreter(where)}")
    return 0


def _spec_interpreter(where: str) -> str:
    import json

    with open(os.path.join(where, "kernel.json"), encoding="utf-8") as f:
        spec = json.load(f)
    return str(spec.get("env", {}).get(names.ENV_INTERPRETER) or spec["argv"][0])


def _run(args: argparse.Namespace) -> int:
    from ivralo_kernel.cli.run import run_file

    deadline_ms = args.deadline_ms
    if args.timeout is not None:  # the old flag: nbclient's wait for notebooks, the deadline for .py files
        deadline_ms = round(args.timeout * 1000)
        print(
            f"ivralo-kernel run: --timeout is deprecated; it now means --deadline-ms {deadline_ms} "
            "(the host's per-execution deadline, for notebooks and .py files alike)",
            file=sys.stderr,
        )
    flags = {"deadline_ms": deadline_ms, "memory_limit_bytes": args.memory_limit, "grants": args.grant}
    settings = _chosen(args.settings, flags)
    return run_file(args.file, workspace=args.workspace, settings=settings, progress=args.progress)


def _mcp(args: argparse.Namespace) -> int:
    from ivralo_kernel.cli.mcp import serve_mcp

    return serve_mcp(
        workspace=args.workspace,
        transport=args.transport,
        host=args.host,
        port=args.port,
        settings=args.settings,
        given={"deadline_ms": args.deadline_ms},
        grants=args.grant or (),
        role=args.role,
        project=args.project,
    )


def _chosen(settings: tuple[str, ...], flags: dict[str, Any]) -> dict[str, Any]:
    """The values this command line sets (``--IvraloSettings.NAME=`` and the command's flags), checked
    together; the rest come from the config files, which the provisioner reads itself."""
    from ivralo_kernel.host.settings.resolve import JupyterHostSettings, command_line_layer, resolve

    given = {k: v for k, v in flags.items() if v is not None}
    chosen = resolve(JupyterHostSettings, [command_line_layer(settings)], given, given_label="flag")
    values = {name: value for name, value, source in chosen.rows() if source != "default"}
    if "deadline_ms" in values:  # the grace that goes with it (half a short deadline), for a raw launch too
        values.setdefault("interrupt_grace_ms", chosen.settings.interrupt_grace_ms)
    return values


def _doctor(args: argparse.Namespace) -> int:
    from ivralo_kernel.cli.doctor import doctor

    return doctor(args.json, tuple(args.settings), project=args.project, strict=args.strict)


def _config(args: argparse.Namespace) -> int:
    from ivralo_kernel.cli.config import show_config

    return show_config(args.settings, kernel_name=args.name, as_json=args.json)


def _trust(args: argparse.Namespace) -> int:
    from ivralo_kernel.protocol.trust import set_trust

    folder = os.path.realpath(args.path)
    if not os.path.isdir(folder):
        raise IvraloError(f"{args.path}: no such folder. Give the folder to {args.command}.")
    written = set_trust(folder, args.command == "trust", os.environ)
    verb = "Trusted" if args.command == "trust" else "No longer trusted"
    print(f"{verb}: {folder}\n(recorded in {written}; kernels started there from now on see the change)")
    if args.command == "trust":
        from ivralo_kernel.host.settings.workspace_files import approve

        for rel in approve(folder, os.environ):
            print(f"Approved {rel} as it is now (it had changed while a kernel of this folder ran)")
    return 0


WITH_SETTINGS = ("install", "config", "doctor", "run", "mcp")
SETTINGS_EPILOG = (
    "Any setting can also be given as --IvraloSettings.NAME=VALUE (every kernel), --IvraloProvisioner.NAME=VALUE "
    "(kernels Jupyter's hosts start) or --IvraloAgent.NAME=VALUE (the agent API's); None means unset. "
    "`ivralo-kernel config` lists them."
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ivralo-kernel", description="A guarded Python kernel for Jupyter.")
    parser.add_argument("--version", action="version", version=f"ivralo-kernel {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = commands.add_parser("install", help="install the ivralo kernelspec")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for the current user (Jupyter's user data dir)")
    where.add_argument("--sys-prefix", action="store_true", help="into this Python environment (sys.prefix)")
    where.add_argument("--prefix", metavar="P", help="under P/share/jupyter/kernels")
    p.add_argument(
        "--name",
        help=f"kernelspec name (default: {names.KERNEL_NAME}; {names.HERMETIC_KERNEL_NAME} for the hermetic surface)",
    )
    p.add_argument("--display-name", help=f"name shown in the launcher (default: {names.DISPLAY_NAME})")
    p.add_argument(
        "--surface",
        choices=names.SURFACES,
        help=f"install one spec: project ({names.KERNEL_NAME}, the interpreter's packages) or hermetic "
        f"({names.HERMETIC_KERNEL_NAME}, the standard library and ivralo's helpers only). Default: both, "
        "unless --name is given",
    )
    p.add_argument("--python", metavar="PATH", help="run the kernel with this interpreter (default: this one)")
    p.add_argument(
        "--project",
        metavar="PATH",
        help="run the kernel in this project's interpreter: its uv .venv, Poetry environment, .venv or venv, "
        "else python3 on PATH (the spec is named ivralo-FOLDER unless --name is given)",
    )
    p.add_argument("--deadline-ms", type=int, metavar="MS", help="per-execution deadline (default: none)")
    p.add_argument("--interrupt-grace-ms", type=int, metavar="MS", help="grace after the deadline's interrupt")
    p.add_argument("--memory-limit", type=int, metavar="BYTES", help="RLIMIT_DATA (default: half the RAM)")
    p.add_argument("--memory-hard-limit", type=int, metavar="BYTES", help="tree RSS that kills the kernel")
    p.add_argument(
        "--grant",
        action="append",
        metavar="NAME",
        help='a broker grant of kernels started from this spec ("databases", or an operation group such as '
        '"photos"); repeat for more',
    )
    p.add_argument(
        "--sandbox",
        choices=("auto", "required", "off"),
        help="the OS sandbox (bubblewrap): auto where it can be built, required, or off (default: auto)",
    )
    p.set_defaults(func=_install)

    p.epilog = SETTINGS_EPILOG

    p = commands.add_parser(
        "config", help="print every setting's effective value and where it came from", epilog=SETTINGS_EPILOG
    )
    p.add_argument("--name", default=names.KERNEL_NAME, help="the kernelspec to show (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(func=_config)

    p = commands.add_parser("doctor", help="start a kernel and report which protections are in force here")
    p.epilog = SETTINGS_EPILOG
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument(
        "--project", metavar="PATH", help="start the kernel in this project's interpreter, as a Session would"
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit 1 also while a layer is off (off by default, such as the TCP connect floor) or only partly "
        "in force (default: exit 1 only for a gap in a layer that is on by default)",
    )
    p.set_defaults(func=_doctor)

    for name, text in (
        ("trust", "import the folder's own code in its kernels (recorded outside the folder)"),
        ("untrust", "stop importing the folder's own code"),
    ):
        p = commands.add_parser(name, help=text)
        p.add_argument("path", nargs="?", default=".", help="the folder (default: the current one)")
        p.set_defaults(func=_trust)

    p = commands.add_parser(
        "run",
        help="run a notebook or a .py file in a guarded kernel and print what it did; exits 1 if any cell failed",
        description="Run every cell of FILE in a guarded kernel and print each with its output. Exits 1 if any "
        "cell failed (every cell still runs), 0 otherwise.",
    )
    p.add_argument("file", help="FILE.ipynb or FILE.py")
    p.add_argument("--workspace", help="folder the kernel runs in (default: the file's folder)")
    p.add_argument("--memory-limit", type=int, metavar="BYTES", help="RLIMIT_DATA of the kernel")
    deadline = p.add_mutually_exclusive_group()
    deadline.add_argument(
        "--deadline-ms",
        type=int,
        metavar="MS",
        help="per-execution deadline, for each notebook cell and for a whole .py file: the cell is interrupted "
        "at MS, and its kernel's process tree killed if it has not ended after the grace (2 s); the run then "
        "goes on and exits 1. Default: no deadline, as with `jupyter nbconvert --execute` and papermill",
    )
    deadline.add_argument("--timeout", type=float, metavar="SECONDS", help="deprecated: the same deadline, in seconds")
    p.add_argument("--grant", action="append", metavar="NAME", help='a broker grant, e.g. "databases"; repeatable')
    p.add_argument(
        "--progress",
        choices=("auto", "bar", "lines", "none"),
        default="auto",
        help="a notebook's per-cell progress on stderr: a bar rewritten in place, or one line per cell "
        "(auto, the default: a bar when stderr is a terminal, lines otherwise)",
    )
    p.epilog = SETTINGS_EPILOG
    p.set_defaults(func=_run)

    p = commands.add_parser(
        "mcp",
        help="serve a guarded Python session to MCP clients (Claude, Cursor, VS Code): run_python and the namespace",
        description="An MCP server whose tools run Python in a guarded, persistent kernel, one per client session. "
        "stdio by default (the client starts this command); --transport http serves streamable HTTP at /mcp.",
    )
    p.add_argument("--workspace", help="folder the kernel runs in and may write (default: --project, else here)")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="default: %(default)s")
    p.add_argument("--host", default="127.0.0.1", help="HTTP: the address to bind (default: %(default)s, this machine)")
    p.add_argument("--port", type=int, default=8765, help="HTTP: the port (default: %(default)s)")
    p.add_argument(
        "--deadline-ms",
        type=int,
        metavar="MS",
        help="per-call deadline: interrupted at MS (the namespace kept), the kernel ended after the grace "
        "(default: the agent API's, 60000)",
    )
    p.add_argument("--grant", action="append", metavar="NAME", help='a broker grant, e.g. "databases"; repeatable')
    p.add_argument("--role", choices=("readonly",), help="readonly: every write refused, nothing restored")
    p.add_argument("--project", metavar="PATH", help="run the kernel in this project's interpreter (its .venv, ...)")
    p.epilog = SETTINGS_EPILOG
    p.set_defaults(func=_mcp)

    history.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # Settings (--IvraloSettings.NAME=VALUE) for the commands that start or describe kernels.
    if extra and args.command not in WITH_SETTINGS:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.settings = tuple(extra)
    try:
        return int(args.func(args))
    except IvraloError as exc:
        print(f"ivralo-kernel {args.command}: {terminal_safe(str(exc), keep_newlines=True)}", file=sys.stderr)
        return 2
