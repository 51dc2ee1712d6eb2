"""Clients, tables, cached tables and futures over libembstore.

Arrays cross into C without copies: ids go as the caller's uint64 (or int64,
reinterpreted) buffer and rows are gathered straight into the caller's
float32 array. Every argument is checked here, before anything is sent, so a
wrong dtype or shape raises TypeError or ValueError and the servers never see
a half-formed request.

Threads: a Client and its Tables may be used from any thread at once (the C
library runs its own network thread and ctypes releases the GIL in every
call). A CachedTable belongs to one thread. close() needs every other call
on the object finished.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from collections.abc import Sequence
from ctypes import byref, c_uint64, c_void_p
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from . import _lib
from .errors import CODES, Error, error_class
from .stats import CachedTableStats, ClientStats, TableStats

_L = _lib.lib
ArrayLike = Any  # numpy arrays, lists, CPU torch tensors: np.asarray() works

_MAX_IDS = 2**32 - 1  # counts are uint32 in the C API


def _strerror(rc: int) -> str:
    return _L.emb_strerror(rc).decode()


def _raise(rc: int) -> None:
    """Raises the Error subclass of rc, with the text of this thread's last
    error (a server's message, or what was wrong) when it is rc's: called
    on the thread whose call just failed, before it makes another."""
    msg = _strerror(rc)
    buf = ctypes.create_string_buffer(512)
    if _L.emb_last_error(buf, len(buf)) == rc:
        text = buf.value.decode(errors="replace")
        if text and text != msg:
            msg = f"{msg}: {text}"
    raise error_class(rc)(rc, msg)


def _check(rc: int, client: Optional["Client"] = None) -> int:
    """rc, or the Error of a negative rc (client: unused, kept for the
    callers' symmetry; the last error is per thread)."""
    if rc < 0:
        _raise(rc)
    return rc


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def as_ids(ids: ArrayLike) -> np.ndarray:
    """ids as a 1-D C-contiguous uint64 array, without a copy when they are
    already uint64 or int64 (int64 is reinterpreted: -1 is 2^64 - 1, so ids
    hashed over all 64 bits fit torch's int64 tensors). Other integer
    dtypes are converted modulo 2^64. TypeError for non-integers,
    ValueError for another shape."""
    a = ids if isinstance(ids, np.ndarray) else np.asarray(ids)
    if a.dtype.kind not in "iu":
        if a.size == 0 and a.dtype.kind == "f":
            a = a.astype(np.uint64)  # np.asarray([]) is float64
        else:
            raise TypeError(f"ids must be integers, not {a.dtype}")
    if a.ndim != 1:
        raise ValueError(f"ids must be 1-D, not of shape {a.shape}")
    if a.shape[0] > _MAX_IDS:
        raise ValueError(f"at most {_MAX_IDS} ids per call")
    if a.dtype == np.uint64 and a.flags.c_contiguous:
        return a
    if a.dtype == np.int64:
        return np.ascontiguousarray(a).view(np.uint64)
    return a.astype(np.uint64)


def _rows(a: ArrayLike, n: int, width: int, what: str,
          writable: bool) -> np.ndarray:
    """Checks a float32 [n, width] C-contiguous array (no conversion: a
    copy would hide where the data goes)."""
    if not isinstance(a, np.ndarray):
        a = np.asarray(a)
    if a.dtype != np.float32:
        raise TypeError(f"{what} must be float32, not {a.dtype}")
    if a.shape != (n, width):
        raise ValueError(f"{what} must have shape ({n}, {width}), "
                         f"not {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{what} must be C-contiguous")
    if writable and not a.flags.writeable:
        raise ValueError(f"{what} must be writable")
    return a


# What emb_optim_parse() takes (src/common/optim.c); docs/python.md's
# table lists the same (tests/python/test_errors.py checks both).
OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl", "rowwise_adagrad")
OPTIMIZER_KEYS = ("lr", "alpha", "wd", "acc", "beta1", "beta2", "eps", "beta",
                  "l1", "l2")


def _optim_why(spec: str) -> str:
    """What is wrong with an optimizer spec the library refused."""
    name, _, rest = spec.partition(":")
    if name not in OPTIMIZERS:
        return (f"unknown optimizer {name!r}: want one of "
                f"{', '.join(OPTIMIZERS)}")
    for kv in rest.split(",") if rest else ():
        key, eq, value = kv.partition("=")
        if not eq:
            return f"{kv!r} is not key=value"
        if key not in OPTIMIZER_KEYS:
            return (f"unknown key {key!r}: the keys are "
                    f"{', '.join(OPTIMIZER_KEYS)}")
        try:
            float(value)
        except ValueError:
            return f"{key}={value!r} is not a number"
    return ("a value is out of range: lr > 0; wd, acc, beta, l1, l2 >= 0; "
            "beta1 and beta2 in [0, 1); eps > 0 (docs/python.md)")


def _parse_optim(spec: str) -> _lib.OptimCfg:
    cfg = _lib.OptimCfg()
    if not isinstance(spec, str):
        raise TypeError(f"optimizer must be a str like 'adagrad:lr=0.05', "
                        f"not {type(spec).__name__}")
    if _L.emb_optim_parse(spec.encode(), byref(cfg)) != 0:
        raise ValueError(f"bad optimizer {spec!r}: {_optim_why(spec)}; want "
                         "NAME[:key=value,...], e.g. 'adagrad:lr=0.05'")
    return cfg


def _parse_init(spec: str) -> _lib.InitCfg:
    cfg = _lib.InitCfg()
    if not isinstance(spec, str) or _L.emb_init_parse(
            spec.encode(), byref(cfg)) != 0:
        raise ValueError(f"bad initializer {spec!r}: want zeros, "
                         "constant:V, uniform:A,B or normal:MEAN,STD")
    return cfg


def _parse_bytes(what: str, v: "int | str") -> int:
    """A size as embstore's flags spell it (emb_bytes_parse(): "123",
    "64K", "8M", "2G", "1T" with an optional "B"; powers of two), or an
    int."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        if 0 <= v < 2**64:
            return int(v)
    elif isinstance(v, str):
        out = c_uint64()
        if _L.emb_bytes_parse(v.encode(), byref(out)) == 0:
            return out.value
    raise ValueError(f"bad {what} {v!r}: want bytes, e.g. 1073741824 or "
                     "'64G'")


def _parse_lifecycle(admit: str, evict: str) -> _lib.LifecycleCfg:
    cfg = _lib.LifecycleCfg()
    if not isinstance(admit, str) or _L.emb_admit_parse(
            admit.encode(), byref(cfg)) != 0:
        raise ValueError(f"bad admission {admit!r}: want none, count:N or "
                         "bloom:N[:BYTES]")
    if not isinstance(evict, str) or _L.emb_evict_parse(
            evict.encode(), byref(cfg)) != 0:
        raise ValueError(f"bad eviction {evict!r}: want none, or ttl:STEPS,"
                         " min_l2:X, max_rows:N[:lru|lfu] joined by commas")
    return cfg


def _parse_mode(mode: str) -> tuple[int, int]:
    """"async", "sync" or "stale:K" -> (enum emb_mode, K)."""
    if mode == "async":
        return _lib.EMB_MODE_ASYNC, 0
    if mode == "sync":
        return _lib.EMB_MODE_SYNC, 0
    if isinstance(mode, str) and mode.startswith("stale:"):
        k = mode[6:]
        if k.isdigit() and int(k) < 2**32:
            return _lib.EMB_MODE_STALE, int(k)
    raise ValueError(f"bad mode {mode!r}: want async, sync or stale:K")


class Future:
    """A pull or push in flight. The arrays it was given stay referenced
    (and must not be changed) until it is done; result() waits.

    Dropping an unfinished Future waits for it, since the C library still
    writes into (or reads from) its arrays."""

    def __init__(self, handle: int, client: "Client", value: Any,
                 keep: tuple) -> None:
        self._h = handle
        self._client = client
        self._value = value
        self._keep = keep  # the buffers C borrows
        self._rc: Optional[int] = None
        client._futures.add(self)

    def done(self) -> bool:
        """True once the operation finished (result() will not block)."""
        return self._rc is not None or bool(_L.emb_async_done(self._h))

    def _wait(self) -> int:
        if self._rc is None:
            self._rc = _L.emb_async_wait(self._h)
            self._h = None
            self._keep = ()
        return self._rc

    def result(self) -> Any:
        """Waits, then returns the pulled float32 [n, dim] array (pull) or
        None (push); raises the operation's Error."""
        _check(self._wait(), self._client)
        return self._value

    wait = result

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None:
            self._wait()


class Client:
    """A connection to every server of a cluster; see :func:`connect`."""

    def __init__(self, handle: int, joined: bool) -> None:
        self._h = handle
        self._joined = joined
        self._finished = False
        self._tables: "weakref.WeakSet[Table]" = weakref.WeakSet()
        self._futures: "weakref.WeakSet[Future]" = weakref.WeakSet()
        self.rank: int = _L.emb_client_rank(handle)
        """This worker's rank, 0..num_workers-1: the scheduler's; without
        one, torchrun's RANK (distributed_env()), else 0."""
        self.num_workers: int = _L.emb_client_nworkers(handle)
        """Workers in the cluster: the scheduler's count; without one,
        torchrun's WORLD_SIZE, else 1."""
        if not joined:
            env = distributed_env()
            if env is not None:
                self.rank, self.num_workers = env.rank, env.world_size

    def _handle(self) -> int:
        if not self._h:
            raise ValueError("the client is closed")
        return self._h

    @property
    def num_servers(self) -> int:
        return _L.emb_client_nservers(self._handle())

    @property
    def transport(self) -> str:
        """"tcp" or "rdma": what the connections use."""
        return _L.emb_client_transport(self._handle()).decode()

    @property
    def servers(self) -> str:
        """The servers as "host:port,host:port" (what connect() takes)."""
        buf = ctypes.create_string_buffer(1 << 16)
        _check(_L.emb_client_servers(self._handle(), buf, len(buf)))
        return buf.value.decode()

    def server_of(self, id: int) -> int:
        """Index (in servers) of the server that holds id."""
        return _L.emb_client_server_of(self._handle(), id % 2**64)

    def stats(self) -> ClientStats:
        """Client counters (:class:`embstore.ClientStats`, also a Mapping:
        ``stats["retries"]``): requests, bytes_out, bytes_in, errors,
        ids_in, ids_sent, retries (requests sent again after a lost
        connection), reconnects, resp_copied (RDMA responses copied out of
        transport memory; 0 while response buffers are registered); with
        pull_mode="onesided": rows_read (rows READ and validated),
        rows_fallback (rows pulled two-sided instead), seal_failures,
        read_conn_losses."""
        s = _lib.ClientStats()
        _check(_L.emb_client_stats(self._handle(), byref(s)))
        return ClientStats.from_struct(s)

    def table(self, name: str, dim: int, optimizer: str = "adagrad:lr=0.05",
              init: str = "normal:0,0.01", mode: str = "async",
              seed: int = 0, admit: str = "none",
              evict: str = "none", row_format: str = "fp32",
              rounding: str = "stochastic", tier: str = "auto",
              tier_max: "int | str" = 0) -> "Table":
        """Creates the table on every server, or opens it where an identical
        one exists (so every worker may call this), and sets its training
        mode (every worker must pass the same one).

        Args:
            name: 1..63 bytes of [A-Za-z0-9_.-].
            dim: floats per row, 1..4096.
            optimizer: "sgd", "adagrad", "adam", "ftrl" or
                "rowwise_adagrad" (one accumulator a row, not one a
                weight), with ":key=value,..." (lr, wd, acc, beta1, beta2,
                eps, beta, l1, l2), applied on the servers by push.
            init: values of new rows: "zeros", "constant:V", "uniform:A,B"
                or "normal:MEAN,STD"; a row's values depend only on (seed,
                id), so every server and restart agrees.
            mode: "async" (pushes applied on arrival), "sync" (a step's
                pushes of every worker averaged, applied once) or "stale:K"
                (pushes more than K steps behind dropped).
            seed: with the id, decides initial values.
            admit: when an id becomes a row (docs/store.md): "none" (at
                its first pull), "count:N" (at its N-th pull; until then
                pulls get initial values and pushes are dropped) or
                "bloom:N[:BYTES]" (the same, counted in a Bloom filter of
                BYTES per server, 16 MiB by default).
            evict: "none", or any of "ttl:STEPS" (rows not pulled or pushed
                for STEPS table steps), "min_l2:X" (rows whose weights'
                L2 norm is under X) and "max_rows:N[:lru|lfu]" (at most N
                rows over all servers), joined by commas. Evicted rows
                start over from the initializer.
            row_format: how the servers keep the weights: "fp32", "fp16",
                "bf16" or "int8" (a scale and bias per row). The optimizer
                and its state stay fp32; pulls still give float32 unless
                asked otherwise (Table.pull's dtype).
            rounding: how a push's fp32 result goes back into a compact
                row: "stochastic" (seeded by seed, id and the row's update
                count, so reruns and replicas agree) or "nearest".
            tier: whether the servers keep the rows their --mem-limit
                leaves out on their device tier (docs/store.md, "The
                device tier"): "auto" (as each server was started: with
                --tier-dir or not), "off" (never: all rows in DRAM, new
                rows refused at the limit) or "on" (always; a server
                without --tier-dir refuses the table).
            tier_max: bytes of tier file each server gives the table, an
                int or "64G"; 0 for the server's --tier-max (the smaller
                of the two holds).

        The first creation decides the row format and the tier; a
        checkpoint keeps them. An existing table keeps its admission and eviction (unless it has
        none); Table.set_lifecycle() changes them (admin rights).

        Raises ValueError for a bad optimizer, init, mode, admit or evict
        string, and
        TableError when the servers refuse the spec (same name, other spec;
        bad name or dim; too many tables).
        """
        if not isinstance(dim, (int, np.integer)) or not 1 <= dim <= 4096:
            raise ValueError(f"dim must be 1..4096, not {dim!r}")
        if row_format not in _lib.ROW_FORMATS:
            raise ValueError(f"row_format must be one of "
                             f"{', '.join(_lib.ROW_FORMATS)}, not "
                             f"{row_format!r}")
        if rounding not in _lib.ROUNDINGS:
            raise ValueError(f"rounding must be one of "
                             f"{', '.join(_lib.ROUNDINGS)}, not {rounding!r}")
        if tier not in _lib.TIER_MODES:
            raise ValueError(f"tier must be one of "
                             f"{', '.join(_lib.TIER_MODES)}, not {tier!r}")
        tier_bytes = _parse_bytes("tier_max", tier_max)
        spec = _lib.TableSpec(name=name.encode(), dim=int(dim),
                              optim=_parse_optim(optimizer),
                              init=_parse_init(init), seed=seed % 2**64,
                              life=_parse_lifecycle(admit, evict),
                              row_format=_lib.ROW_FORMATS.index(row_format),
                              rounding=_lib.ROUNDINGS.index(rounding),
                              tier=_lib.TIER_MODES.index(tier),
                              tier_max=tier_bytes)
        _parse_mode(mode)  # a bad mode raises before the table is made
        h = c_void_p()
        _check(_L.emb_client_table_create(self._handle(), byref(spec),
                                          byref(h)), self)
        t = Table(self, h.value)
        try:
            t.set_mode(mode)
        except BaseException:
            t.close()
            raise
        return t

    def open_table(self, name: str) -> "Table":
        """Opens an existing table; TableError (EMB_ENOTABLE) if a server
        lacks it. Its training mode stays as set."""
        h = c_void_p()
        _check(_L.emb_client_table_open(self._handle(), name.encode(),
                                        byref(h)), self)
        return Table(self, h.value)

    def _batch(self, reqs: Sequence[tuple], what: str,
               width: int) -> tuple[Any, list]:
        """The emb_table_batch array of reqs, whose tables must be this
        client's; keep (the arrays the C call borrows) is returned beside
        it so they outlive the call."""
        if isinstance(reqs, (str, bytes)) or not isinstance(reqs, Sequence):
            raise TypeError(f"{what} takes a sequence of tuples, not "
                            f"{type(reqs).__name__}")
        self._handle()
        arr = (_lib.TableBatch * len(reqs))()
        keep = []
        for i, r in enumerate(reqs):
            if not isinstance(r, tuple) or len(r) != width:
                raise TypeError(f"{what}: request {i} must be a tuple of "
                                f"{width}, not {r!r:.60}")
            t = r[0]
            if not isinstance(t, Table):
                raise TypeError(f"{what}: request {i}: {t!r:.60} is not "
                                "a Table")
            if t._client is not self:
                raise ValueError(f"{what}: request {i}: table {t.name} "
                                 "belongs to another client")
            ids = as_ids(r[1])
            n = ids.shape[0]
            if width == 2:
                rows = np.empty((n, t.dim), dtype=np.float32)
            else:
                rows = _rows(r[2], n, t.dim, f"{what}: request {i}: grads",
                             False)
            arr[i].struct_size = ctypes.sizeof(_lib.TableBatch)
            arr[i].table = t._handle()
            arr[i].n = n
            arr[i].ids = _addr(ids)
            arr[i].rows = _addr(rows)
            keep.append((ids, rows))
        return arr, keep

    def pull_many(self, reqs: Sequence[tuple["Table", ArrayLike]], *,
                  create: bool = True) -> list[np.ndarray]:
        """The rows of several tables' ids in one call: each request
        (table, ids) is pulled as Table.pull(ids, create=create) would,
        but in one request per server (PULL_MANY) where the servers offer
        it, so a step over many tables costs one round trip per server
        instead of one per table.

        Returns a float32 [n_i, dim_i] array per request, in reqs order.
        TypeError for a request that is not (Table, ids); ValueError for a
        table of another client; the errors of Table.pull() otherwise (the
        first failing request's)."""
        arr, keep = self._batch(reqs, "pull_many", 2)
        flags = 0 if create else _lib.EMB_CLIENT_NOCREATE
        _check(_L.emb_client_pull_many(self._h, arr, len(reqs), flags),
               self)
        return [rows for _, rows in keep]

    def push_many(self, reqs: Sequence[tuple["Table", ArrayLike,
                                             ArrayLike]],
                  step: int = 0) -> None:
        """Gradients for several tables in one call: each request (table,
        ids, grads float32 [n_i, dim_i]) is pushed as Table.push(ids,
        grads, step) would (duplicates summed, applied at most once,
        refused whole if not finite), but all at once (one PUSH per table
        and server, back to back), waiting about one round trip.

        TypeError and ValueError as for pull_many() and for bad grads;
        the errors of Table.push() otherwise (NonFiniteError ...: the first
        failing request's; the other requests are applied)."""
        arr, keep = self._batch(reqs, "push_many", 3)
        _check(_L.emb_client_push_many(self._h, arr, len(reqs), step,
                                       self.rank), self)

    @property
    def world_size(self) -> int:
        """num_workers, under torch.distributed's name."""
        return self.num_workers

    def barrier(self, name: str = "barrier") -> None:
        """Blocks until every worker of the cluster called barrier() with
        the same name (1..63 bytes). A no-op for one worker.
        ConnectionError if a node died or the scheduler is lost.

        Without a scheduler, several workers (torchrun's WORLD_SIZE > 1)
        meet in torch.distributed.barrier() of the default process group,
        which the caller has initialized (init_process_group()): torchrun
        starts no scheduler, and the servers do not count workers. The
        name is then not checked. RuntimeError without such a group."""
        if not self._joined:
            if self.num_workers > 1:
                _torch_barrier(self.num_workers)
            return
        _check(_L.emb_client_barrier(self._handle(), name.encode()), self)

    def finish(self) -> None:
        """Tells the scheduler this worker is done; once every worker has,
        the servers and the scheduler exit. Does not wait for the others.
        A no-op for a client that did not join through a scheduler."""
        if not self._joined or self._finished:
            return
        self._finished = True
        _check(_L.emb_client_finish(self._handle()), self)

    def close(self) -> None:
        """Waits for futures in flight, closes tables and caches, and
        disconnects. Idempotent. Does not call finish()."""
        if not self._h:
            return
        for f in list(self._futures):
            f._wait()
        for t in list(self._tables):
            t.close()
        _L.emb_client_destroy(self._h)
        self._h = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # A worker that fails leaves without finish: the scheduler then
        # counts it as dead and the job ends with a failure, as it should.
        try:
            if exc_type is None and self._h:
                self.finish()
        finally:
            self.close()

    def __del__(self) -> None:
        # At interpreter exit the library may already be unloaded.
        if getattr(self, "_h", None) and _L is not None:
            try:
                self.close()
            except Exception:
                pass


class Table:
    """A table on the servers, from Client.table() or Client.open_table().

    Attributes:
        name: the table's name.
        dim: floats per row.
        row_floats: 4-byte words of a whole row: the weights in the
            table's row format (dim floats for fp32), then the optimizer's
            state floats.
        row_format: "fp32", "fp16", "bf16" or "int8".
        optimizer: "sgd", "adagrad", "adam", "ftrl" or "rowwise_adagrad".
        mode: the training mode this handle set ("async" when opened).
    """

    def __init__(self, client: Client, handle: int) -> None:
        self._client = client
        self._h = handle
        self._caches: "weakref.WeakSet[CachedTable]" = weakref.WeakSet()
        spec = _L.emb_client_table_spec(handle).contents
        self.name: str = spec.name.decode()
        self.dim: int = _L.emb_client_table_dim(handle)
        self.row_floats: int = _L.emb_client_table_row_floats(handle)
        self.row_format: str = _lib.ROW_FORMATS[spec.row_format]
        self.rounding: str = _lib.ROUNDINGS[spec.rounding]
        self._weight_words: int = _L.emb_client_table_weight_words(handle)
        self.push_format = "fp32"
        self.optimizer: str = _L.emb_optim_name(spec.optim.kind).decode()
        self.mode = "async"
        client._tables.add(self)

    @property
    def client(self) -> Client:
        return self._client

    def spec(self) -> dict[str, Any]:
        """The table's spec as the servers hold it, in the arguments of
        Client.table() that make it: name, dim, optimizer (every
        hyper-parameter written out, so the string gives back the same
        floats), init and seed. ``client.table(**t.spec())`` makes or
        opens the same table (admission and eviction not included)."""
        s = _L.emb_client_table_spec(self._handle()).contents
        o = s.optim
        optim = (f"{self.optimizer}:lr={o.lr!r},wd={o.weight_decay!r},"
                 f"acc={o.initial_accumulator!r},beta1={o.beta1!r},"
                 f"beta2={o.beta2!r},eps={o.eps!r},beta={o.ftrl_beta!r},"
                 f"l1={o.l1!r},l2={o.l2!r}")
        kind = _L.emb_init_name(s.init.kind).decode()
        init = {"zeros": "zeros", "constant": f"constant:{s.init.a!r}"}.get(
            kind, f"{kind}:{s.init.a!r},{s.init.b!r}")
        out = {"name": self.name, "dim": self.dim, "optimizer": optim,
               "init": init, "seed": s.seed}
        if self.row_format != "fp32":
            out["row_format"] = self.row_format
            out["rounding"] = self.rounding
        if s.tier:
            out["tier"] = _lib.TIER_MODES[s.tier]
        if s.tier_max:
            out["tier_max"] = s.tier_max
        return out

    def _handle(self) -> int:
        if not self._h:
            raise ValueError(f"table {self.name} is closed")
        return self._h

    def set_mode(self, mode: str) -> None:
        """"async", "sync" (over every worker of the client's cluster) or
        "stale:K"; every worker sets the same mode before its first push."""
        kind, k = _parse_mode(mode)
        workers = self._client.num_workers if kind == _lib.EMB_MODE_SYNC \
            else 0
        _check(_L.emb_client_table_set_mode(self._handle(), kind, workers,
                                            k), self._client)
        self.mode = mode

    def set_lifecycle(self, admit: str = "none",
                      evict: str = "none") -> None:
        """Replaces the table's admission and eviction on every server
        while it serves (strings as for Client.table(); "none" for both
        turns them off). Needs admin rights when the servers have an admin
        token (AuthError otherwise); ValueError for a bad string."""
        cfg = _parse_lifecycle(admit, evict)
        _check(_L.emb_client_table_set_lifecycle(self._handle(), byref(cfg)),
               self._client)

    def _pull_args(self, ids, out, found, create, with_state=False,
                   make_out=True):
        ids = as_ids(ids)
        n = ids.shape[0]
        width = self.row_floats if with_state else self.dim
        if out is None:
            # make_out=False: the caller brings its own buffer (raw rows)
            out = np.empty((n, width), dtype=np.float32) if make_out \
                else None
        else:
            out = _rows(out, n, width, "out", True)
        fp = None
        if found is not None:
            if not isinstance(found, np.ndarray) or found.dtype not in (
                    np.bool_, np.uint8):
                raise TypeError("found must be a bool or uint8 numpy array")
            if found.shape != (n,) or not found.flags.c_contiguous:
                raise ValueError(f"found must be C-contiguous of shape "
                                 f"({n},)")
            fp = _addr(found)
        flags = 0 if create else _lib.EMB_CLIENT_NOCREATE
        if with_state:
            flags |= _lib.EMB_CLIENT_WITH_STATE
        return ids, n, out, flags, fp

    def pull(self, ids: ArrayLike, out: Optional[np.ndarray] = None, *,
             create: bool = True, found: Optional[np.ndarray] = None,
             with_state: bool = False, dtype: Any = np.float32) -> np.ndarray:
        """Rows of ids.

        Args:
            ids: integer array of n ids (duplicates fine; see as_ids).
            out: float32 [n, dim] C-contiguous array to fill, or None.
            create: missing rows are created from the initializer; with
                False they read as zeros and are not created.
            found: bool or uint8 [n] array set to whether each row existed
                (meaningful with create=False).
            with_state: whole rows, [n, row_floats]: the weights, then the
                optimizer's state (what assign(..., with_state=True) takes
                back). A compact table's weights there are its format's
                bytes in the float32 words: keep them, do not compute.
            dtype: np.float32 (the default), np.float16, or "bfloat16"
                (numpy has none: np.uint16 bit patterns, which
                torch.Tensor.view(torch.bfloat16) reads). A table kept in
                that format hands its rows over as they are, with no
                conversion; any other is converted from float32 here,
                rounding to nearest.

        Returns:
            out, or a new float32 [n, dim] (or [n, row_floats]) array; with
            another dtype a new [n, dim] array of it.
        """
        if (isinstance(dtype, str) and dtype == "bfloat16") or \
                np.dtype(dtype) != np.float32:
            if out is not None or with_state:
                raise TypeError("dtype other than float32 takes no out and "
                                "no with_state")
            return self._pull_half(ids, found, create, dtype)
        ids, n, out, flags, fp = self._pull_args(ids, out, found, create,
                                                 with_state)
        _check(_L.emb_client_table_pull(self._handle(), _addr(ids), n,
                                        _addr(out), flags, fp), self._client)
        return out

    def _pull_half(self, ids, found, create, dtype) -> np.ndarray:
        """pull() of float16 or bfloat16 rows."""
        bf16 = isinstance(dtype, str) and dtype == "bfloat16"
        if not bf16 and np.dtype(dtype) != np.float16:
            raise TypeError(f"dtype must be np.float32, np.float16 or "
                            f"'bfloat16', not {dtype!r}")
        if self.row_format != ("bf16" if bf16 else "fp16"):
            rows = self.pull(ids, create=create, found=found)
            if not bf16:
                return rows.astype(np.float16)
            bits = rows.view(np.uint32)
            return ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16).astype(
                np.uint16)
        ids, n, _, flags, fp = self._pull_args(ids, None, found, create,
                                               make_out=False)
        raw = np.empty((n, self._weight_words * 2), dtype=np.uint16)
        _check(_L.emb_client_table_pull(self._handle(), _addr(ids), n,
                                        _addr(raw), flags | _lib.EMB_CLIENT_RAW,
                                        fp), self._client)
        raw = raw[:, :self.dim]
        return np.ascontiguousarray(raw if bf16 else raw.view(np.float16))

    def set_push_format(self, fmt: str) -> None:
        """How this handle's pushes carry gradients on the wire: "fp32"
        (the default), or "fp16" or "bf16" in half the bytes, rounded to
        nearest after duplicates are summed; the servers widen them back
        and apply the optimizer in fp32. A gradient out of fp16's range
        raises NonFiniteError and nothing is sent. Synchronous tables take
        fp32 only. Any row format takes any of them."""
        if fmt not in ("fp32", "fp16", "bf16"):
            raise ValueError(f"push format must be fp32, fp16 or bf16, not "
                             f"{fmt!r}")
        _check(_L.emb_client_table_set_push_format(
            self._handle(), _lib.ROW_FORMATS.index(fmt)), self._client)
        self.push_format = fmt

    def _push_args(self, ids, grads):
        ids = as_ids(ids)
        n = ids.shape[0]
        grads = _rows(grads, n, self.dim, "grads", False)
        return ids, n, grads

    def push(self, ids: ArrayLike, grads: ArrayLike, step: int = 0) -> None:
        """Applies gradients on the servers with the table's optimizer.

        Args:
            ids: integer array of n ids; duplicates' gradients are summed.
            grads: float32 [n, dim] C-contiguous.
            step: this worker's step, for sync and stale:K tables.
        """
        ids, n, grads = self._push_args(ids, grads)
        _check(_L.emb_client_table_push(self._handle(), _addr(ids), n,
                                        _addr(grads), step,
                                        self._client.rank), self._client)

    def pull_async(self, ids: ArrayLike, out: Optional[np.ndarray] = None, *,
                   create: bool = True) -> Future:
        """pull() without waiting: result() gives the float32 [n, dim]
        array. ids and out must stay unchanged until then."""
        ids, n, out, flags, _ = self._pull_args(ids, out, None, create)
        h = c_void_p()
        _check(_L.emb_client_table_pull_async(self._handle(), _addr(ids), n,
                                              _addr(out), flags, None,
                                              byref(h)), self._client)
        return Future(h.value, self._client, out, (ids, out))

    def push_async(self, ids: ArrayLike, grads: ArrayLike,
                   step: int = 0) -> Future:
        """push() without waiting; ids and grads must stay unchanged until
        the Future is done."""
        ids, n, grads = self._push_args(ids, grads)
        h = c_void_p()
        _check(_L.emb_client_table_push_async(self._handle(), _addr(ids), n,
                                              _addr(grads), step,
                                              self._client.rank, byref(h)),
               self._client)
        return Future(h.value, self._client, None, (ids, grads))

    def assign(self, ids: ArrayLike, rows: ArrayLike, *,
               with_state: bool = False) -> None:
        """Overwrites (or creates) rows with float32 [n, dim] values, or
        with with_state [n, row_floats]: weights and optimizer state, as
        pull(..., with_state=True) gives them."""
        ids = as_ids(ids)
        width = self.row_floats if with_state else self.dim
        rows = _rows(rows, ids.shape[0], width, "rows", False)
        _check(_L.emb_client_table_assign(self._handle(), _addr(ids),
                                          ids.shape[0], _addr(rows),
                                          bool(with_state)), self._client)

    def erase(self, ids: ArrayLike) -> int:
        """Removes rows; returns how many existed."""
        ids = as_ids(ids)
        erased = c_uint64()
        _check(_L.emb_client_table_erase(self._handle(), _addr(ids),
                                         ids.shape[0], byref(erased)),
               self._client)
        return erased.value

    def stats(self) -> TableStats:
        """The table's counters summed over the servers
        (:class:`embstore.TableStats`, also a Mapping: ``stats["rows"]``;
        row_bytes and step: the largest of any): rows, bytes, slab_bytes,
        index_bytes, row_bytes, pulls, pushes, rows_pulled, rows_pushed,
        rows_created, rows_erased, rows_evicted, misses, step, extents,
        grads_discarded, pulls_unadmitted, pushes_unadmitted,
        admit_filter_bytes, rows_evicted_ttl, rows_evicted_l2,
        rows_evicted_cap, rows_nonfinite, and servers
        (how many answered); see src/common/tabledef.h."""
        s = _lib.TableStats()
        _check(_L.emb_client_table_stats(self._handle(), byref(s)),
               self._client)
        return TableStats.from_struct(s)

    def drop(self) -> None:
        """Drops the table on every server (close the handle after)."""
        _check(_L.emb_client_table_drop(self._handle()), self._client)

    def cached(self, rows: int, prefetch: int = 2, mode: str = "back",
               staleness: int = 0, max_batch: int = 4096,
               policy: str = "tinylfu") -> "CachedTable":
        """A worker-side vocab cache over this table (docs/cache.md).

        Args:
            rows: rows the cache holds; at least (prefetch + 1) * distinct
                ids per batch plus the working set.
            prefetch: batches fetched ahead, 0..64.
            mode: "back" (the default, as in C: the optimizer runs here and
                rows go back when evicted or flushed; for rows this worker
                alone updates, refused over a sync table) or "through"
                (gradients pushed every step, the servers optimize; rows
                re-read once older than staleness steps).
            staleness: write-through: steps a used row may lag its fetch; a
                prefetch overlaps the network only when staleness >=
                prefetch.
            max_batch: most ids (duplicates counted) per lookup.
            policy: "tinylfu" (the default: a frequency sketch decides
                whether a new row may evict a cached one), "lru" or "clock".
        """
        modes = {"through": _lib.EMB_CACHED_WRITE_THROUGH,
                 "back": _lib.EMB_CACHED_WRITE_BACK}
        policies = {"lru": _lib.EMB_CACHED_LRU, "clock": _lib.EMB_CACHED_CLOCK,
                    "tinylfu": _lib.EMB_CACHED_TINYLFU}
        if mode not in modes:
            raise ValueError(f"bad cache mode {mode!r}: want through or back")
        if policy not in policies:
            raise ValueError(
                f"bad policy {policy!r}: want tinylfu, lru or clock")
        for what, v, lo, hi in (("rows", rows, 1, 2**32 - 1),
                                ("prefetch", prefetch, 0, 64),
                                ("staleness", staleness, 0, 2**32 - 1),
                                ("max_batch", max_batch, 1, 2**32 - 1)):
            if not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
                raise ValueError(f"{what} must be {lo}..{hi}, not {v!r}")
        opts = _lib.CachedOpts(capacity=rows, max_batch=max_batch,
                               prefetch_depth=prefetch,
                               staleness_steps=staleness, mode=modes[mode],
                               policy=policies[policy],
                               rank=self._client.rank)
        h = c_void_p()
        _check(_L.emb_cached_table_create(self._handle(), byref(opts),
                                          byref(h)), self._client)
        return CachedTable(self, h.value, rows, prefetch, mode, staleness,
                           max_batch)

    def close(self) -> None:
        """Frees the handle and its caches (the table stays on the
        servers). Idempotent."""
        if not self._h:
            return
        for c in list(self._caches):
            c.close()
        _L.emb_client_table_close(self._h)
        self._h = None

    def __repr__(self) -> str:
        return (f"<embstore.Table {self.name!r} dim={self.dim} "
                f"{self.optimizer} {self.mode}>")


class CachedTable:
    """A vocab cache over a Table; see Table.cached(). One thread only.

    A step: lookup(batch b), prefetch(batch b + k), forward and backward,
    push_grads(); prefetch batches 0..k-1 first and flush() at the end.
    """

    def __init__(self, table: Table, handle: int, rows: int, prefetch: int,
                 mode: str, staleness: int, max_batch: int) -> None:
        self.table = table
        self._h = handle
        self.dim = table.dim
        self.rows = rows
        self.depth = prefetch
        self.mode = mode
        self.staleness = staleness
        self.max_batch = max_batch
        self._n: Optional[int] = None  # positions of the current batch
        table._caches.add(self)

    def _handle(self) -> int:
        if not self._h:
            raise ValueError("the cached table is closed")
        return self._h

    def _batch(self, ids: ArrayLike) -> np.ndarray:
        ids = as_ids(ids)
        if ids.shape[0] > self.max_batch:
            raise ValueError(f"{ids.shape[0]} ids > max_batch "
                             f"{self.max_batch}")
        return ids

    def prefetch(self, ids: ArrayLike) -> bool:
        """Queues ids as a coming batch and starts pulling its misses.

        Returns True if queued, False if not (prefetch batches already
        queued, or more distinct ids than the cache can pin): the batch's
        lookup then fetches it itself."""
        ids = self._batch(ids)
        rc = _L.emb_cached_table_prefetch(self._handle(), _addr(ids),
                                          ids.shape[0])
        if rc in (-16, CODES["EMB_ECACHEFULL"]):  # -EBUSY
            return False
        _check(rc, self.table._client)
        return True

    def lookup(self, ids: ArrayLike,
               out: Optional[np.ndarray] = None) -> np.ndarray:
        """Rows of ids in out (float32 [n, dim]); the batch becomes the
        current one for push_grads(). A batch equal to the oldest queued
        prefetch uses it. CacheError if a fetch failed."""
        ids = self._batch(ids)
        n = ids.shape[0]
        out = np.empty((n, self.dim), dtype=np.float32) if out is None \
            else _rows(out, n, self.dim, "out", True)
        self._n = None
        _check(_L.emb_cached_table_lookup(self._handle(), _addr(ids), n,
                                          _addr(out)), self.table._client)
        self._n = n
        return out

    def push_grads(self, grads: ArrayLike) -> None:
        """Gradients (float32 [n, dim]) for the positions of the last
        looked-up batch: pushed (write-through, returns once applied) or
        applied here (write-back)."""
        if self._n is None:
            raise ValueError("push_grads() needs a lookup() first")
        grads = _rows(grads, self._n, self.dim, "grads", False)
        self._n = None
        _check(_L.emb_cached_table_push_grads(self._handle(), _addr(grads)),
               self.table._client)

    def flush(self) -> None:
        """Write-back: stores every updated row on the servers (call it at
        the end of training and before reading the table elsewhere)."""
        _check(_L.emb_cached_table_flush(self._handle()), self.table._client)

    def cancel(self) -> None:
        """Drops queued prefetches and the current batch."""
        _L.emb_cached_table_cancel(self._handle())
        self._n = None

    def stats(self) -> CachedTableStats:
        """Counters since creation (:class:`embstore.CachedTableStats`,
        also a Mapping: ``stats["hits"]``): lookups, hits, misses, hit_ratio,
        refetches, evictions, write_backs, pushes, fetch_calls,
        sync_fetches, rows_fetched, bytes_fetched, bytes_written, stalls,
        wait_ns, rows, dirty."""
        s = _lib.CachedStats()
        _check(_L.emb_cached_table_stats(self._handle(), byref(s)))
        return CachedTableStats.from_struct(s)

    def close(self) -> None:
        """Frees the cache; unflushed write-back rows are lost."""
        if self._h:
            _L.emb_cached_table_destroy(self._h)
            self._h = None


def _read_token(path: Union[str, os.PathLike]) -> bytes:
    """As embstore-server reads it: trailing newlines dropped, 1..256
    bytes."""
    with open(path, "rb") as f:
        tok = f.read(257).rstrip(b"\r\n")
    if not 1 <= len(tok) <= 256:
        raise ValueError(f"token file {path}: empty or longer than 256 "
                         "bytes")
    return tok


def connect(servers: Optional[str] = None, transport: Optional[str] = None,
            auth_token_file: Optional[Union[str, os.PathLike]] = None,
            timeout_ms: int = 30000, name: str = "embstore-python",
            part_ids: int = 0, pull_mode: str = "twosided",
            loc_cache_rows: int = 0) -> Client:
    """Connects to the servers of a cluster.

    Args:
        servers: "host:port,host:port"; None joins the cluster from the
            environment as a worker (EMB_SCHED_HOST / MS_SCHED_HOST and
            friends, which `embstore launch` sets), which gives the client
            its rank and the worker count.
        transport: "tcp", "rdma" or "auto" (rdma where a device serves the
            address); None means $EMB_TRANSPORT, else "auto".
        auth_token_file: file holding the servers' shared token; None
            means $EMB_AUTH_TOKEN_FILE when set (with servers= too).
        timeout_ms: per request; a dead or hung server raises within it.
        name: shown in the servers' logs.
        part_ids: most ids per request (larger batches are split and
            pipelined); 0 = the library's default.
        pull_mode: "twosided" (PULL requests) or "onesided": over RDMA,
            read rows straight out of the servers' table memory with RDMA
            READs, each checked by its seal, and pull two-sided only the
            rows that fail (servers need --remote-read; docs/rdma.md).
            TCP connections ignore it.
        loc_cache_rows: onesided: row locations kept per table (24 bytes
            each); 0 = 2^20.

    Raises ConnectionError (refused, no RDMA device), TimeoutError,
    AuthError, ValueError (bad arguments).
    """
    if transport is None:
        transport = os.environ.get("EMB_TRANSPORT") or "auto"
    if transport not in ("tcp", "rdma", "auto"):
        raise ValueError(f"bad transport {transport!r}: want tcp, rdma or "
                         "auto")
    if not isinstance(timeout_ms, int) or not 1 <= timeout_ms < 2**32:
        raise ValueError(f"timeout_ms must be 1..2^32-1, not {timeout_ms!r}")
    if pull_mode not in _lib.EMB_PULL_MODES:
        raise ValueError(f"bad pull_mode {pull_mode!r}: want twosided or "
                         "onesided")
    if not isinstance(loc_cache_rows, int) or not 0 <= loc_cache_rows <= 2**30:
        raise ValueError("loc_cache_rows must be 0..2^30, not "
                         f"{loc_cache_rows!r}")
    # The servers' token file, as for a cluster's workers (docs/security.md).
    if auth_token_file is None and servers:
        auth_token_file = os.environ.get("EMB_AUTH_TOKEN_FILE") or None
    token = _read_token(auth_token_file) if auth_token_file else None
    opts = _lib.ClientOpts(
        servers=servers.encode() if servers else None,
        transport=transport.encode(), auth_token=token,
        auth_token_len=len(token) if token else 0, timeout_ms=timeout_ms,
        part_ids=part_ids, name=name.encode(),
        pull_mode=_lib.EMB_PULL_MODES.index(pull_mode),
        loc_cache_rows=loc_cache_rows)
    h = c_void_p()
    if servers:
        rc = _L.emb_client_create(byref(opts), byref(h))
    else:
        rc = _L.emb_client_from_env(byref(opts), byref(h))
    _check(rc)
    return Client(h.value, joined=not servers)


class DistributedEnv(NamedTuple):
    """Where torchrun (TorchElastic) put this process: see
    distributed_env()."""
    rank: int
    """Global rank, 0..world_size-1 (RANK)."""
    world_size: int
    """Processes of the job (WORLD_SIZE)."""
    local_rank: int
    """Rank on this node (LOCAL_RANK; rank when unset)."""
    local_world_size: int
    """Processes on this node (LOCAL_WORLD_SIZE; 1 when unset)."""
    node_rank: int
    """This node's rank (GROUP_RANK or PET_NODE_RANK; 0 when unset)."""
    run_id: str
    """TORCHELASTIC_RUN_ID, "" when not run by torchrun."""


def _env_int(env, name: str, lo: int, hi: Optional[int] = None) -> int:
    v = env[name]
    try:
        n = int(v)
    except ValueError:
        n = lo - 1
    if n < lo or (hi is not None and n > hi):
        want = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"${name}={v!r}: want an integer {want}")
    return n


