"""Pickles on disk, authenticated (S7): the state directory's secret, and sealed values.

The futures executor keeps calls and results as pickles, and a pickle runs code when it is
loaded. So every pickle it writes carries an HMAC-SHA256 tag keyed by a secret of the state
directory (``futures.key``: 32 random bytes, mode 0600, created with the directory's first
executor, fsynced with its directory), and nothing is unpickled before its tag verifies. A file
forged by someone who cannot read the key, or a journal copied from another directory, is a
:class:`~durable_dispatch.errors.ValueCorruptError`, never a load. The key is refused unless it
is a regular file of this user with no permission for anyone else. The CLI never unpickles.

A tag covers what the value is (``call`` or a result's ``ok``/``raised``), the work ID, the
call's digest and the SHA-256 of the pickle, so a sealed value cannot be moved to another task.

Results over :data:`INLINE_BYTES` (pickled) are not kept in the journal record: the worker writes
them to ``values/<sha256>`` in the state directory (exclusive create, fsync, rename, fsync of the
directory, before it answers), and the record keeps the reference and the tag. The state
directory must then be on a filesystem every rank sees, as a cluster's shared scratch is.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pickle
import re
import reprlib
import stat
from typing import Any

from ..errors import StorageError, ValueCorruptError
from ..storage import fs
from ..storage.rewrite import replace_file

__all__ = ["KEY_FILE", "VALUES_DIR", "INLINE_BYTES", "load_or_create_key", "Sealer"]

KEY_FILE = "futures.key"
VALUES_DIR = "values"
INLINE_BYTES = 512 << 10  # a pickled result larger than this goes to the side store
_KEY_BYTES = 32


def load_or_create_key(directory: str) -> bytes:
    """The state directory's secret, created (exclusively, 0600, fsynced) when missing.

    Raises:
        StorageError: the key file is not a regular file of this user readable by no one else,
            or it has the wrong size, or it cannot be read or created.
    """
    path = os.path.join(directory, KEY_FILE)
    try:
        fd = fs.create_exclusive(path, 0o600)
    except FileExistsError:
        return _read_key(path)
    except OSError as e:
        raise StorageError(f"cannot create the futures key: {e}", path=path, op="open") from e
    try:
        key = os.urandom(_KEY_BYTES)
        fs.write_all(fd, key)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.fsync_dir(directory)
    return key


def _read_key(path: str) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise StorageError(f"cannot open the futures key: {e}", path=path, op="open") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StorageError("the futures key is not a regular file", path=path, op="open")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise StorageError(
                "the futures key must belong to this user and be readable by no one else "
                f"(mode 0600); found uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}",
                path=path,
                op="open",
            )
        key = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != _KEY_BYTES:
        raise StorageError(f"the futures key has {len(key)} bytes, not 32", path=path, op="open")
    return key


class Sealer:
    """Seals and opens the pickles of one state directory with its key (see the module docs).

    Args:
        key: the directory's secret (:func:`load_or_create_key`).
        directory: the state directory (for the side store).
    """

    def __init__(self, key: bytes, directory: str) -> None:
        self._key = key
        self.directory = directory

    @property
    def key(self) -> bytes:
        """The directory's secret (the workers seal and open with it too)."""
        return self._key

    def tag(self, what: str, work_id: str, digest: str, data: bytes) -> str:
        """The HMAC tag (hex) of a pickle ``data``, sealed as ``what`` of ``work_id``."""
        msg = b"\0".join(
            (what.encode(), work_id.encode(), digest.encode(), hashlib.sha256(data).digest())
        )
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    # ------------------------------------------------------------------ calls
    def seal_call(
        self, work_id: str, name: str, digest: str, call: Any, chunk: int = 0
    ) -> dict[str, Any]:
        """A task's payload: ``{"fn", "args", "d", "call", "tag"}`` (JSON; ``call`` a base64
        pickle; ``args`` a short text preview of the arguments, for ``durable-dispatch joblog``,
        which never unpickles). ``chunk``: the call is a chunk of a ``map``, ``(fn, calls)``
        with that many calls (``calls`` a tuple of argument tuples), and the payload says so
        (``"chunk"``: the count; ``args`` previews its first call)."""
        data = pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL)
        if chunk:
            fn, calls = call
            preview = f"{chunk} calls: {args_preview((fn, calls[0], {}))}, ..."
        else:
            preview = args_preview(call)
        out: dict[str, Any] = {
            "fn": name,
            "args": preview,
            "d": digest,
            "call": base64.b64encode(data).decode(),
            "tag": self.tag("chunk" if chunk else "call", work_id, digest, data),
        }
        if chunk:
            out["chunk"] = chunk
        return out

    def check_call(self, work_id: str, payload: Any) -> bytes:
        """The pickle of a payload whose tag verifies (not loaded).

        Raises:
            ValueCorruptError: the payload is malformed or its tag does not verify.
        """
        try:
            data = base64.b64decode(payload["call"], validate=True)
            digest, tag = payload["d"], payload["tag"]
            what = "chunk" if payload.get("chunk") else "call"  # (a chunk's tag says so)
            ok = hmac.compare_digest(self.tag(what, work_id, digest, data), tag)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueCorruptError(
                f"the stored call of {work_id} is malformed: {e}", path=self.directory
            ) from e
        if not ok:
            raise ValueCorruptError(
                f"the stored call of {work_id} fails its HMAC tag: it was not written with this "
                "state directory's key (forged or copied from another directory); not unpickled",
                path=self.directory,
                reason="tag",
            )
        return data

    def open_call(self, work_id: str, payload: Any) -> Any:
        """The call ``(fn, args, kwargs)`` of a payload, unpickled once its tag verifies."""
        return pickle.loads(self.check_call(work_id, payload))

    # ---------------------------------------------------------------- results
    def seal_result(
        self, work_id: str, digest: str, how: str, value: Any, tb: str | None = None
    ) -> dict[str, Any]:
        """A task's result as JSON: ``how`` is ``"ok"`` (``value`` returned) or ``"raised"``
        (``value`` the exception, ``tb`` its traceback text). A pickle over
        :data:`INLINE_BYTES` is written to the side store first (fsynced)."""
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        out: dict[str, Any] = {"d": digest, "how": how}
        if len(data) > INLINE_BYTES:
            out["blob"] = self._store(data)
            out["size"] = len(data)
        else:
            out["v"] = base64.b64encode(data).decode()
        if tb is not None:
            out["tb"] = tb
        out["tag"] = self.tag(how, work_id, digest, data)
        return out

    def open_result(self, work_id: str, result: Any) -> tuple[str, Any, str | None]:
        """``(how, value, traceback)`` of a sealed result, unpickled once its tag verifies.

        Raises:
            ValueCorruptError: see :meth:`check_result`.
        """
        how, data = self.check_result(work_id, result)
        tb = result.get("tb")
        return how, pickle.loads(data), tb if isinstance(tb, str) else None

    def check_result(self, work_id: str, result: Any) -> tuple[str, bytes]:
        """``(how, pickle)`` of a sealed result whose tag verifies (not loaded).

        Raises:
            ValueCorruptError: it is malformed, its side file is missing or altered, or its tag
                does not verify.
        """
        try:
            how, digest, tag = result["how"], result["d"], result["tag"]
            if how not in ("ok", "raised"):
                raise ValueError(f"unknown outcome {how!r}")
            data = (
                self._load(result["blob"])
                if "blob" in result
                else base64.b64decode(result["v"], validate=True)
            )
            ok = hmac.compare_digest(self.tag(how, work_id, digest, data), tag)
        except (KeyError, TypeError, ValueError, OSError) as e:
            raise ValueCorruptError(
                f"the stored result of {work_id} is unreadable: {e}", path=self.directory
            ) from e
        if not ok:
            raise ValueCorruptError(
                f"the stored result of {work_id} fails its HMAC tag: it was not written with "
                "this state directory's key (forged or copied from another directory); not "
                "unpickled",
                path=self.directory,
                reason="tag",
            )
        return how, data

    # ------------------------------------------------------------- side store
    def _store(self, data: bytes) -> str:
        name = hashlib.sha256(data).hexdigest()
        folder = os.path.join(self.directory, VALUES_DIR)
        path = os.path.join(folder, name)
        if os.path.exists(path):
            return name
        fs.makedirs(folder)
        replace_file(path, f"{path}.{os.getpid()}.tmp", [data])
        return name

    def _load(self, name: Any) -> bytes:
        if (
            not isinstance(name, str)
            or len(name) != 64
            or not all(c in "0123456789abcdef" for c in name)
        ):
            raise ValueError(f"bad side-file name {name!r}")
        path = os.path.join(self.directory, VALUES_DIR, name)
        with fs.open_read(path) as f:
            data = f.read()
        if hashlib.sha256(data).hexdigest() != name:
            raise ValueError(f"side file {name} does not match its digest")
        return data


class _Short(reprlib.Repr):
    """``reprlib`` cut short, object addresses removed (see :func:`args_preview`)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = 24
        self.maxlist = self.maxtuple = self.maxdict = 4
        self.maxlevel = 2

    def repr_instance(self, x: Any, level: int) -> str:
        text = _ADDRESS.sub("", repr(x))
        return text if len(text) <= 24 else text[:10] + "..." + text[-11:]


def args_preview(call: Any, limit: int = 80) -> str:
    """A short text of a call's arguments (``reprlib``, object addresses removed so that the
    same call gives the same text in every run), cut at ``limit`` characters."""
    try:
        _fn, args, kwargs = call
        r = _Short()
        parts = [r.repr(a) for a in args] + [f"{k}={r.repr(v)}" for k, v in kwargs.items()]
    except Exception:  # noqa: BLE001 - a preview must never stop a submit
        return "?"
    text = ", ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
