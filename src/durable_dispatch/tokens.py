"""Dispatch tokens: unique for the life of a campaign, across master restarts.

A token is ``e<epoch>-<n>``: the master's epoch (a number the durable campaign state increments at
every start) and a counter within the epoch. No two dispatches of one campaign share a token, so a
late message from any earlier dispatch, even one from before a master crash, can never match a newer
dispatch. On the wire a token is its string form; anything that does not parse is *malformed*.
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Token"]

_TOKEN_RE = re.compile(r"^e(0|[1-9][0-9]{0,17})-(0|[1-9][0-9]{0,17})$")


class Token(NamedTuple):
    """A dispatch token: ``epoch`` (master generation) and ``n`` (dispatch counter).

    Ordered and hashable like the tuple ``(epoch, n)``; its wire form is ``str(token)``.
    """

    epoch: int
    n: int

    def __str__(self) -> str:
        return f"e{self.epoch}-{self.n}"

    @classmethod
    def parse(cls, value: object) -> Token | None:
        """The token a wire value names, or None when it is malformed (wrong type or form)."""
        if type(value) is Token:
            return value
        if not isinstance(value, str) or len(value) > 40:
            return None
        m = _TOKEN_RE.match(value)
        if m is None:
            return None
        return cls(int(m.group(1)), int(m.group(2)))
