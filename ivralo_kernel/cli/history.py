"""[cli] ``ivralo-kernel history list|show|restore``: the person's side of the write guard's copies."""

from __future__ import annotations

import argparse
import json
import os

from ivralo_kernel.host.history.store import (
    GRACE_S,
    HistoryStore,
    described,
    entry_dict,
    find_workspace,
    human_size,
    local_time,
    parse_time,
)
from ivralo_kernel.host.settings.resolve import JupyterHostSettings, load
from ivralo_kernel.protocol import IvraloError, names
from ivralo_kernel.protocol.history_index import Entry
from ivralo_kernel.protocol.terminal import terminal_safe

NEWER_CHANGE_RULE = (
    "A newer change is one made after the change the copy undoes: the history holds a later copy of the same "
    f"file, the file was modified more than {GRACE_S:g} s after the copy was taken, or it was deleted and exists "
    "again. "
    "Whatever a restore overwrites is first kept as a copy (operation 'restore'), so a restore can be undone too."
)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    history = commands.add_parser(
        "history",
        help="list, show and restore the copies the write guard kept of changed files",
        description="The write guard copies a file into .ivralo/history/ before a cell overwrites, truncates, "
        "renames over or deletes it. These commands list those copies, show one, and put one back. They run "
        "in your shell, not in a kernel (code in the kernel cannot read .ivralo/).",
    )
    actions = history.add_subparsers(dest="action", required=True, metavar="ACTION")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--workspace",
        metavar="DIR",
        help="the workspace (default: the nearest folder with a .ivralo/history/, from PATH's folder or the "
        "current one upward)",
    )

    p = actions.add_parser("list", parents=[common], help="each copy, newest first: ID, time, operation, size, path")
    p.add_argument("path", nargs="?", metavar="PATH", help="only the copies of this file (or of files under a folder)")
    p.add_argument("--json", action="store_true", help="machine-readable list")
    p.set_defaults(func=_list)

    p = actions.add_parser("show", parents=[common], help="one copy: where it came from, and its content")
    p.add_argument("id", metavar="ID", help="the ID `history list` shows (or a unique prefix, or the copy's file name)")
    p.set_defaults(func=_show)

    p = actions.add_parser(
        "restore",
        parents=[common],
        help="put a copy back where it was, byte for byte",
        description="Write the copy back to its file, byte for byte and with its mode, atomically. Refused "
        "over a newer change unless --force. " + NEWER_CHANGE_RULE,
    )
    p.add_argument("target", metavar="ID|PATH", help="the copy's ID; with --at, the file's path")
    p.add_argument(
        "--at",
        metavar="TIME",
        help="restore PATH as it was at TIME (the first copy taken after TIME): 2026-11-29 10:12:05, ISO 8601, "
        "or a time of day today",
    )
    p.add_argument("--force", action="store_true", help="restore over a newer change (it is kept as a copy first)")
    p.set_defaults(func=_restore)


def _store(args: argparse.Namespace, path: str | None) -> HistoryStore:
    # The tool files the person's settings close (a restore never writes one), as the kernels' hosts read them.
    tool_files = load(JupyterHostSettings).settings.tool_files
    if args.workspace is not None:
        if not os.path.isdir(args.workspace):
            raise IvraloError(f"--workspace {args.workspace}: no such folder. Give the folder a kernel ran in")
        return HistoryStore(args.workspace, tool_files)
    return HistoryStore(find_workspace(path if path is not None else "."), tool_files)


def _list(args: argparse.Namespace) -> int:
    store = _store(args, args.path)
    entries = store.listing(args.path)
    if args.json:
        print(json.dumps([entry_dict(store, e) for e in entries], indent=2))
        return 0
    if not entries:
        which = f" of {args.path}" if args.path else ""
        print(
            f"No kept copies{terminal_safe(which)} in {terminal_safe(store.workspace)}. The write guard keeps one "
            "when a cell overwrites, truncates, renames over or deletes a file."
        )
        return 0
    # Names and operations come from what code in the kernel did: escaped, never sent to the terminal raw.
    rows = [
        tuple(
            terminal_safe(str(cell))
            for cell in (e.id, local_time(e.ns), e.operation, human_size(e.size), store.relative(e))
        )
        for e in entries
    ]
    header = ("ID", "TIME", "OPERATION", "SIZE", "PATH")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for row in [header, *rows]:
        cells = [row[i].ljust(widths[i]) if i != 3 else row[i].rjust(widths[i]) for i in range(4)]
        print("  ".join([*cells, row[4]]))
    print(
        f"\n{len(entries)} copies in {terminal_safe(store.workspace)}/{names.HISTORY_DIR}. "
        "Restore one: ivralo-kernel history restore ID"
    )
    return 0


def _show(args: argparse.Namespace) -> int:
    store = _store(args, None)
    entry = store.find(args.id)
    content, _mode = store.read(entry)
    rel = terminal_safe(store.relative(entry))
    print(f"ID         {terminal_safe(entry.id)}")
    print(f"File       {rel}")
    print(f"Taken      {local_time(entry.ns)}, before {terminal_safe(described(entry))}")
    print(f"Size       {len(content)} bytes ({human_size(len(content))})")
    print(f"Copy       {names.HISTORY_DIR}/{terminal_safe(entry.copy)}")
    print(f"Now        {terminal_safe(_now(store, entry, content))}")
    print(f"Restore    ivralo-kernel history restore {terminal_safe(entry.id)}")
    text = _text(content)
    text = terminal_safe(text, keep_newlines=True) if text is not None else None
    if text is None:
        print(f"\n(binary content, {len(content)} bytes: not shown)")
    else:
        print(f"\n{text}", end="" if text.endswith("\n") or not text else "\n")
    return 0


def _now(store: HistoryStore, entry: Entry, content: bytes) -> str:
    now = store.current(entry)
    rel = store.relative(entry)
    if now is None:
        return f"{rel} does not exist"
    try:
        with open(entry.path, "rb") as current:
            same = current.read() == content
    except OSError:
        same = False
    if same:
        return f"{rel} holds the same bytes as this copy"
    return f"{rel} differs: {now.st_size} bytes, modified {local_time(now.st_mtime_ns)}"


def _text(content: bytes) -> str | None:
    if b"\0" in content:
        return None
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _restore(args: argparse.Namespace) -> int:
    if args.at is not None:
        store = _store(args, args.target)
        entry = store.at(args.target, parse_time(args.at))
    else:
        store = _store(args, None)
        entry = store.find(args.target)
    done = store.restore(entry, force=args.force)
    print(terminal_safe(done.describe("ivralo-kernel history restore {id}"), keep_newlines=True))
    return 0
