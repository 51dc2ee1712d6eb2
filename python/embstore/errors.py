"""embstore's exceptions and the C return codes they come from.

Every C call returns 0 or a negative code: a negative errno, or one of
embstore's own codes below -1000 (src/common/err.h; tests/python checks that
CODES below matches that list). A failing call raises the subclass of
:class:`Error` for its code's family; the message is ``emb_strerror()``'s,
followed by the server's own text when a server sent one.
"""

from __future__ import annotations

import builtins
import errno

# name -> value, as in src/common/err.h's EMB_ERR_LIST.
CODES = {
    "EMB_EINTERNAL": -1001, "EMB_EBADARG": -1002,
    "EMB_EBADMAGIC": -1101, "EMB_EBADVERSION": -1102,
    "EMB_EBADFRAME": -1103, "EMB_ETOOBIG": -1104, "EMB_EBADOP": -1105,
    "EMB_ETOOMANYIDS": -1106, "EMB_EAUTH": -1107, "EMB_ENOHELLO": -1108,
    "EMB_ESERVER": -1109, "EMB_ETRUNCFRAME": -1110,
    "EMB_ENOADMIN": -1111, "EMB_ETOOMANYCONNS": -1112,
    "EMB_ERETRYLATE": -1115,
    "EMB_EBADDUMP": -1201, "EMB_ENOTABLE": -1202, "EMB_ETABLEEXISTS": -1203,
    "EMB_EBADDIM": -1204, "EMB_EBADOPTIM": -1205, "EMB_EBADINIT": -1206,
    "EMB_EMEMLIMIT": -1207, "EMB_ETOOMANYTABLES": -1208,
    "EMB_EBADNAME": -1209, "EMB_EARENA": -1210, "EMB_ENOTFOUND": -1211,
    "EMB_EDUMPFORMAT": -1212, "EMB_ETRUNCATED": -1213,
    "EMB_EMANIFEST": -1214, "EMB_ENONFINITE": -1215, "EMB_ENOCKPT": -1220,
    "EMB_EDELTALOST": -1221, "EMB_ECHAIN": -1222,
    "EMB_EBADLIFE": -1230, "EMB_ENOTREMOTE": -1231,
    "EMB_ECLOSED": -1301, "EMB_EPEERDEAD": -1302, "EMB_EQPERR": -1303,
    "EMB_ENOCREDIT": -1304, "EMB_ENODEVICE": -1305,
    "EMB_ERESPTOOBIG": -1306,
    "EMB_ECACHEFULL": -1401, "EMB_EFETCH": -1402, "EMB_EWRITEBACK": -1403,
    "EMB_EPUSH": -1404,
    "EMB_ENOSERVER": -1501, "EMB_ENODEAD": -1502, "EMB_ENOSCHED": -1503,
    "EMB_ECLUSTER": -1504, "EMB_ESTALEMAP": -1505, "EMB_EMOVING": -1506,
    "EMB_ENOETCD": -1530, "EMB_EETCD": -1531, "EMB_ENOLEASE": -1532,
}
globals().update(CODES)
_NAMES = {v: k for k, v in CODES.items()}


class Error(Exception):
    """A failed embstore call.

    Attributes:
        code: the C return code (negative errno or an EMB_E* value).
        name: its symbolic name (``"EMB_ENOTABLE"``, ``"ETIMEDOUT"``).
        message: emb_strerror()'s text, plus the server's when it sent one.
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


class AuthError(Error):
    """The servers refused the client's token."""


class CacheError(Error):
    """A cached table's fetch, push or write-back failed (the cause, often
    a lost server, is in the log), or a batch does not fit the cache."""


_FAMILY = {}
for _c in ("ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EHOSTUNREACH",
           "ENETUNREACH", "EPIPE", "ENOTCONN", "ENODEV"):
    _FAMILY[-getattr(errno, _c)] = ConnectionError
for _n in ("EMB_ECLOSED", "EMB_EPEERDEAD", "EMB_EQPERR", "EMB_ENODEVICE",
           "EMB_ENOSERVER", "EMB_ENODEAD", "EMB_ENOSCHED", "EMB_ECLUSTER",
           "EMB_ETOOMANYCONNS", "EMB_ERETRYLATE", "EMB_ENOETCD",
           "EMB_ENOLEASE", "EMB_ESTALEMAP", "EMB_EMOVING"):
    _FAMILY[CODES[_n]] = ConnectionError
_FAMILY[-errno.ETIMEDOUT] = TimeoutError
for _n in ("EMB_ENOTABLE", "EMB_ETABLEEXISTS", "EMB_EBADDIM", "EMB_EBADOPTIM",
           "EMB_EBADINIT", "EMB_EMEMLIMIT", "EMB_ETOOMANYTABLES",
           "EMB_EBADNAME", "EMB_ENOTFOUND", "EMB_EBADLIFE",
           "EMB_ENOTREMOTE"):
    _FAMILY[CODES[_n]] = TableError
for _n in ("EMB_EAUTH", "EMB_ENOHELLO", "EMB_ENOADMIN"):
    _FAMILY[CODES[_n]] = AuthError
for _n in ("EMB_ECACHEFULL", "EMB_EFETCH", "EMB_EWRITEBACK", "EMB_EPUSH"):
    _FAMILY[CODES[_n]] = CacheError
_FAMILY[-errno.EACCES] = AuthError


def code_name(code: int) -> str:
    """``"EMB_ENOTABLE"`` for -1202, ``"ETIMEDOUT"`` for -110, else the
    number as a string."""
    if code in _NAMES:
        return _NAMES[code]
    if code < 0 and -code in errno.errorcode:
        return errno.errorcode[-code]
    return str(code)


def error_class(code: int) -> type[Error]:
    """The exception class a code raises."""
    return _FAMILY.get(code, Error)


__all__ = ["Error", "ConnectionError", "TimeoutError", "TableError",
           "AuthError", "CacheError", "CODES", "code_name", "error_class"]
