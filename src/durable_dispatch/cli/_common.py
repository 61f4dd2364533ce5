"""What every command of the command line shares: exit codes, printing (a table or ``--json``),
errors as ``Error: ...`` or one JSON object, and a progress meter for large files."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson

from ..views.examine import kind_of

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # the demo was stopped by a second Ctrl-C (128 + SIGINT)
EXIT_TERMINATED = 143  # the demo was stopped by SIGTERM (128 + SIGTERM)
_PROGRESS_MIN = 8 << 20


class _IOFailure(Exception):
    pass


class _Stopped(Exception):
    """The demo was stopped by a signal (``--json`` reports it as an error of type Stopped)."""


def _file_meter(name: str, size: int) -> _Meter:
    """The progress line of reading one file (``examine``'s ``progress``)."""
    return _Meter(f"reading {name}", size)


class _Meter:
    """A progress line on standard error: only on a terminal and for large files. The size is
    given here, or by the first call (``meter(done, total)``, as the library's callbacks do)."""

    def __init__(self, label: str, size: int | None = None) -> None:
        self._label = label
        self._size = size
        self._show = False
        self._next = 0.0
        if size is not None:
            self._sized(size)

    def _sized(self, size: int) -> None:
        self._size = max(size, 1)
        self._show = sys.stderr.isatty() and size >= _PROGRESS_MIN

    def __call__(self, done: int, total: int | None = None) -> None:
        if self._size is None:
            self._sized(total or 0)
        if self._show and time.monotonic() >= self._next:
            assert self._size is not None
            sys.stderr.write(f"\r{self._label}: {100.0 * done / self._size:5.1f}%")
            sys.stderr.flush()
            self._next = time.monotonic() + 0.2

    def done(self) -> None:
        if self._show:
            sys.stderr.write("\r" + " " * (len(self._label) + 9) + "\r")
            sys.stderr.flush()


def _print(obj: Any, as_json: bool) -> None:
    if as_json:
        opt = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
        sys.stdout.write(orjson.dumps(obj, option=opt).decode() + "\n")
        return
    if isinstance(obj, list):
        for row in obj:
            _print(row, False)
            print()
        if not obj:
            print("(none)")
        return
    for k, v in obj.items():
        if k == "damage":
            for d in v:
                where = f"{d['path']} " if "path" in d else ""
                print(
                    f"{'damage':<30} {where}offset {d['offset']}, {d['length']} bytes: "
                    f"{d['reason']}"
                )
        elif k == "kinds" and isinstance(v, dict):
            for kind, n in sorted(v.items()):
                print(f"{'kind ' + kind:<30} {n}")
        elif k == "files":
            for f in v:
                print(
                    f"{'file':<30} {f['path']} ({f['kind']}, "
                    f"{'intact' if f['intact'] else 'DAMAGED'})"
                )
        elif isinstance(v, dict) and v and k not in ("stale", "unowned", "malformed", "duplicate"):
            _print({f"{k}.{kk}": vv for kk, vv in v.items()}, False)
        else:
            print(f"{k:<30} {_text(v)}")


def _text(v: Any) -> str:
    """A value for people: no Python reprs (lists joined, mappings as k=v, None as -)."""
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return ", ".join(_text(x) for x in v) if v else "(none)"
    if isinstance(v, dict):
        return ", ".join(f"{kk}={_text(vv)}" for kk, vv in v.items()) if v else "(none)"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return str(v)


def _need_state_dir(path: str) -> None:
    if not os.path.exists(path):
        raise _IOFailure(f"{path}: no such directory")
    if not os.path.isdir(path):
        raise _IOFailure(f"{path}: not a directory")
    if kind_of(path) != "state-directory":
        from ..campaign.statedir import is_state_dir

        try:
            inner = sorted(n for n in os.listdir(path) if is_state_dir(os.path.join(path, n)))
        except OSError:
            inner = []
        if inner:  # a futures runner's --state-dir holds one state directory per executor
            more = f" and {len(inner) - 8} more" if len(inner) > 8 else ""
            raise _IOFailure(
                f"{path} is not a durable-dispatch state directory, but it holds "
                f"{len(inner)} ({', '.join(inner[:8])}{more}): a futures runner's --state-dir "
                "keeps one per executor; pass one of them, e.g. "
                f"{os.path.join(path, inner[0])}"
            )
        raise _IOFailure(f"{path} is not a durable-dispatch state directory")


def _error(args: argparse.Namespace, e: BaseException, code: int) -> int:
    """Report an error: ``Error: ...`` on stderr, or with ``--json`` one object on stdout of a
    stable shape, ``{"error": {"type", "message", "exit_code"}}``; returns ``code``."""
    if getattr(args, "json", False):
        names: dict[type[BaseException], str] = {
            _IOFailure: "UsageError",
            LookupError: "NotFound",
            _Stopped: "Stopped",
        }
        kind = names.get(type(e), type(e).__name__)
        body = {"error": {"type": kind, "message": str(e), "exit_code": code}}
        sys.stdout.write(orjson.dumps(body).decode() + "\n")
    else:
        print(f"Error: {e}", file=sys.stderr)
    return code
