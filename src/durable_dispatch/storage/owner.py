"""Who writes a state directory: the owner record, for filesystems whose locks do not lock.

Theory of operation. A master (and an offline writer such as ``compact``) *claims* the state
directory before it reads anything, beside its ``flock`` (on the journal file itself), which
still does the work where locks work. The claim is a small JSON file
``master.owner.<generation>`` naming the owner: host name, pid, the process's start time, the
kernel's boot ID
(``/proc/sys/kernel/random/boot_id``), its PID namespace, and a heartbeat (a counter and the wall
time) that a thread of the owner rewrites every ``stale / 8`` seconds. The newest generation
names the owner. A file is created under a unique temporary name and hard-linked to its
generation's name, which fails if that name exists, on a local disk, NFS and Lustre alike:
of two masters that claim one generation at once, exactly one succeeds.

A newcomer reads the newest record and decides:

* ``released`` (its owner closed cleanly), or no record: claim the next generation;
* on this host (same boot ID and PID namespace): the owner is alive while its pid runs with the
  recorded start time (this process counts only if it holds the claim now); dead otherwise. A
  dead owner is taken over at once (a SIGKILLed job, a crashed node that came back);
* on this host name with another boot ID, and a last heartbeat older than this boot: the
  machine rebooted since, dead at once;
* elsewhere (another node, or a record that cannot be read): watched, on the newcomer's own
  monotonic clock, for up to the **dead-owner bound** (:func:`stale_seconds`: 20 s by default,
  ``DURABLE_DISPATCH_OWNER_STALE`` seconds; the larger of the newcomer's and the owner's). A
  heartbeat that moves means alive: the newcomer is refused at once with :class:`LockHeldError`
  naming the owner's host and pid. A heartbeat that does not move for the whole bound means
  dead: the newcomer claims the next generation. Clocks of two nodes are never compared.

The owner keeps checking that it still owns the directory: before each flush of a journal in it
(one ``stat``: does a newer generation exist?) and in its heartbeat thread (the whole picture).
An owner that finds a newer claim is *fenced*: its journals refuse to write from then on and
raise :class:`LockHeldError`, so two masters never both write. A live owner loses its claim only
if its heartbeat thread could not rewrite the record for a whole bound (the filesystem refused
metadata writes that long, or the process was stopped): it then stops writing before its next
flush. A claim and a release are fsynced before they are linked or renamed into place (a crash
never leaves them torn, so a resume judges them at once); heartbeats are not (an fsync that
stalls for minutes must not stop them): after a power loss a heartbeat may be lost or torn, and a
torn record is watched for the bound like one from another node.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import LockHeldError
from . import fs

__all__ = [
    "OWNER_PREFIX",
    "STALE_ENV",
    "DEFAULT_STALE_SECONDS",
    "Owner",
    "OwnerClaim",
    "stale_seconds",
    "claim",
    "read_owner",
    "running_owner",
    "guard_for",
    "hostname",
]

log = logging.getLogger("durable_dispatch.owner")

#: Owner records are ``master.owner.<generation>`` in the state directory.
OWNER_PREFIX = "master.owner."
#: The environment variable that sets the dead-owner bound (seconds).
STALE_ENV = "DURABLE_DISPATCH_OWNER_STALE"
#: The default dead-owner bound (seconds): how long a newcomer on another node watches a silent
#: owner's heartbeat before it takes over.
DEFAULT_STALE_SECONDS = 20.0
_MIN_STALE, _MAX_STALE = 1.0, 3600.0
_MAX_RECORD = 4096


def stale_seconds(environ: Any = None) -> float:
    """The dead-owner bound in force: ``DURABLE_DISPATCH_OWNER_STALE`` seconds (1 to 3600;
    unparsable values fall back to 20 with a warning), or :data:`DEFAULT_STALE_SECONDS`."""
    env = os.environ if environ is None else environ
    raw = env.get(STALE_ENV)
    if raw is None:
        return DEFAULT_STALE_SECONDS
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not v == v or v in (float("inf"), float("-inf")):
        log.warning("%s=%r is not a number of seconds; using %g", STALE_ENV, raw, 20.0)
        return DEFAULT_STALE_SECONDS
    return min(_MAX_STALE, max(_MIN_STALE, v))


def _clamp(stale: float) -> float:
    """A bound read from a record (untrusted bytes), within 1 to 3600 s (NaN: the default)."""
    if not stale == stale:
        return DEFAULT_STALE_SECONDS
    return min(_MAX_STALE, max(_MIN_STALE, stale))


@dataclass(frozen=True)
class Owner:
    """What an owner record says.

    Attributes:
        generation: the record's generation (its file name's suffix).
        host: the owner's host name.
        pid: its process ID.
        boot_id: its kernel's boot ID.
        pidns: its PID namespace (the inode of ``/proc/self/ns/pid``; 0 if unknown).
        start: its process's start time (clock ticks since boot; 0 if unknown).
        nonce: a random token of this claim.
        beat: the heartbeat counter.
        ts: the wall time of the last heartbeat (``time.time()`` on the owner's host).
        started: the wall time of the claim.
        stale: the owner's dead-owner bound (seconds); it beats every ``stale / 8``.
        released: the owner let go of the directory (closed cleanly).
    """

    generation: int
    host: str
    pid: int
    boot_id: str
    pidns: int
    start: int
    nonce: str
    beat: int = 0
    ts: float = 0.0
    started: float = 0.0
    stale: float = DEFAULT_STALE_SECONDS
    released: bool = False

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dict(vars(self))


# ------------------------------------------------------------------ who am I
def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("ascii", "replace").strip()
    except OSError:
        return ""


def _boot_id() -> str:
    return _read_text("/proc/sys/kernel/random/boot_id")


def _pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _start_of(pid: int) -> int:
    """A process's start time in clock ticks since boot (0 if unknown)."""
    return _stat_of(pid)[1]


def _stat_of(pid: int) -> tuple[str, int]:
    """A process's state letter (``Z``: a zombie, dead but not yet reaped) and start time
    (``("", 0)`` if unknown)."""
    text = _read_text(f"/proc/{pid}/stat")
    try:
        fields = text.rsplit(")", 1)[1].split()
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return "", 0


def _booted_at() -> float:
    """Wall time of this kernel's boot (0 if unknown)."""
    try:
        return time.time() - float(_read_text("/proc/uptime").split()[0])
    except (IndexError, ValueError):
        return 0.0


def hostname() -> str:
    """This host's name, as owner records and lock refusals give it."""
    return socket.gethostname()


def _identity() -> dict[str, Any]:
    pid = os.getpid()
    return {
        "host": hostname(),
        "pid": pid,
        "boot_id": _boot_id(),
        "pidns": _pidns(),
        "start": _start_of(pid),
    }


# ------------------------------------------------------------------ records on disk
def _path(d: str, gen: int) -> str:
    return os.path.join(d, f"{OWNER_PREFIX}{gen}")


def _generations(d: str, listing: list[str] | None = None) -> list[int]:
    """The owner records' generations in ``d``, oldest first; ``listing`` (a list to fill)
    receives the directory's names too (None when the directory is missing)."""
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    if listing is not None:
        listing[:] = names
    gens = []
    for n in names:
        if n.startswith(OWNER_PREFIX):
            tail = n[len(OWNER_PREFIX) :]
            if tail.isdigit():
                gens.append(int(tail))
    return sorted(gens)


def _read(d: str, gen: int) -> Owner | None:
    """The record of generation ``gen``; None when it is missing, unreadable or malformed."""
    path = _path(d, gen)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        data = os.read(fd, _MAX_RECORD + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        v = orjson.loads(data)
        return Owner(
            generation=gen,
            host=str(v["host"]),
            pid=int(v["pid"]),
            boot_id=str(v["boot_id"]),
            pidns=int(v.get("pidns", 0)),
            start=int(v.get("start", 0)),
            nonce=str(v["nonce"]),
            beat=int(v.get("beat", 0)),
            ts=float(v.get("ts", 0.0)),
            started=float(v.get("started", 0.0)),
            stale=float(v.get("stale", DEFAULT_STALE_SECONDS)),
            released=bool(v.get("released", False)),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


def _encode(o: Owner) -> bytes:
    body = o.as_dict()
    body.pop("generation")
    return orjson.dumps(body) + b"\n"


def _write_tmp(d: str, o: Owner, *, sync: bool = True) -> str:
    tmp = os.path.join(d, f".owner-{secrets.token_hex(8)}.tmp")
    fd = fs.create_exclusive(tmp, 0o600)
    try:
        fs.write_all(fd, _encode(o))
        if sync:
            fs.fsync(fd)  # a claim or a release is never torn by a crash: it is judged at once
    finally:
        fs.close(fd)
    return tmp


def _try_create(d: str, o: Owner) -> bool:
    """Create generation ``o.generation``'s record; False if that generation is taken."""
    tmp = _write_tmp(d, o)
    try:
        try:
            fs.link(tmp, _path(d, o.generation))
        except FileExistsError:
            return False
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            # No hard links here (some FUSE and SMB mounts): an exclusive create of the name
            # itself, then its bytes (a reader that sees it empty watches it meanwhile).
            try:
                fd = fs.create_exclusive(_path(d, o.generation), 0o600)
            except FileExistsError:
                return False
            try:
                fs.write_all(fd, _encode(o))
            finally:
                fs.close(fd)
    finally:
        try:
            fs.unlink(tmp)
        except OSError:
            pass
    mine = _read(d, o.generation)  # NFS may report a link it made as failed, or the reverse
    return mine is not None and mine.nonce == o.nonce


def _rewrite(d: str, o: Owner, *, sync: bool = True) -> None:
    tmp = _write_tmp(d, o, sync=sync)
    try:
        fs.replace(tmp, _path(d, o.generation))
    except BaseException:
        try:
            fs.unlink(tmp)
        except OSError:
            pass
        raise


# ------------------------------------------------------------------ liveness
_held: dict[str, OwnerClaim] = {}  # realpath -> the claim this process holds
_held_lock = threading.Lock()


def _key(d: str) -> str:
    return os.path.realpath(d)


def _holding(d: str, key: str | None = None) -> OwnerClaim | None:
    """The claim this process holds on ``d`` (``key``: its real path, if known) on the
    filesystem calls reach now (a claim made on a fake filesystem that is gone is forgotten)."""
    k = _key(d) if key is None else key
    with _held_lock:
        c = _held.get(k)
        if c is None:
            return None
        if not fs.reaches(c.filesystem):
            if not fs.comes_back(c.filesystem):
                del _held[k]
            return None
        return c


def _local(o: Owner, me: dict[str, Any]) -> bool:
    return bool(o.boot_id) and o.boot_id == me["boot_id"] and o.pidns == me["pidns"]


def _alive_here(o: Owner, d: str, me: dict[str, Any]) -> bool:
    """For an owner on this host: its process runs (this one only while it holds the claim)."""
    if o.pid == me["pid"] and (not o.start or o.start == me["start"]):
        c = _holding(d)
        return c is not None and c.nonce == o.nonce and not c.released
    try:
        os.kill(o.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    state, start = _stat_of(o.pid)
    if state in ("Z", "X"):
        return False  # killed, not yet reaped by its parent: it writes nothing more
    return not o.start or start in (0, o.start)


def _verdict(o: Owner, d: str, me: dict[str, Any]) -> str:
    """``"alive"``, ``"dead"`` or ``"watch"`` (judged by its heartbeat) for a record."""
    if o.released:
        return "dead"
    if _local(o, me):
        return "alive" if _alive_here(o, d, me) else "dead"
    if o.host == me["host"] and o.boot_id != me["boot_id"] and o.ts and o.ts < _booted_at():
        return "dead"  # this machine rebooted after the owner's last heartbeat
    return "watch"


def _refusal(o: Owner, path: str, how: str) -> LockHeldError:
    return LockHeldError(
        f"a master holds this state directory ({how}): host {o.host}, pid {o.pid}",
        path=path,
        host=o.host,
        pid=o.pid,
    )


def read_owner(directory: str | os.PathLike[str]) -> Owner | None:
    """The newest owner record of ``directory`` (released or not), or None. Creates and
    changes nothing."""
    d = os.fspath(directory)
    gens = _generations(d)
    return _read(d, gens[-1]) if gens else None


def running_owner(directory: str | os.PathLike[str]) -> Owner | None:
    """The owner of ``directory`` if it is running, as far as a reader can tell without
    waiting: on this host its process runs; elsewhere its last heartbeat is younger than its
    dead-owner bound (by this host's clock). Creates and changes nothing."""
    d = os.fspath(directory)
    o = read_owner(d)
    if o is None:
        return None
    v = _verdict(o, d, _identity())
    if v == "alive":
        return o
    if v == "watch" and time.time() - o.ts < max(_clamp(o.stale), stale_seconds()):
        return o
    return None


# ------------------------------------------------------------------ the claim
class OwnerClaim:
    """This process's claim on a state directory: heartbeats, checks, release.

    Made by :func:`claim`. While held, every journal opened in the directory checks
    :meth:`check` before each flush.
    """

    def __init__(self, directory: str, record: Owner, key: str | None = None) -> None:
        self.directory = directory
        self.record = record
        self.nonce = record.nonce
        self.released = False
        self.lost: LockHeldError | None = None
        #: the filesystem the claim was made on (see :func:`fs.filesystem`)
        self.filesystem = fs.filesystem()
        #: the directory's names as the claim found them, before it linked its record (what an
        #: open that holds the directory reads instead of listing it again: nothing else
        #: writes it from then on, as the one writer); None when unknown
        self.listing: frozenset[str] | None = None
        self._key = _key(directory) if key is None else key  # its real path
        self._next = _path(directory, record.generation + 1)
        self._stop = threading.Event()
        self._rw = threading.Lock()
        #: the released record, written and fsynced under a temporary name (prepare_release)
        self._prepared: tuple[str, Owner] | None = None
        self._thread = threading.Thread(
            target=self._beat_loop, name=f"owner-heartbeat:{directory}", daemon=True
        )

    @property
    def interval(self) -> float:
        """Seconds between heartbeats."""
        return self.record.stale / 8

    def check(self) -> None:
        """Raise :class:`LockHeldError` if another master claimed the directory since (one
        ``stat``); a journal calls this before each flush.

        Raises:
            LockHeldError: the claim was lost (it names the new owner's host and pid).
        """
        if self.lost is not None:
            raise self.lost
        try:
            os.stat(self._next)
        except FileNotFoundError:
            return
        except OSError:
            return  # cannot tell now: the heartbeat thread looks again
        self._lose()
        assert self.lost is not None
        raise self.lost

    def _lose(self) -> None:
        newer = read_owner(self.directory)
        who = newer if newer is not None and newer.nonce != self.nonce else None
        if who is not None:
            self.lost = _refusal(who, self.directory, "it was taken over from this process")
        else:
            self.lost = LockHeldError(
                "this process lost its claim on the state directory", path=self.directory
            )
        log.error("owner: %s; no more writes from this process", self.lost)

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.interval):
            if not fs.reaches(self.filesystem):
                if not fs.comes_back(self.filesystem):
                    return  # a fake filesystem that is gone: never write the real one
                continue
            try:
                self.heartbeat()
            except OSError as e:
                log.warning("owner: heartbeat of %s failed: %s", self.directory, e)

    def heartbeat(self) -> None:
        """Check the claim and rewrite the record with the next heartbeat (the thread does it)."""
        with self._rw:
            if self.released or self.lost is not None:
                return
            gens = _generations(self.directory)
            mine = self.record.generation
            if gens and gens[-1] > mine:
                self._lose()
                return
            if mine not in gens:
                cur = None
            else:
                cur = _read(self.directory, mine)
            if cur is not None and cur.nonce != self.nonce:
                self._lose()
                return
            self.record = _replace(self.record, beat=self.record.beat + 1, ts=time.time())
            # Not fsynced: a filesystem that stalls its fsyncs for minutes must not stop the
            # heartbeat (a crash may tear it: the owner is dead then anyway).
            _rewrite(self.directory, self.record, sync=False)

    def prepare_release(self) -> None:
        """Write and fsync the released record now, under a temporary name, so that
        :meth:`release` only renames it into place: a closing master does this beside its
        last snapshot (the fsync overlaps that snapshot's instead of following it).
        Changes nothing a reader sees; a failure is logged and :meth:`release` writes the
        record itself."""
        with self._rw:
            if self.released or self.lost is not None or self._prepared is not None:
                return
            rec = _replace(self.record, released=True, ts=time.time())
            try:
                self._prepared = (_write_tmp(self.directory, rec), rec)
            except OSError as e:
                log.warning("owner: could not prepare the release of %s: %s", self.directory, e)

    def release(self) -> None:
        """Let go: the record says ``released`` (the next master claims at once)."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._rw:
            prepared, self._prepared = self._prepared, None
            used = False
            try:
                used = self._release(prepared)
            finally:
                if prepared is not None and not used:
                    try:
                        fs.unlink(prepared[0])
                    except OSError:
                        pass

    def _release(self, prepared: tuple[str, Owner] | None) -> bool:
        """Mark the record released; True when ``prepared`` was renamed into place."""
        if self.released:
            return False
        self.released = True
        with _held_lock:
            if _held.get(self._key) is self:
                del _held[self._key]
        if self.lost is not None:
            return False
        try:
            cur = _read(self.directory, self.record.generation)
            if cur is not None and cur.nonce == self.nonce:
                if prepared is not None:  # written and fsynced already: into place
                    fs.replace(prepared[0], _path(self.directory, self.record.generation))
                    self.record = prepared[1]
                    return True
                self.record = _replace(self.record, released=True, ts=time.time())
                _rewrite(self.directory, self.record)
        except OSError as e:
            log.warning("owner: could not mark %s released: %s", self.directory, e)
        return False

    def __repr__(self) -> str:
        return f"<OwnerClaim {self.directory!r} generation={self.record.generation}>"


def _replace(o: Owner, **kw: Any) -> Owner:
    v = o.as_dict()
    v.update(kw)
    return Owner(**v)


def claim(
    directory: str | os.PathLike[str],
    *,
    stale: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    real_path: str | None = None,
) -> OwnerClaim:
    """Claim ``directory`` for this process (the caller took its ``flock`` first).

    Waits at most the dead-owner bound, and only when the newest record names an owner on
    another host (or cannot be read): see the module docs.

    Args:
        directory: the state directory (it exists).
        stale: the dead-owner bound (default: :func:`stale_seconds`).
        sleep: how to wait between two looks at a watched heartbeat.
        real_path: the directory's real path (``os.path.realpath``) when the caller knows it
            already (it just made the directory): spares a lookup of each of its components.

    Returns:
        The claim; its heartbeat thread runs until :meth:`OwnerClaim.release`.

    Raises:
        LockHeldError: a live owner holds the directory (its host and pid are named).
        OSError: the record cannot be written (the caller turns it into a StorageError).
    """
    d = os.fspath(directory)
    bound = stale_seconds() if stale is None else min(_MAX_STALE, max(_MIN_STALE, stale))
    me = _identity()
    key = _key(d) if real_path is None else real_path  # once (a lookup per component)
    mine = _holding(d, key)
    if mine is not None and not mine.released:
        raise _refusal(mine.record, d, "this process holds it")
    listing: list[str] = []
    for _attempt in range(64):
        gens = _generations(d, listing)
        top = gens[-1] if gens else 0
        cur = _read(d, top) if gens else None
        if cur is not None or gens:
            verdict = _verdict(cur, d, me) if cur is not None else "watch"
            if verdict == "alive":
                assert cur is not None
                raise _refusal(cur, d, "its process runs on this host")
            if verdict == "watch":
                verdict = _watch(d, top, cur, bound, sleep)
                if verdict == "retry":
                    continue
                if verdict == "alive":
                    cur = _read(d, top) or cur
                    if cur is None:
                        raise LockHeldError(
                            "a master holds this state directory (its owner record is being "
                            "rewritten)",
                            path=_path(d, top),
                        )
                    raise _refusal(cur, d, "its heartbeat moves")
            if cur is not None and not cur.released:
                log.warning(
                    "owner: taking over %s from a dead owner (host %s, pid %d, generation %d)",
                    d,
                    cur.host,
                    cur.pid,
                    top,
                )
        now = time.time()
        rec = Owner(
            generation=top + 1,
            nonce=secrets.token_hex(16),
            ts=now,
            started=now,
            stale=bound,
            **me,
        )
        if not _try_create(d, rec):
            continue  # another newcomer took this generation: judge it
        c = OwnerClaim(d, rec, key)
        c.listing = frozenset(listing)
        with _held_lock:
            _held[c._key] = c
        for g in gens:  # the older records: best effort
            try:
                fs.unlink(_path(d, g))
            except OSError:
                pass
        c._thread.start()
        return c
    raise LockHeldError("the state directory's owner record keeps changing", path=d)


def _watch(
    d: str, gen: int, first: Owner | None, bound: float, sleep: Callable[[float], None]
) -> str:
    """Watch generation ``gen``'s heartbeat for up to the bound: ``"alive"`` (it moved),
    ``"dead"`` (it did not), ``"retry"`` (a newer generation or a release appeared)."""
    wait = max(bound, _clamp(first.stale) if first is not None else 0.0)
    seen = (first.nonce, first.beat) if first is not None else None
    t0 = time.monotonic()
    log.info("owner: watching the heartbeat of %s for up to %.0fs", d, wait)
    while True:
        left = wait - (time.monotonic() - t0)
        if left <= 0:
            return "dead"
        sleep(min(0.25, left))
        gens = _generations(d)
        if gens and gens[-1] != gen:
            return "retry"
        cur = _read(d, gen)
        if cur is None:
            if not gens:
                return "retry"
            continue
        if cur.released:
            return "retry"
        if seen is None:
            seen = (cur.nonce, cur.beat)
            continue
        if (cur.nonce, cur.beat) != seen:
            return "alive"


def guard_for(path: str) -> Callable[[], None] | None:
    """The check a journal at ``path`` runs before each flush: the claim of its directory
    held by this process, or None when this process holds none."""
    c = _holding(os.path.dirname(os.path.abspath(path)))
    return c.check if c is not None else None
