"""PyTorch modules whose weights live in embstore tables.

- :class:`Embedding` and :class:`EmbeddingBag` pull, in forward, the rows of
  the batch's distinct ids (through a worker cache when given a
  CachedTable), and push, in backward, the gradients of those rows only:
  no gradient of the whole table is ever made. The servers' optimizer
  applies them; a torch optimizer handles only the dense weights.
- :func:`prefetch` wraps a DataLoader so the rows of the next batches are
  fetched while the current one trains (cached tables).
- :class:`DenseParameters` keeps a module's dense parameters in an embstore
  table, pulled each step and pushed after backward (MindSpore's
  ``set_param_ps``), so data-parallel workers share one copy.

What ``state_dict()`` holds: the modules have no torch parameters (their
weights live on the servers), so each carries its table's spec (name, dim,
optimizer, init, seed) and its step as extra state; with ``save_rows=True``
also the rows of every id it trained, weights and optimizer state, which
``load_state_dict()`` assigns back to the table. Without them, loading into
a module whose table is empty warns: the embeddings are not in the state
dict.

Imported on its own (``import embstore.torch``): ``import embstore`` does
not need PyTorch. CPU tensors only. A module is used from one thread.
"""

from __future__ import annotations

import collections
import time
import warnings
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .client import CachedTable, Table

Source = Union[Table, CachedTable]