def distributed_env(environ=None) -> Optional[DistributedEnv]:
    """This process's place in a torchrun-started job, or None.

    torchrun's agent gives each worker it starts RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node's rank), MASTER_ADDR,
    MASTER_PORT and TORCHELASTIC_RUN_ID; so do Kubeflow's PyTorchJob and
    `python -m torch.distributed.launch`-style launchers for RANK and
    WORLD_SIZE. Without RANK, the PET_* variables that Kubeflow sets for
    torchrun to read describe one process per node: PET_NNODES (an
    integer; an elastic "MIN:MAX" range is torchrun's to settle) and
    PET_NODE_RANK, when PET_NPROC_PER_NODE is unset or 1. A process with
    none of them is not part of such a job: None.

    Raises ValueError, naming the variable, for a value that is not a
    count (RANK without WORLD_SIZE, a rank not below the world size, an
    elastic range or several processes per node without torchrun).
    """
    env = os.environ if environ is None else environ
    if "RANK" in env or "WORLD_SIZE" in env:
        for need, other in (("RANK", "WORLD_SIZE"), ("WORLD_SIZE", "RANK")):
            if need not in env:
                raise ValueError(f"${need} is unset but ${other} is set: a "
                                 "torchrun worker has both")
        world = _env_int(env, "WORLD_SIZE", 1)
        rank = _env_int(env, "RANK", 0, world - 1)
        lws = _env_int(env, "LOCAL_WORLD_SIZE", 1, world) \
            if "LOCAL_WORLD_SIZE" in env else 1
        lrank = _env_int(env, "LOCAL_RANK", 0, lws - 1) \
            if "LOCAL_RANK" in env else rank % lws
        node = "GROUP_RANK" if "GROUP_RANK" in env else "PET_NODE_RANK"
        return DistributedEnv(rank, world, lrank, lws,
                              _env_int(env, node, 0) if node in env else 0,
                              env.get("TORCHELASTIC_RUN_ID", ""))
    if "PET_NNODES" not in env:
        return None
    if env.get("PET_NPROC_PER_NODE", "1") != "1":
        raise ValueError(f"$PET_NPROC_PER_NODE={env['PET_NPROC_PER_NODE']!r}"
                         " without $RANK: start the workers with torchrun, "
                         "which reads PET_* and gives each its RANK")
    world = _env_int(env, "PET_NNODES", 1)
    rank = _env_int(env, "PET_NODE_RANK", 0, world - 1) \
        if "PET_NODE_RANK" in env else 0
    return DistributedEnv(rank, world, 0, 1, rank, "")


