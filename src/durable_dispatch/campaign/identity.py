"""A state directory belongs to one campaign: its name, in ``campaign-name.json``.

``run_master(..., campaign="name")`` names the campaign; without it, the name is the main
script's file name (``sweep.py``; for ``python -m pkg``, ``pkg``; for the futures runner, the
script it runs). The first run on a fresh state directory records the name; a run under another
name is refused with :class:`~durable_dispatch.errors.CampaignMismatchError` before the state is
opened, so nothing is added. A state directory written before names were recorded adopts the
first name it is opened with. A run with no name at all (an interactive session, ``python -c``)
neither checks nor records one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from functools import partial

import orjson

from ..errors import CampaignMismatchError, UsageError
from ..storage import fs as _fs
from ..storage.background import Beside as _Beside

__all__ = ["CAMPAIGN_FILE", "default_name", "recorded_name", "check_name", "record_name"]

log = logging.getLogger("durable_dispatch.campaign")

#: The file in a state directory that holds its campaign's name: ``{"campaign": name, "since":
#: seconds since the epoch}``.
CAMPAIGN_FILE = "campaign-name.json"
_MAX_BYTES = 4096


def default_name() -> str | None:
    """The main script's file name (``sys.argv[0]``'s last part; a package's name for
    ``python -m package``), or None when there is no script (``python -c``, a REPL)."""
    argv0 = sys.argv[0] if sys.argv else ""
    if not argv0 or argv0 in ("-c", "-m", "-"):
        return None
    base = os.path.basename(argv0)
    if base == "__main__.py":
        base = os.path.basename(os.path.dirname(os.path.abspath(argv0)))
    return base or None


def recorded_name(state_dir: str | os.PathLike[str]) -> str | None:
    """The campaign name recorded in ``state_dir``, or None (none recorded, or a file this
    version cannot read: it is then recorded again). Read-only."""
    path = os.path.join(os.fspath(state_dir), CAMPAIGN_FILE)
    try:
        with _fs.open_read(path) as f:
            data = f.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("campaign name in %s cannot be read (%s): it is recorded again", path, e)
        return None
    try:
        name = orjson.loads(data).get("campaign")
    except (orjson.JSONDecodeError, AttributeError):
        name = None
    if not isinstance(name, str) or not name:
        log.warning("campaign name in %s is damaged: it is recorded again", path)
        return None
    return name


def _checked(name: str | None) -> str | None:
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise UsageError(f"campaign must be a non-empty string, got {name!r}")
    return name


def check_name(state_dir: str | os.PathLike[str], name: str | None) -> None:
    """Refuse ``name`` when ``state_dir`` records another campaign's. Read-only.

    Raises:
        CampaignMismatchError: naming both.
        UsageError: ``name`` is not a non-empty string.
    """
    name = _checked(name)
    if name is None:
        return
    was = recorded_name(state_dir)
    if was is not None and was != name:
        raise CampaignMismatchError(
            f"state directory {os.fspath(state_dir)} belongs to campaign {was!r}, and this run "
            f"is campaign {name!r}: give this campaign a state directory of its own, or pass "
            f"run_master(..., campaign={was!r}) if it is the same campaign (a renamed script)",
            path=os.fspath(state_dir),
            recorded=was,
            given=name,
        )


def record_name(state_dir: str | os.PathLike[str], name: str | None) -> bool:
    """Record ``name`` in ``state_dir`` when none is recorded (call it while holding the state
    directory's lock, after :func:`check_name`); returns True when it wrote the name, durably.

    The file is made under its own name (an exclusive create: no temporary file, no rename),
    and its fsync and its directory's fsync run side by side: one fsync's wait instead of two
    in a row, and two metadata operations fewer. A crash before both ended leaves the name
    missing or an empty file, which :func:`recorded_name` reads as no name: the next run
    records it again. Only a damaged file (what such a crash left) is replaced whole (a
    temporary file, its fsync, a rename, the directory's fsync).

    Raises:
        OSError: the disk refused the name (the state is open: the caller closes it).
    """
    name = _checked(name)
    d = os.fspath(state_dir)
    if name is None or recorded_name(d) is not None:
        return False
    path = os.path.join(d, CAMPAIGN_FILE)
    data = orjson.dumps({"campaign": name, "since": time.time()}) + b"\n"
    try:
        fd = _fs.create_exclusive(path, 0o600)
    except FileExistsError:  # a damaged file: replaced whole
        _replace_name(d, path, data)
        return True
    try:
        entry = _Beside(partial(_fs.fsync_dir, d), "fsync-campaign-name")
        try:
            _fs.write_all(fd, data)
            _fs.fsync(fd)
        finally:
            interrupted = entry.wait()
            _fs.close(fd)
        if interrupted is not None:
            raise interrupted
        if entry.error is not None:
            raise entry.error
    except BaseException:
        with contextlib.suppress(OSError):
            _fs.unlink(path)  # (no name rather than a name that may not last)
        raise
    return True


def _replace_name(d: str, path: str, data: bytes) -> None:
    """Replace the damaged name file at ``path`` with ``data``, atomically and durably."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        _fs.unlink(tmp)  # (a leftover of a run killed here)
    fd = _fs.create_exclusive(tmp, 0o600)
    try:
        try:
            _fs.write_all(fd, data)
            _fs.fsync(fd)
        finally:
            _fs.close(fd)
        _fs.replace(tmp, path)
        _fs.fsync_dir(d)
    except BaseException:
        with contextlib.suppress(OSError):
            _fs.unlink(tmp)
        raise
