"""Operator commands through the state directory: ``durable-dispatch cancel``, ``retry``,
``drain`` and ``submit`` reach a running master, or the next one, with nothing but files.

Theory of operation. The login node and the compute nodes share the state directory and
nothing else, so a command is a file. The command line writes ``control/<id>.cmd`` (a JSON
object ``{"id", "op", "args", "ts", "host", "pid"}``): a temporary file created exclusively,
owner-only, never through a link, fsynced, then renamed into place and the directory fsynced.
``<id>`` is unique (the time in nanoseconds, the host, the pid and random bits), and names
sort in the order they were written.

The master looks for commands in its loop (:class:`Inbox`) at a cost that does not show per
task: one ``stat`` of ``control/`` at most every :data:`POLL_SECONDS` on its own clock, and a
listing only when the directory's modification time changed (or every :data:`RESCAN_SECONDS`,
for filesystems whose directory times are coarse or cached). It applies each command found
(:func:`apply_command`), in name order:

1. the file must be a regular file owned by the state directory's owner (checked on the open
   descriptor, opened without following a link); otherwise it is refused, left untouched and
   logged once;
2. a command whose ID the campaign's ledger already holds (``ledger.commands``) was applied
   before a crash: it is acknowledged again with the outcome recorded, not applied again;
3. otherwise its effects are journaled (``cancelled``, ``requeued_deferred``, ``submitted`` ...),
   then a ``command`` record with its ID and outcome, and the journal is fsynced;
4. only then the acknowledgement ``control/<id>.ack`` (the outcome, JSON) is written atomically
   and the command file removed.

Exactly once. The effects of each command are idempotent on the state (a cancelled item is not
cancelled twice, a requeued one is no longer deferred, a known ID with the same payload is
skipped), and the ``command`` record is the commit point: a SIGKILL before it leaves the file,
which the next master applies again with no second effect; after it, the file is acknowledged
from the record. The ledger keeps the outcomes in its snapshots, so compaction keeps them.

With no master running, the command line opens the state directory itself (as the next master
would, :meth:`CampaignState.open <durable_dispatch.campaign.state.CampaignState.open>` applies every
command waiting) and reports that it did; ``drain`` then has nothing to drain.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ..core.decisions import WorkItem
from ..core.events import Cancelled, CommandApplied, RequeuedDeferred, encode
from ..errors import ChangedPayloadError, DurableDispatchError, UsageError
from ..storage import fs as _fs

if TYPE_CHECKING:
    from ..core import Decision, Dispatcher
    from ..storage import DeferJournal, Journal
    from ..tokens import Token


class Steered(Protocol):
    """What applying a command needs of a campaign's state (the facade,
    :class:`~durable_dispatch.campaign.state.CampaignState`, which imports this module)."""

    directory: str
    core: Dispatcher
    journal: Journal
    defer: DeferJournal
    on_cancel: Callable[[str], None] | None

    def submit(self, items: Iterable[WorkItem]) -> int: ...

    def persist(self, decisions: Iterable[Decision]) -> list[Decision]: ...

    def notify(self, hook: Callable[[Any], None], arg: Any) -> None: ...

    def wait_durable(self, seq: int) -> bool: ...

    def defer_behind_ended(self, deps: Iterable[str]) -> None: ...

    def save_snapshot(self, reason: str = "") -> bool: ...


__all__ = [
    "CONTROL_DIR",
    "OPS",
    "POLL_SECONDS",
    "RESCAN_SECONDS",
    "Command",
    "Applied",
    "Inbox",
    "write_command",
    "read_ack",
    "apply_command",
    "apply_waiting",
    "parse_submit_lines",
]

log = logging.getLogger("durable_dispatch.control")

#: The directory of command and acknowledgement files, inside the state directory.
CONTROL_DIR = "control"
#: The commands an operator may send.
OPS = ("cancel", "retry", "drain", "submit")
#: The master looks at ``control/`` at most this often (seconds of its own clock).
POLL_SECONDS = 0.5
#: ... and lists it at least this often, even when its modification time did not change.
RESCAN_SECONDS = 5.0
#: The largest command file read (a ``submit`` carries its items' payloads).
MAX_COMMAND_BYTES = 256 << 20
_CMD, _ACK = ".cmd", ".ack"


@dataclass(frozen=True)
class Command:
    """One operator command, as written to ``control/<id>.cmd``.

    Attributes:
        id: its unique ID (also its file name).
        op: ``cancel``, ``retry``, ``drain`` or ``submit``.
        args: its arguments: ``work_ids`` (cancel, retry), ``all`` (retry), ``items`` (submit:
            ``{"work_id", "payload", "priority"?, "after"?}`` each).
        path: the file it was read from ("" when not read from one).
    """

    id: str
    op: str
    args: Mapping[str, Any] = field(default_factory=dict)
    path: str = ""


@dataclass
class Applied:
    """What applying a command did.

    Attributes:
        command: the command.
        outcome: the JSON outcome (also the acknowledgement's body and the ``command``
            record's), ``{"id", "op", "ok", "message", ...}``.
        stop: ``(rank, token)`` of each dispatch a ``cancel`` stopped in flight: the master
            tells those workers to stop them (an isolated child is killed).
        drain: a ``drain`` asks the running master to drain.
        again: it had been applied before (a crash came before its acknowledgement).
    """

    command: Command
    outcome: dict[str, Any]
    stop: list[tuple[int, Token]] = field(default_factory=list)
    drain: bool = False
    again: bool = False


def control_dir(state_dir: str) -> str:
    """``state_dir``'s command directory."""
    return os.path.join(state_dir, CONTROL_DIR)


def new_command_id() -> str:
    """A unique command ID that sorts by the time it was made."""
    host = "".join(c for c in socket.gethostname().split(".")[0] if c.isalnum())[:16] or "host"
    return f"{time.time_ns():020d}-{host}-{os.getpid()}-{secrets.token_hex(4)}"


def _owner_of(state_dir: str) -> int:
    return os.stat(state_dir).st_uid


def _ensure_control_dir(state_dir: str) -> str:
    """The command directory, created owner-only if missing.

    Raises:
        UsageError: it is a link or not a directory, or of another owner.
    """
    d = control_dir(state_dir)
    try:
        st = os.lstat(d)
    except FileNotFoundError:
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:
            pass
        else:
            _fs.fsync_dir(state_dir)
        st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != _owner_of(state_dir):
        raise UsageError(f"{d} is not a directory of the state directory's owner")
    return d


def write_command(state_dir: str, op: str, args: Mapping[str, Any]) -> Command:
    """Write a command for the master (durable once this returns).

    Raises:
        UsageError: an unknown ``op``, or ``control/`` is not a directory of the owner.
        OSError: the file could not be written (a full disk, say): nothing was sent and no
            file is left behind; the message says so, with the errno of the cause. A failure
            of the last directory fsync, after the file is in place, says that the command may
            still be applied.
    """
    if op not in OPS:
        raise UsageError(f"unknown command {op!r}")
    try:
        d = _ensure_control_dir(state_dir)
    except OSError as e:
        raise _not_sent(op, e, control_dir(state_dir)) from e
    cid = new_command_id()
    body = {
        "id": cid,
        "op": op,
        "args": dict(args),
        "ts": time.time(),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    tmp = os.path.join(d, f".{cid}.tmp")
    path = os.path.join(d, cid + _CMD)
    try:
        _write_atomic(tmp, path, orjson.dumps(body))
    except OSError as e:
        raise _not_sent(op, e, d) from e
    try:
        _fs.fsync_dir(d)
    except OSError as e:
        raise OSError(
            e.errno,
            f"{e.strerror}: the {op} command {cid} is in place but its directory could not be "
            "fsynced; it may still be applied (it waits in the state directory's control/)",
            path,
        ) from e
    return Command(cid, op, dict(args), path)


def _not_sent(op: str, e: OSError, where: str) -> OSError:
    """The error of a command that could not be written: the cause's errno and message, and
    that nothing was sent."""
    why = e.strerror or str(e)
    return OSError(e.errno, f"{why}: the {op} command was not written, nothing was sent", where)


def _write_atomic(tmp: str, path: str, data: bytes) -> None:
    """``data`` at ``path`` through ``tmp`` (fsynced, then renamed); on any failure before
    the rename ``tmp`` is removed, so a refused write leaves no file."""
    fd = _fs.create_exclusive(tmp, 0o600)
    try:
        try:
            _fs.write_all(fd, data)
            _fs.fsync(fd)
        finally:
            _fs.close(fd)
        _fs.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # (the cause is what the caller must see)
            _fs.unlink(tmp)
        raise


def _unlink_quietly(path: str) -> None:
    try:
        _fs.unlink(path)
    except FileNotFoundError:
        pass


def ack_path(state_dir: str, command_id: str) -> str:
    """Where the acknowledgement of ``command_id`` is written."""
    return os.path.join(control_dir(state_dir), command_id + _ACK)


def read_ack(state_dir: str, command_id: str, *, remove: bool = True) -> dict[str, Any] | None:
    """The outcome of ``command_id`` once acknowledged, else None (the acknowledgement is
    removed once read, with ``remove``)."""
    path = ack_path(state_dir, command_id)
    try:
        data = _read_owned(path, _owner_of(state_dir))
    except FileNotFoundError:
        return None
    out = orjson.loads(data)
    if remove:
        _unlink_quietly(path)
    return out if isinstance(out, dict) else {"ok": False, "message": "malformed acknowledgement"}


def pending_commands(state_dir: str) -> list[str]:
    """The IDs of the commands waiting in ``state_dir`` (sorted: the order they apply in)."""
    try:
        names = os.listdir(control_dir(state_dir))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(n[: -len(_CMD)] for n in names if n.endswith(_CMD) and not n.startswith("."))


class _Refused(Exception):
    pass


def _read_owned(path: str, owner: int) -> bytes:
    """The bytes of ``path``, only if it is a regular file (not a link) owned by ``owner``.

    Raises:
        _Refused: it is not. FileNotFoundError: it is gone.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _Refused("a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused("not a regular file")
        if st.st_uid != owner:
            raise _Refused(f"owned by uid {st.st_uid}, not by the state directory's owner")
        if st.st_size > MAX_COMMAND_BYTES:
            raise _Refused(f"{st.st_size} bytes, more than {MAX_COMMAND_BYTES}")
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class Inbox:
    """The master's view of ``control/``: :meth:`due` returns the commands to apply now, at a
    cost that does not show per task (see the module docs). No I/O in ``__init__``."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = state_dir
        self.dir = control_dir(state_dir)
        #: the master's clock: when to look again (the loop compares it before calling
        #: :meth:`due`, so a turn between polls costs one comparison)
        self.next_poll = 0.0
        self._mtime: int | None = None
        self._listed = -RESCAN_SECONDS
        self._refused: set[str] = set()  # logged once each
        self._owner: int | None = None
        #: stat calls and listings so far (for the benchmark and the tests)
        self.stats = {"stats": 0, "listings": 0}

    def due(self, now: float) -> list[Command]:
        """The commands waiting, read and checked, in the order to apply them; [] between
        polls. ``now``: the master's monotonic clock."""
        if now < self.next_poll:
            return []
        self.next_poll = now + POLL_SECONDS
        self.stats["stats"] += 1
        try:
            mtime = os.stat(self.dir).st_mtime_ns
        except OSError:
            return []
        if mtime == self._mtime and now - self._listed < RESCAN_SECONDS:
            return []
        self._mtime, self._listed = mtime, now
        self.stats["listings"] += 1
        return self.read_all()

    def read_all(self) -> list[Command]:
        """Every command file waiting, read and checked (refused ones are logged once and left
        untouched)."""
        out: list[Command] = []
        if self._owner is None:
            try:
                self._owner = _owner_of(self.state_dir)
            except OSError:
                return out
        for cid in pending_commands(self.state_dir):
            path = os.path.join(self.dir, cid + _CMD)
            cmd = self._read(cid, path)
            if cmd is not None:
                out.append(cmd)
        return out

    def _read(self, cid: str, path: str) -> Command | None:
        assert self._owner is not None
        try:
            data = _read_owned(path, self._owner)
        except FileNotFoundError:
            return None
        except (_Refused, OSError) as e:
            if cid not in self._refused:
                self._refused.add(cid)
                log.warning("control: command file %s refused and left untouched: %s", path, e)
            return None
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            body = None
        if (
            not isinstance(body, dict)
            or body.get("id") != cid
            or body.get("op") not in OPS
            or not isinstance(body.get("args", {}), dict)
        ):
            return Command(cid, "invalid", {}, path)
        return Command(cid, body["op"], dict(body.get("args") or {}), path)


# ----------------------------------------------------------------------------- applying
def apply_waiting(state: Steered, *, running: bool) -> list[Applied]:
    """Apply every command waiting in ``state``'s directory (at an open: ``running`` False,
    so a ``drain`` has nothing to drain)."""
    inbox = Inbox(state.directory)
    return [apply_command(state, c, running=running) for c in inbox.read_all()]


def apply_command(state: Steered, cmd: Command, *, running: bool = True) -> Applied:
    """Apply ``cmd`` to the open campaign ``state`` once, journal its outcome durably, then
    acknowledge it and remove its file (see the module docs for the order).

    ``running``: a master is running the campaign (a ``drain`` then drains it).
    """
    led = state.core.ledger
    before = led.commands.get(cmd.id)
    if before is not None:
        done = Applied(cmd, dict(before), again=True)
    else:
        done = _apply(state, cmd, running)
        ev = CommandApplied(cmd.id, cmd.op, done.outcome)
        r = state.journal.append(encode(ev))
        led.apply(ev)
        if not state.wait_durable(r.seq):
            # Not durable: no acknowledgement (the file stays; the next master applies it
            # again, with no second effect) and the outcome says so if it is read.
            log.error("control: command %s applied, but the journal is not durable", cmd.id)
            return done
    log.info("control: command %s (%s): %s", cmd.id, cmd.op, done.outcome.get("message"))
    if cmd.path:
        _acknowledge(state.directory, cmd, done.outcome)
    return done


def _acknowledge(state_dir: str, cmd: Command, outcome: Mapping[str, Any]) -> None:
    d = control_dir(state_dir)
    try:
        tmp = os.path.join(d, f".{cmd.id}.ack.tmp")
        _unlink_quietly(tmp)  # (left by a crash mid-acknowledgement)
        _write_atomic(tmp, ack_path(state_dir, cmd.id), orjson.dumps(dict(outcome)))
        _unlink_quietly(cmd.path)
        _fs.fsync_dir(d)
    except OSError as e:  # the record stands; the command is acknowledged at the next try
        log.error("control: cannot acknowledge command %s: %s", cmd.id, e)


def _ids(cmd: Command) -> list[str]:
    ids = cmd.args.get("work_ids", [])
    if not isinstance(ids, list) or not all(isinstance(w, str) for w in ids):
        raise UsageError("work_ids must be a list of strings")
    return ids


def _apply(state: Steered, cmd: Command, running: bool) -> Applied:
    base: dict[str, Any] = {"id": cmd.id, "op": cmd.op, "ok": True}
    try:
        if cmd.op == "cancel":
            return _cancel(state, cmd, base)
        if cmd.op == "retry":
            return _retry(state, cmd, base)
        if cmd.op == "submit":
            return _submit(state, cmd, base)
        if cmd.op == "drain":
            if running:
                return Applied(cmd, base | {"message": "the master is draining"}, drain=True)
            return Applied(
                cmd,
                base | {"ok": False, "message": "no master was running: nothing to drain"},
            )
        raise UsageError("not a valid command file (a JSON object naming its id and op)")
    except ChangedPayloadError as e:
        return Applied(
            cmd,
            base | {"ok": False, "message": str(e), "work_id": e.work_id, "conflict": True},
        )
    except DurableDispatchError as e:
        return Applied(cmd, base | {"ok": False, "message": str(e)})


def _cancel(state: Steered, cmd: Command, base: dict[str, Any]) -> Applied:
    core, led = state.core, state.core.ledger
    result: dict[str, str] = {}
    done = Applied(cmd, base)
    for wid in _ids(cmd):
        was_deferred = wid in led.deferred
        what, decisions, stop = core.cancel(wid, cmd.id)
        result[wid] = what
        if what.startswith("cancelled"):
            state.journal.append(encode(Cancelled(wid, cmd.id)) | {"ts": time.time()})
            if was_deferred and wid in state.defer:
                state.defer.resolve(wid, "cancelled")
            state.persist(decisions)
            if stop is not None:
                done.stop.append(stop)
            if state.on_cancel is not None:  # (a face that waits on items: futures; told at
                state.notify(state.on_cancel, wid)  # the delivery point, R1)
            # G4: the dependents of a cancelled item are deferred (kind "dependency"),
            # transitively; after the cancel's own record, so a replay finds them in order (and
            # the open's repair defers them if a crash came between), and after the hook, so a
            # dependent future's failure names the cancelled one's as its cause
            state.persist(state.core.ended_without_commit(wid, "cancelled"))
    n = sum(1 for w in result.values() if w.startswith("cancelled"))
    left = {w: why for w, why in result.items() if not why.startswith("cancelled")}
    done.outcome |= {
        "work_ids": result,
        "cancelled": n,
        "ok": not any(why == "unknown" for why in left.values()),
        "message": _message(f"{n} cancelled", left),
    }
    return done


def _retry(state: Steered, cmd: Command, base: dict[str, Any]) -> Applied:
    core, led = state.core, state.core.ledger
    ids = _ids(cmd)
    sets = cmd.args.get("sets") or (["deferred", "cancelled"] if cmd.args.get("all") else [])
    if sets:  # ``retry --deferred``, ``--cancelled``; ``--all``: both
        ids = [
            *(led.deferred if "deferred" in sets else ()),
            *(led.cancelled if "cancelled" in sets else ()),
        ]
    result: dict[str, str] = {}
    for wid in ids:
        what = core.retry_item(wid)
        result[wid] = what
        if what == "requeued":
            state.journal.append(encode(RequeuedDeferred(wid)))
            if wid in state.defer:
                state.defer.resolve(wid, "requeued")
    # G4: an item put back to wait for a dependency that is itself deferred or cancelled (and
    # was not retried with it) is deferred again at once, naming it, as the next open would
    for wid in [w for w, what in result.items() if what == "requeued" and w in led.waiting]:
        item = led.items.get(wid)
        ended = [d for d in item.after if d in led.deferred or d in led.cancelled] if item else []
        if ended:
            why = "deferred" if ended[0] in led.deferred else "cancelled"
            state.defer_behind_ended(ended[:1])
            result[wid] = f"deferred again: its dependency {ended[0]!r} is {why} (retry it too)"
    n = sum(1 for w in result.values() if w == "requeued")
    left = {w: why for w, why in result.items() if why != "requeued"}
    if n or any(why.startswith("deferred again") for why in left.values()):
        state.save_snapshot(f"retry command {cmd.id}")
    out = base | {
        "work_ids": result,
        "requeued": n,
        "ok": not any(why == "unknown" for why in left.values()),
        "message": _message(f"{n} back to pending", left),
    }
    return Applied(cmd, out)


def _submit(state: Steered, cmd: Command, base: dict[str, Any]) -> Applied:
    raw = cmd.args.get("items", [])
    if not isinstance(raw, list):
        raise UsageError("items must be a list")
    items = [_work_item(i, n) for n, i in enumerate(raw, 1)]
    added = state.submit(items)
    out = base | {
        "submitted": len(items),
        "added": added,
        "known": len(items) - added,
        "message": f"{added} added, {len(items) - added} already known with the same payload",
    }
    return Applied(cmd, out)


def _work_item(rec: Any, line: int) -> WorkItem:
    fields = _item_fields(rec, line)
    after = fields.pop("after", None)
    if after is not None:
        fields["after"] = tuple(after)  # G4: the item waits for these work IDs' commits
    return WorkItem(**fields)


def _item_fields(rec: Any, line: int) -> dict[str, Any]:
    """The fields of one ``submit`` line (``{"work_id", "payload", "priority"?, "after"?}``).

    Raises:
        UsageError: naming the line and what is wrong.
    """
    if not isinstance(rec, dict):
        raise UsageError(f"line {line}: not a JSON object")
    extra = set(rec) - {"work_id", "payload", "priority", "after"}
    if extra:
        raise UsageError(f"line {line}: unknown member(s) {sorted(extra)}")
    wid = rec.get("work_id")
    if not isinstance(wid, str) or not wid:
        raise UsageError(f"line {line}: work_id must be a non-empty string")
    if "payload" not in rec:
        raise UsageError(f"line {line}: payload is missing")
    prio = rec.get("priority", 0)
    if type(prio) is not int:
        raise UsageError(f"line {line}: priority must be an integer")
    out: dict[str, Any] = {"work_id": wid, "payload": rec["payload"], "priority": prio}
    after = rec.get("after")
    if after is not None:
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            raise UsageError(f"line {line}: after must be a list of work IDs (strings)")
        out["after"] = after
    return out


def parse_submit_lines(lines: Iterable[bytes]) -> list[dict[str, Any]]:
    """The items of a ``submit`` file (JSON Lines; blank lines skipped), checked.

    Raises:
        UsageError: a line is not JSON or not a valid item (naming its number), or a work ID
            is named twice with different payloads.
    """
    out: list[dict[str, Any]] = []
    seen: dict[str, Any] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise UsageError(f"line {n}: not JSON ({e})") from None
        item = _item_fields(rec, n)
        wid = item["work_id"]
        if wid in seen and seen[wid] != item["payload"]:
            raise ChangedPayloadError(
                f"line {n}: work ID {wid!r} is named twice with different payloads",
                work_id=wid,
            )
        seen[wid] = item["payload"]
        out.append(item)
    return out


def _message(done: str, left: Mapping[str, str]) -> str:
    if not left:
        return done
    by: dict[str, list[str]] = {}
    for w, why in left.items():
        by.setdefault(why, []).append(w)
    notes = "; ".join(
        f"{why}: {', '.join(ws[:10])}{' ...' if len(ws) > 10 else ''}" for why, ws in by.items()
    )
    return f"{done}; left alone ({notes})"


def command_ids(commands: Sequence[Command]) -> list[str]:
    """The IDs of ``commands`` (a helper for logs)."""
    return [c.id for c in commands]
