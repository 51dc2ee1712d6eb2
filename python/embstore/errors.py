"""embstore's exceptions and the C return codes they come from.

Every C call returns 0 or a negative code: a negative errno, or one of
embstore's own codes below -1000. Their names and values come from the
loaded library at import (emb_err_codes(), emb_err_name()), so this
package never holds a copy of the list: :data:`CODES` maps each name to its
value, and each is a constant here too (``errors.EMB_ENOTABLE``).

A failing call raises the subclass of :class:`Error` for its code's family
(connection, timeout, table, auth, cache); which codes make up a family is
decided here, by name, in :data:`FAMILIES`, and a code in none of them
raises :class:`Error`. The message is ``emb_strerror()``'s, followed by the
text of the calling thread's last error (emb_last_error()) when it says
more: a server's own text, or what was wrong.

Built at import, read-only afterwards: any thread.
"""

from __future__ import annotations

import builtins
import ctypes
import errno
from typing import Optional

from . import _lib


def _library_codes() -> dict[str, int]:
    """name -> value of the library's own codes, in its order."""
    lib = _lib.lib
    n = lib.emb_err_codes(None, 0)
    buf = (ctypes.c_int * n)()
    got = lib.emb_err_codes(buf, n)
    if got != n:
        raise ImportError(f"embstore: emb_err_codes() counted {n} codes, "
                          f"then {got}")
    return {lib.emb_err_name(c).decode(): c for c in buf}


CODES: dict[str, int] = _library_codes()
"""Name -> value of each of embstore's own codes (EMB_E*), from the
library."""
globals().update(CODES)
_NAMES = {v: k for k, v in CODES.items()}


class Error(Exception):
    """A failed embstore call.

    Attributes:
        code: the C return code (negative errno or an EMB_E* value).
        name: its symbolic name (``"EMB_ENOTABLE"``, ``"ETIMEDOUT"``).
        message: emb_strerror()'s text, plus the thread's last error text
            (the server's, or what was wrong) when it says more.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.name = code_name(code)

    def __str__(self) -> str:
        return f"{self.message} ({self.name})"


class ConnectionError(Error, builtins.ConnectionError):
    """A server or the scheduler cannot be reached, closed the connection,
    or was declared dead; also `except ConnectionError` (the builtin)."""


class TimeoutError(Error, builtins.TimeoutError):
    """A request or the cluster's formation took longer than allowed."""


class TableError(Error):
    """The table is unknown, exists with another spec, or its name, dim,
    optimizer or initializer is rejected; or the servers' memory is full."""


class NonFiniteError(Error, builtins.ValueError):
    """A push or assign was refused whole (EMB_ENONFINITE): a gradient or
    row is NaN or infinite, or the update would make a row (weights or
    optimizer state) so. No row was changed; the message names the table
    and the first such id. Also a builtin ``ValueError``."""


class AuthError(Error):
    """The servers refused the client's token."""


class CacheError(Error):
    """A cached table's fetch, push or write-back failed (the cause, often
    a lost server, is in the log), or a batch does not fit the cache."""


# Which codes each family raises, by name: EMB_E* names from the library's
# list, the others errno's. A name the loaded library lacks maps nothing
# (tests/python checks that every EMB_E* name here is the library's).
FAMILIES: dict[type[Error], tuple[str, ...]] = {
    ConnectionError: (
        "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EHOSTUNREACH",
        "ENETUNREACH", "EPIPE", "ENOTCONN", "ENODEV",
        "EMB_ECLOSED", "EMB_EPEERDEAD", "EMB_EQPERR", "EMB_ENODEVICE",
        "EMB_ENOSERVER", "EMB_ENODEAD", "EMB_ENOSCHED", "EMB_ECLUSTER",
        "EMB_ETOOMANYCONNS", "EMB_ERETRYLATE", "EMB_ENOETCD",
        "EMB_ENOLEASE", "EMB_ESTALEMAP", "EMB_EMOVING"),
    TimeoutError: ("ETIMEDOUT",),
    TableError: (
        "EMB_ENOTABLE", "EMB_ETABLEEXISTS", "EMB_EBADDIM", "EMB_EBADOPTIM",
        "EMB_EBADINIT", "EMB_EMEMLIMIT", "EMB_ETOOMANYTABLES",
        "EMB_EBADNAME", "EMB_ENOTFOUND", "EMB_EBADLIFE", "EMB_ENOTREMOTE",
        "EMB_ETIERFULL", "EMB_ENOTIER"),
    NonFiniteError: ("EMB_ENONFINITE",),
    AuthError: ("EMB_EAUTH", "EMB_ENOHELLO", "EMB_ENOADMIN", "EACCES"),
    CacheError: ("EMB_ECACHEFULL", "EMB_EFETCH", "EMB_EWRITEBACK",
                 "EMB_EPUSH"),
}


def _code_of(name: str) -> Optional[int]:
    if name.startswith("EMB_"):
        return CODES.get(name)
    value = getattr(errno, name, None)
    return None if value is None else -value


_FAMILY = {_code_of(n): cls for cls, names in FAMILIES.items()
           for n in names if _code_of(n) is not None}


def code_name(code: int) -> str:
    """``"EMB_ENOTABLE"`` for -1202, ``"ETIMEDOUT"`` for -110 (the
    library's emb_err_name()), else the number as a string."""
    if code in _NAMES:
        return _NAMES[code]
    if -2**31 <= code < 0:
        name = _lib.lib.emb_err_name(code).decode()
        if name not in ("OK", "UNKNOWN"):
            return name
    if code < 0 and -code in errno.errorcode:
        return errno.errorcode[-code]
    return str(code)


def error_class(code: int) -> type[Error]:
    """The exception class a code raises."""
    return _FAMILY.get(code, Error)


__all__ = ["Error", "ConnectionError", "TimeoutError", "TableError",
           "AuthError", "CacheError", "CODES", "FAMILIES", "code_name",
           "error_class"]
