"""Wire protocol between master and workers: tags and JSON message bodies (no pickle).

Every message is one MPI message of raw bytes (``MPI.BYTE``) holding one JSON object encoded by
orjson. The master receives with ``ANY_SOURCE``/``ANY_TAG``, so MPI's non-overtaking rule delivers
each worker's messages in the order it sent them (RESULT before its READY).

| tag | direction | body |
| --- | --- | --- |
| WORK | master -> worker | ``{"token", "work_id", "payload", "attempt"}`` |
| RESULT | worker -> master | ``{"token", "result"}`` |
| READY | worker -> master | ``{"token"}`` (``null`` when the worker starts) |
| HEARTBEAT | worker -> master | ``{"token"}`` |
| STOP | master -> worker | ``{}`` |
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["WORK", "RESULT", "READY", "HEARTBEAT", "STOP", "TAG_NAMES", "encode", "decode"]

WORK, RESULT, READY, HEARTBEAT, STOP = 11, 12, 13, 14, 15
TAG_NAMES = {WORK: "WORK", RESULT: "RESULT", READY: "READY", HEARTBEAT: "HEARTBEAT", STOP: "STOP"}
MAX_MESSAGE = 16 << 20


def encode(obj: Any) -> bytes:
    """JSON bytes of one message body."""
    return orjson.dumps(obj)


def decode(data: bytes | bytearray | memoryview) -> tuple[dict[str, Any] | None, str | None]:
    """``(body, None)`` for a valid JSON object, ``(None, reason)`` otherwise (never raises)."""
    if len(data) > MAX_MESSAGE:
        return None, f"message of {len(data)} bytes is over the bound"
    try:
        obj = orjson.loads(bytes(data))
    except orjson.JSONDecodeError as e:
        return None, f"not JSON: {e}"
    if not isinstance(obj, dict):
        return None, "not a JSON object"
    return obj, None