def unique_ids(ids: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """The distinct ids of a batch (sorted, as uint64, sharing no memory
    with ids) and the int64 inverse map: uniq[inverse] == ids.reshape(-1).
    Forward and prefetch both use it, so a prefetched batch compares equal
    to the one looked up."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.as_tensor(ids)
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8,
                         torch.uint8):
        raise TypeError(f"ids must be an integer tensor, not {ids.dtype}")
    uniq, inv = torch.unique(ids.reshape(-1).long(), sorted=True,
                             return_inverse=True)
    return uniq.numpy().view(np.uint64), inv


class _Rows(torch.autograd.Function):
    """forward: the rows of the distinct ids, float32 [u, dim], pulled from
    the module's source. backward: pushes their gradient, [u, dim]."""

    @staticmethod
    def forward(ctx, anchor, module, uniq):  # noqa: D401 (torch's API)
        rows = module._pull_rows(uniq)
        ctx.module = module
        ctx.uniq = uniq
        ctx.serial = module._serial
        return torch.from_numpy(rows)

    @staticmethod
    def backward(ctx, grad):
        ctx.module._push_rows(ctx.uniq, grad, ctx.serial)
        return None, None, None


# Version of the extra state the modules put in a state dict.
_STATE_FORMAT = 1


class _TableModule(nn.Module):
    """What Embedding and EmbeddingBag share: the source, the step count,
    the prefetch queue, the state dict's entry."""

    def __init__(self, source: Source, create_in_eval: bool = False,
                 save_rows: bool = False) -> None:
        super().__init__()
        if isinstance(source, CachedTable):
            self.cache: Optional[CachedTable] = source
            self.table: Table = source.table
        elif isinstance(source, Table):
            self.cache = None
            self.table = source
        else:
            raise TypeError("source must be an embstore Table or CachedTable,"
                            f" not {type(source).__name__}")
        self.embedding_dim = self.table.dim
        self.create_in_eval = create_in_eval
        self.step = 0
        """Pushes made (backward passes and push_empty calls): the step
        passed to the servers, for sync and stale:K tables."""
        # A leaf that requires grad, so that autograd calls _Rows.backward;
        # not a Parameter, so torch optimizers never see it.
        self._anchor = torch.zeros((), requires_grad=True)
        self._serial = 0  # forwards through the cache, to pair backward
        self._queued: collections.deque = collections.deque()
        self._pending: collections.deque = collections.deque()
        self.save_rows = save_rows
        """state_dict() carries the rows of the ids trained (else only the
        table's spec)."""
        self._seen: list[np.ndarray] = []  # with save_rows: ids trained
        self._seen_n = 0  # distinct ids in _seen after the last merge

    # ---- rows in and out ---------------------------------------------

    def _pull_rows(self, uniq: np.ndarray) -> np.ndarray:
        if self.save_rows:
            self._note_seen(uniq)
        if self.cache is None:
            return self.table.pull(uniq)
        if self._queued:
            if np.array_equal(self._queued[0], uniq):
                self._queued.popleft()
            else:
                # Used out of the order prefetched: the cache would keep
                # its queue full forever, so start the queue over.
                self.cache.cancel()
                self._queued.clear()
        rows = self.cache.lookup(uniq)
        self._serial += 1
        self._drain()
        return rows

    def _push_rows(self, uniq: np.ndarray, grad: torch.Tensor,
                   serial: int) -> None:
        g = grad.detach().to(torch.float32).contiguous().numpy()
        if self.cache is None:
            self.table.push(uniq, g, step=self.step)
        else:
            if serial != self._serial:
                raise RuntimeError(
                    "a module over a cached table needs each forward's "
                    "backward before the next forward")
            self.cache.push_grads(g)
        self.step += 1

    def _rows(self, uniq: np.ndarray) -> torch.Tensor:
        """Rows of uniq as a tensor [u, dim], in the autograd graph when
        training with grad enabled."""
        if self.training and torch.is_grad_enabled():
            return _Rows.apply(self._anchor, self, uniq)
        # Evaluation reads the servers; unseen ids are zeros and are not
        # created, unless create_in_eval.
        return torch.from_numpy(self.table.pull(uniq,
                                                create=self.create_in_eval))

    # ---- prefetch ----------------------------------------------------

    def prefetch(self, ids: torch.Tensor) -> None:
        """Announces a coming batch (in order); over a cached table its
        rows are fetched while earlier batches train. A no-op over a plain
        table, which pulls in forward."""
        if self.cache is None or self.cache.depth == 0:
            return
        self._pending.append(unique_ids(ids)[0])
        self._drain()

    def _drain(self) -> None:
        while self._pending and len(self._queued) < self.cache.depth:
            uniq = self._pending.popleft()
            if self.cache.prefetch(uniq):
                self._queued.append(uniq)
            # else: more distinct ids than the cache can pin; that batch's
            # lookup fetches it itself.

    def push_empty(self) -> None:
        """A step without examples (sync tables: every worker takes each
        step)."""
        self.table.push(np.empty(0, np.uint64),
                        np.empty((0, self.embedding_dim), np.float32),
                        step=self.step)
        self.step += 1

    # ---- state dict ----------------------------------------------------

    def _note_seen(self, uniq: np.ndarray) -> None:
        self._seen.append(uniq.copy())
        total = sum(len(a) for a in self._seen)
        if total > 2 * self._seen_n + 65536:  # merge now and then
            self._seen = [np.unique(np.concatenate(self._seen))]
            self._seen_n = len(self._seen[0])

    def seen_ids(self) -> np.ndarray:
        """With save_rows: the distinct ids trained so far (uint64,
        sorted); empty otherwise."""
        if not self._seen:
            return np.empty(0, np.uint64)
        self._seen = [np.unique(np.concatenate(self._seen))]
        self._seen_n = len(self._seen[0])
        return self._seen[0]

    def get_extra_state(self) -> dict:
        """What state_dict() holds for this module: the table's spec
        (Table.spec()), the step, and with save_rows the ids trained with
        their rows, float32 [n, row_floats] (weights then optimizer state;
        a write-back cache is flushed first so the rows are current)."""
        state = {"format": _STATE_FORMAT, **self.table.spec(),
                 "row_floats": self.table.row_floats, "step": self.step,
                 "ids": None, "rows": None}
        if self.save_rows:
            if self.cache is not None:
                self.cache.flush()
            ids = self.seen_ids()
            found = np.zeros(len(ids), dtype=np.bool_)
            rows = self.table.pull(ids, create=False, found=found,
                                   with_state=True)
            # ids evicted meanwhile have no row to save
            state["ids"] = torch.from_numpy(ids[found].view(np.int64))
            state["rows"] = torch.from_numpy(rows[found])
        return state

    def set_extra_state(self, state: dict) -> None:
        """load_state_dict()'s half: takes the step, and assigns saved rows
        to this module's table (with their optimizer state when the table's
        rows have the same layout). ValueError for another dim, or rows to
        load into a cache that already holds rows (load before training).
        Without rows, warns when this module's table is empty."""
        if not isinstance(state, dict) or \
                state.get("format") != _STATE_FORMAT:
            raise ValueError("not an embstore.torch module's state")
        if state["dim"] != self.embedding_dim:
            raise ValueError(f"state of table {state['name']!r} has dim "
                             f"{state['dim']}, this module's "
                             f"{self.table.name!r} {self.embedding_dim}")
        rows = state.get("rows")
        if rows is None:
            if self.table.stats().rows == 0:
                warnings.warn(
                    f"embstore.torch: the state dict holds no rows of table "
                    f"{state['name']!r} (saved without save_rows=True) and "
                    f"this module's table {self.table.name!r} is empty: its "
                    "embeddings start from the initializer", RuntimeWarning,
                    stacklevel=3)
        else:
            if self.cache is not None and self.cache.stats().rows:
                raise ValueError("load the state dict before training: the "
                                 "cache already holds rows")
            ids = state["ids"].numpy().view(np.uint64)
            rows = np.ascontiguousarray(rows.numpy(), dtype=np.float32)
            if state["row_floats"] == self.table.row_floats and \
                    state["optimizer"].split(":")[0] == self.table.optimizer:
                self.table.assign(ids, rows, with_state=True)
            else:
                warnings.warn(
                    f"embstore.torch: table {self.table.name!r} has another "
                    f"optimizer than the saved {state['name']!r}: weights "
                    "loaded, optimizer state dropped", RuntimeWarning,
                    stacklevel=3)
                self.table.assign(ids, np.ascontiguousarray(
                    rows[:, :self.embedding_dim]))
            if self.save_rows:
                self._note_seen(ids)
        self.step = int(state["step"])

    def _load_from_state_dict(self, state_dict, prefix, local_metadata,
                              strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        # A state dict saved before these modules had state has no entry:
        # accepted (strict or not), with a warning, as nothing is lost
        # that was not lost before.
        if prefix + "_extra_state" not in state_dict:
            warnings.warn(f"embstore.torch: no state for {prefix!r} (table "
                          f"{self.table.name!r}) in the state dict",
                          RuntimeWarning, stacklevel=3)
            return
        super()._load_from_state_dict(state_dict, prefix, local_metadata,
                                      strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def extra_repr(self) -> str:
        via = f", cached {self.cache.rows} rows" if self.cache else ""
        return f"{self.table.name!r}, dim={self.embedding_dim}{via}"


class Embedding(_TableModule):
    """Like torch.nn.Embedding, over an embstore table.

    forward(ids): ids an integer tensor of any shape [*] (int64 is taken
    as uint64 bit for bit); returns float32 [*, dim].

    Args:
        source: a Table, or a CachedTable (table.cached(...)) to read
            through the worker's cache.
        create_in_eval: in eval mode (or under torch.no_grad()) rows are
            read without creating missing ones, which read as zeros;
            True creates them as training does.
        save_rows: state_dict() carries the rows of every id trained
            (weights and optimizer state), and load_state_dict() assigns
            them back; else only the table's spec and the step.
    """

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        uniq, inv = unique_ids(ids)
        rows = self._rows(uniq)
        return F.embedding(inv, rows).reshape(*ids.shape, self.embedding_dim)


class EmbeddingBag(_TableModule):
    """Like torch.nn.EmbeddingBag (sum or mean of each bag's rows), over an
    embstore table.

    forward(ids, offsets=None): ids int [B, L] (B bags of L ids) or [N]
    with offsets int64 [B] (bag b starts at offsets[b]); returns float32
    [B, dim]. source, create_in_eval and save_rows as for Embedding.
    """

    def __init__(self, source: Source, mode: str = "sum",
                 create_in_eval: bool = False,
                 save_rows: bool = False) -> None:
        super().__init__(source, create_in_eval, save_rows)
        if mode not in ("sum", "mean"):
            raise ValueError(f"mode must be sum or mean, not {mode!r}")
        self.mode = mode

    def forward(self, ids: torch.Tensor,
                offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
        if ids.dim() == 2:
            if offsets is not None:
                raise ValueError("offsets go with 1-D ids only")
            offsets = torch.arange(0, ids.numel(), max(ids.shape[1], 1),
                                   dtype=torch.int64)[:ids.shape[0]]
        elif ids.dim() != 1 or offsets is None:
            raise ValueError("ids must be [B, L], or [N] with offsets")
        uniq, inv = unique_ids(ids)
        rows = self._rows(uniq)
        return F.embedding_bag(inv, rows, offsets.long(), mode=self.mode)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", mode={self.mode!r}"


def _select(batch: Any, get: Union[None, int, str, Callable]) -> Any:
    if get is None:
        return batch
    if callable(get):
        return get(batch)
    return batch[get]


def prefetch(loader: Iterable, modules: Mapping[_TableModule, Any],
             depth: int = 2) -> Iterator:
    """Yields the loader's batches in order, having read up to depth
    batches ahead and announced their ids to the modules, so a module over
    a cached table fetches their rows while the current batch trains (the
    cache queues as many as its own prefetch depth; a fetch overlaps only
    when its staleness >= that depth, see docs/cache.md).

    Args:
        loader: any iterable of batches (a DataLoader).
        modules: {module: what gives its ids from a batch}: a key or index
            (batch[key]), a callable(batch), or None (the batch itself).
        depth: batches read ahead, >= 1.

    Each module must then see every batch, in order, once in forward
    (batches used out of order still train correctly, without prefetch).
    """
    if depth < 1:
        raise ValueError("depth must be >= 1")
    for m in modules:
        if not isinstance(m, _TableModule):
            raise TypeError("modules maps embstore.torch modules to keys")
    it = iter(loader)
    ahead: collections.deque = collections.deque()

    def read_one() -> None:
        try:
            batch = next(it)
        except StopIteration:
            return
        for m, get in modules.items():
            m.prefetch(_select(batch, get))
        ahead.append(batch)

    for _ in range(depth):
        read_one()
    while ahead:
        batch = ahead.popleft()
        # Announced now, queued in the cache once this batch's lookup
        # frees a place: lookup(b), then prefetch(b + depth).
        read_one()
        yield batch


class DenseParameters:
    """Keeps the parameters of a module in an embstore table: pull() copies
    the servers' values into them (no copy: the parameters are views of
    the buffer the rows land in), push() sends their gradients for the
    table's optimizer to apply. Every data-parallel worker then trains one
    shared copy (MindSpore's set_param_ps).

    Args:
        module: its parameters (in parameters() order) are laid end to end
            and cut into rows of table.dim floats, ids first_id, first_id+1,
            ...
        table: a table of the servers, e.g. client.table("mlp", 256,
            optimizer="adam:lr=0.001", init="zeros").
        first_id: id of the first row.
        timeout_s: how long a worker other than rank 0 waits for rank 0 to
            store the initial values.

    The first worker (rank 0) stores the module's current values unless
    the table holds them already; the others wait for them. Afterwards the
    module's parameters hold the servers' values.
    """

    def __init__(self, module: nn.Module, table: Table, first_id: int = 0,
                 timeout_s: float = 300.0) -> None:
        self.table = table
        self.params = [p for p in module.parameters()]
        self.numel = sum(p.numel() for p in self.params)
        dim = table.dim
        nrows = (self.numel + dim - 1) // dim
        self.ids = np.arange(first_id, first_id + nrows, dtype=np.uint64)
        self._flat = np.zeros((nrows, dim), dtype=np.float32)
        self._grad = np.zeros((nrows, dim), dtype=np.float32)
        flat = torch.from_numpy(self._flat).view(-1)
        self._gflat = torch.from_numpy(self._grad).view(-1)
        self.step = 0
        """Pushes made: the step passed to the servers."""
        off = 0
        for p in self.params:
            if p.dtype != torch.float32:
                raise TypeError("DenseParameters takes float32 parameters")
            n = p.numel()
            flat[off:off + n].copy_(p.detach().reshape(-1))
            p.data = flat[off:off + n].view_as(p)
            off += n
        self._init(timeout_s)

    def _init(self, timeout_s: float) -> None:
        found = np.zeros(len(self.ids), dtype=np.bool_)
        scratch = np.empty_like(self._flat)
        deadline = time.monotonic() + timeout_s
        while True:
            self.table.pull(self.ids, scratch, create=False, found=found)
            if found.all():
                break
            if self.table.client.rank == 0:
                self.table.assign(self.ids, self._flat)
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"rows of {self.table.name} did not "
                                   f"appear in {timeout_s} s")
            time.sleep(0.02)
        self.pull()

    def pull(self) -> None:
        """Copies the servers' values into the parameters."""
        self.table.pull(self.ids, self._flat)

    def push(self) -> None:
        """Sends the parameters' gradients (missing ones count as zeros)
        at this step and clears them."""
        self._grad.fill(0.0)
        off = 0
        for p in self.params:
            n = p.numel()
            if p.grad is not None:
                self._gflat[off:off + n].copy_(p.grad.reshape(-1))
                p.grad = None
            off += n
        self.table.push(self.ids, self._grad, step=self.step)
        self.step += 1

    def push_empty(self) -> None:
        """A step without examples (sync tables)."""
        self.table.push(np.empty(0, np.uint64),
                        np.empty((0, self.table.dim), np.float32),
                        step=self.step)
        self.step += 1


__all__ = ["Embedding", "EmbeddingBag", "DenseParameters", "prefetch",
           "unique_ids"]


# TorchRec-shaped modules: EmbeddingBagCollection, EmbeddingCollection,
# their configs and KeyedJaggedTensor (python/embstore/_torchrec.py).
from ._torchrec import *  # noqa: E402,F401,F403