def _torch_barrier(workers: int) -> None:
    """torch.distributed.barrier() over the default process group, which
    must be initialized with one member per worker (this module does not
    import torch: a program that has no group has not imported it)."""
    import sys
    dist = getattr(sys.modules.get("torch"), "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"barrier() of {workers} workers without a scheduler needs "
            "torch.distributed.init_process_group() first (or join through "
            "a scheduler: connect() without servers)")
    if dist.get_world_size() != workers:
        raise RuntimeError(f"barrier(): the process group has "
                           f"{dist.get_world_size()} members, the client "
                           f"{workers} workers")
    dist.barrier()


def set_log_level(level: str) -> None:
    """The library's log level: "error", "warn" (the default, unless
    $EMB_LOG_LEVEL says otherwise), "info" or "debug". Lines go to
    stderr."""
    if level not in _lib.EMB_LOG_LEVELS:
        raise ValueError(f"bad log level {level!r}")
    _L.emb_log_set_level(_lib.EMB_LOG_LEVELS.index(level))


def initial_rows(init: str, seed: int, ids: ArrayLike,
                 dim: int) -> np.ndarray:
    """The values a table with this init and seed gives new rows of ids,
    float32 [n, dim], computed here without a server (as emb_init_row)."""
    cfg = _parse_init(init)
    ids = as_ids(ids)
    out = np.empty((ids.shape[0], dim), dtype=np.float32)
    for i, id_ in enumerate(ids.tolist()):
        _L.emb_init_row(byref(cfg), seed % 2**64, id_, _addr(out[i]), dim)
    return out


__all__ = ["Client", "Table", "CachedTable", "Future", "connect",
           "distributed_env", "DistributedEnv",
           "set_log_level", "as_ids", "initial_rows", "Error"]
