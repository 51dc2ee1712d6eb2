"""PyTorch modules whose weights live in embstore tables.

- :class:`Embedding` and :class:`EmbeddingBag` pull, in forward, the rows of
  the batch's distinct ids (through a worker cache when given a
  CachedTable); backward records the gradients of those rows only (no
  gradient of the whole table is ever made) and
  :class:`SparseOptimizer`'s ``step()`` pushes them, beside the dense
  optimizer's step, so GradScaler unscaling, clipping and accumulation
  over micro-batches see them as they see torch's sparse embeddings'. The
  servers' optimizer applies them; a torch optimizer handles only the
  dense weights.
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

Devices: ids may be on any device; rows come back on the ids' device
(through pinned host memory and non-blocking copies when CUDA is present),
and gradients from any device and dtype are pushed as float32 from the CPU.

Imported on its own (``import embstore.torch``): ``import embstore`` does
not need PyTorch. A module is used from one thread.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import time
from pathlib import Path
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
    # inv stays on the ids' device; the ids go to the host for the servers
    return uniq.cpu().numpy().view(np.uint64), inv


class _Slot:
    """The gradients recorded for one (module, source) and not pushed yet:
    pieces (distinct ids, float32 grads [u, dim]) summed at merge() into
    one leaf tensor whose .grad GradScaler and clipping act on."""

    __slots__ = ("source", "step", "ids", "grads", "leaf", "uniq", "serial")

    def __init__(self, source: Source) -> None:
        self.source = source
        self.step = 0  # pushes made: the step passed to the servers
        self.ids: list[np.ndarray] = []
        self.grads: list[torch.Tensor] = []
        self.leaf: Optional[torch.Tensor] = None
        self.uniq: Optional[np.ndarray] = None
        self.serial = 0  # cached sources: lookups made, to pair backward

    @property
    def pending(self) -> bool:
        return bool(self.ids)

    def add(self, uniq: np.ndarray, grad: torch.Tensor) -> None:
        if isinstance(self.source, CachedTable) and self.ids:
            raise RuntimeError(
                f"table {self.source.table.name!r} is read through a "
                "CachedTable: one forward and backward per "
                "SparseOptimizer.step() (no accumulation over micro-batches)")
        self.ids.append(uniq)
        self.grads.append(grad.detach().to(torch.float32))
        self.leaf = None

    def merge(self) -> Optional[torch.Tensor]:
        """The leaf holding the sum of the pieces as .grad (None when
        nothing is pending); built once per step, so that in-place changes
        to its .grad (unscaling, clipping) are what step() pushes."""
        if not self.ids:
            return None
        if self.leaf is not None:
            return self.leaf
        if len(self.ids) == 1:
            uniq, grad = self.ids[0], self.grads[0]
        else:
            uniq, inv = np.unique(np.concatenate(self.ids),
                                  return_inverse=True)
            dev = self.grads[0].device
            grad = torch.zeros((len(uniq), self.grads[0].shape[1]),
                               dtype=torch.float32, device=dev)
            grad.index_add_(0, torch.from_numpy(inv.astype(np.int64)).to(dev),
                            torch.cat([g.to(dev) for g in self.grads]))
        self.ids, self.grads = [uniq], [grad]
        # A leaf of the grad's shape that owns a single float: .grad must
        # match its size, and the values live in .grad alone.
        leaf = torch.zeros((), dtype=torch.float32,
                           device=grad.device).expand(grad.shape)
        leaf.grad = grad
        self.leaf, self.uniq = leaf, uniq
        return leaf

    def take(self) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(ids, float32 host grads) to push, and forgets them."""
        leaf = self.merge()
        if leaf is None:
            return None
        g = leaf.grad if leaf.grad is not None else \
            torch.zeros(leaf.shape, dtype=torch.float32)
        out = g.detach().to("cpu", torch.float32).contiguous().numpy()
        uniq = self.uniq
        self.clear()
        return uniq, out

    def clear(self) -> None:
        self.ids, self.grads = [], []
        self.leaf, self.uniq = None, None


def _slots(module: nn.Module) -> dict:
    """module's {id(source): _Slot}, made on first use."""
    return module.__dict__.setdefault("_embstore_slots", {})


def _slot(module: nn.Module, source: Source) -> _Slot:
    slots = _slots(module)
    slot = slots.get(id(source))
    if slot is None:
        slot = slots[id(source)] = _Slot(source)
    return slot


def _record_grads(module: nn.Module, source: Source, uniq: np.ndarray,
                  grad: torch.Tensor) -> None:
    """Records the gradient of rows of source, for SparseOptimizer.step()
    to push. Called from an autograd Function's backward.

    Contract: module is the nn.Module that pulled the rows (a
    SparseOptimizer over a model finds every module in model.modules()
    that has recorded, or called _check_unpushed, once); source its Table
    or CachedTable; uniq the distinct ids of the rows (uint64, 1-D, owned:
    not modified afterwards); grad their gradient, [len(uniq), source.dim],
    any dtype and device (kept on its device until the push, as float32).
    Several calls before a step() are summed per id (micro-batches);
    over a CachedTable only one is allowed per step (RuntimeError), with
    uniq the very ids given to its lookup().
    """
    if grad.shape != (len(uniq), source.dim):
        raise ValueError(f"gradient of shape {tuple(grad.shape)} for "
                         f"{len(uniq)} rows of dim {source.dim}")
    _slot(module, source).add(uniq, grad)


def _check_unpushed(module: nn.Module, source: Source) -> None:
    """Called by a module's training forward before it pulls rows of
    source: raises RuntimeError when gradients recorded earlier would be
    lost (no SparseOptimizer owns the module), or could not be accumulated
    (a CachedTable needs its batch pushed before the next lookup)."""
    slot = _slot(module, source)
    if not slot.pending:
        return
    name = source.table.name if isinstance(source, CachedTable) \
        else source.name
    if not module.__dict__.get("_embstore_owned"):
        raise RuntimeError(
            f"the gradients of table {name!r} from the last backward were "
            "never pushed: create embstore.torch.SparseOptimizer(model) and "
            "call its step() (and zero_grad()) each step")
    if isinstance(source, CachedTable):
        raise RuntimeError(
            f"table {name!r} is read through a CachedTable: call "
            "SparseOptimizer.step() or zero_grad() before the next forward "
            "(no accumulation over micro-batches)")


def _to_device(rows: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return rows
    return rows.to(device, non_blocking=True)


class _Rows(torch.autograd.Function):
    """forward: the rows of the distinct ids, float32 [u, dim], pulled from
    the module's source onto device. backward: records their gradient
    [u, dim] for SparseOptimizer.step()."""

    @staticmethod
    def forward(ctx, anchor, module, uniq, device):  # noqa: D401
        rows = module._pull_rows(uniq, device)
        ctx.module = module
        ctx.uniq = uniq
        ctx.serial = module._slot.serial
        return rows

    @staticmethod
    def backward(ctx, grad):
        ctx.module._record(ctx.uniq, grad, ctx.serial)
        return None, None, None, None


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
        self._source = source
        self._slot = _slot(self, source)
        # A leaf that requires grad, so that autograd calls _Rows.backward;
        # not a Parameter, so torch optimizers never see it.
        self._anchor = torch.zeros((), requires_grad=True)
        self._queued: collections.deque = collections.deque()
        self._pending: collections.deque = collections.deque()
        self.save_rows = save_rows
        """state_dict() carries the rows of the ids trained (else only the
        table's spec)."""
        self._seen: list[np.ndarray] = []  # with save_rows: ids trained
        self._seen_n = 0  # distinct ids in _seen after the last merge

    @property
    def step(self) -> int:
        """Pushes made (SparseOptimizer steps that pushed this module's
        gradients, and push_empty calls): the step passed to the servers,
        for sync and stale:K tables."""
        return self._slot.step

    @step.setter
    def step(self, value: int) -> None:
        self._slot.step = int(value)

    # ---- rows in and out ---------------------------------------------

    def _pull_rows(self, uniq: np.ndarray,
                   device: torch.device) -> torch.Tensor:
        """Rows of uniq on device: pulled into pinned host memory when
        they go to a CUDA device, then copied without blocking."""
        if self.save_rows:
            self._note_seen(uniq)
        out = torch.empty((len(uniq), self.embedding_dim),
                          dtype=torch.float32,
                          pin_memory=device.type == "cuda" and
                          torch.cuda.is_available())
        self._fill_rows(uniq, out.numpy())
        return _to_device(out, device)

    def _fill_rows(self, uniq: np.ndarray, out: np.ndarray) -> None:
        if self.cache is None:
            self.table.pull(uniq, out)
            return
        if self._queued:
            if np.array_equal(self._queued[0], uniq):
                self._queued.popleft()
            else:
                # Used out of the order prefetched: the cache would keep
                # its queue full forever, so start the queue over.
                self.cache.cancel()
                self._queued.clear()
        self.cache.lookup(uniq, out)
        self._slot.serial += 1
        self._drain()

    def _record(self, uniq: np.ndarray, grad: torch.Tensor,
                serial: int) -> None:
        if self.cache is not None and serial != self._slot.serial:
            raise RuntimeError(
                "a module over a cached table needs each forward's "
                "backward before the next forward")
        _record_grads(self, self._source, uniq, grad)

    def _rows(self, uniq: np.ndarray, device: torch.device) -> torch.Tensor:
        """Rows of uniq as a tensor [u, dim] on device, in the autograd
        graph when training with grad enabled."""
        if self.training and torch.is_grad_enabled():
            _check_unpushed(self, self._source)
            return _Rows.apply(self._anchor, self, uniq, device)
        # Evaluation reads the servers; unseen ids are zeros and are not
        # created, unless create_in_eval.
        return _to_device(torch.from_numpy(self.table.pull(
            uniq, create=self.create_in_eval)), device)

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
        rows = self._rows(uniq, inv.device)
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
                                   dtype=torch.int64,
                                   device=ids.device)[:ids.shape[0]]
        elif ids.dim() != 1 or offsets is None:
            raise ValueError("ids must be [B, L], or [N] with offsets")
        uniq, inv = unique_ids(ids)
        rows = self._rows(uniq, inv.device)
        return F.embedding_bag(inv, rows, offsets.to(inv.device).long(),
                               mode=self.mode)

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


class SparseOptimizer:
    """Pushes the embedding gradients that backward recorded, at step(),
    as torch.optim optimizers apply theirs; used beside the dense
    optimizer::

        sparse = embstore.torch.SparseOptimizer(model)
        dense = torch.optim.Adam(model.parameters())
        for batch in loader:
            loss(model, batch).backward()
            dense.step(); sparse.step()
            dense.zero_grad(); sparse.zero_grad()

    Args:
        model: a module holding embstore modules (any depth), or one of
            them. Every module in model.modules() that records gradients
            (Embedding, EmbeddingBag, and the collections built on
            _record_grads) is this optimizer's; a module's training
            forward raises RuntimeError when gradients it recorded were
            never pushed and no SparseOptimizer owns it.

    Until step(), the gradients of each module (summed over the backward
    passes since the last step or zero_grad, per id: micro-batches) are
    the .grad of leaf tensors in param_groups[0]["params"], so
    ``GradScaler.step(sparse)`` unscales them, checks them for inf/NaN and
    skips step() as it does for a torch optimizer, and
    :func:`clip_grad_norm_` clips them with the dense gradients. The
    leaves are no model parameters: DDP and the dense optimizer never see
    them. The learning rate is the servers' (each table's optimizer).
    """

    # GradScaler: step() is a plain step on unscaled gradients
    _step_supports_amp_scaling = False

    def __init__(self, model: nn.Module) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError("SparseOptimizer takes an nn.Module, not "
                            f"{type(model).__name__}")
        self.model = model
        self.defaults: dict = {}
        self.state: dict = {}
        if not self._owned():
            raise ValueError("the model has no embstore.torch module")

    def _owned(self) -> list[nn.Module]:
        mods = [m for m in self.model.modules()
                if "_embstore_slots" in m.__dict__]
        for m in mods:
            m.__dict__["_embstore_owned"] = True
        return mods

    def _slots(self) -> list[_Slot]:
        return [s for m in self._owned() for s in _slots(m).values()]

    @property
    def param_groups(self) -> list[dict]:
        """One group whose params are the leaves holding the pending
        gradients, summed per id (made again after each step)."""
        leaves = [s.merge() for s in self._slots() if s.pending]
        return [{"params": leaves}]

    def grad_tensors(self) -> list[torch.Tensor]:
        """The leaves whose .grad are the pending gradients (to clip them
        with torch.nn.utils.clip_grad_norm_ alongside dense ones)."""
        return self.param_groups[0]["params"]

    def step(self, closure: Optional[Callable] = None) -> Any:
        """Pushes every pending gradient (those of the tables read
        directly in one Client.push_many per step value; a CachedTable's
        through its push_grads) and forgets them."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        by_client: dict = {}
        for slot in self._slots():
            got = slot.take()
            if got is None:
                continue
            uniq, g = got
            if isinstance(slot.source, CachedTable):
                slot.source.push_grads(g)
            else:
                key = (id(slot.source.client), slot.step)
                by_client.setdefault(key, (slot.source.client, []))[1] \
                    .append((slot.source, uniq, g))
            slot.step += 1
        for (_, step), (client, reqs) in by_client.items():
            client.push_many(reqs, step=step)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops the pending gradients (a step GradScaler skipped, or
        gradients not wanted)."""
        for slot in self._slots():
            slot.clear()

    def state_dict(self) -> dict:
        """The steps of the tables (their optimizer state lives on the
        servers: embstore.torch.save writes it)."""
        return {"steps": [s.step for s in self._slots()]}

    def load_state_dict(self, state: dict) -> None:
        slots = self._slots()
        steps = state.get("steps", [])
        if len(steps) != len(slots):
            raise ValueError(f"state of {len(steps)} tables for "
                             f"{len(slots)}")
        for s, step in zip(slots, steps):
            s.step = int(step)


def clip_grad_norm_(parameters: Union[torch.Tensor, Iterable[torch.Tensor]],
                    max_norm: float, sparse: Optional[SparseOptimizer] = None,
                    norm_type: float = 2.0) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ over parameters and the pending
    embedding gradients of sparse: the norm of them all, and every
    gradient scaled by the same factor, as torch does for
    nn.Embedding(sparse=True) (whose sparse grads it sums per row)."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = list(parameters)
    if sparse is not None:
        params += sparse.grad_tensors()
    return torch.nn.utils.clip_grad_norm_(params, max_norm,
                                          norm_type=norm_type)


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

# ---- save and load -------------------------------------------------------

_SAVE_FORMAT = 1


def _tables(model: nn.Module) -> list[tuple[Table, Optional[CachedTable]]]:
    """The distinct tables model's embstore modules read, in module order
    (a table read by two modules, or two caches, once)."""
    out: dict = {}
    for m in model.modules():
        for slot in _slots(m).values():
            src = slot.source
            table = src.table if isinstance(src, CachedTable) else src
            cache = src if isinstance(src, CachedTable) else None
            key = (id(table.client), table.name)
            if key not in out or out[key][1] is None:
                out[key] = (table, cache)
    return list(out.values())


def _cli() -> str:
    """The embstore command: $EMBSTORE_CLI; the build tree's
    tools/embstore next to a checkout's library; else on PATH."""
    env = os.environ.get("EMBSTORE_CLI")
    if env:
        return env
    from . import _lib
    lib = Path(getattr(_lib.lib, "_name", "") or "")
    if lib.parent.name == "worker" and lib.parent.parent.name == "src":
        cand = lib.parent.parent.parent / "tools" / "embstore"
        if cand.exists():
            return str(cand)
    found = shutil.which("embstore")
    if not found:
        raise FileNotFoundError("the embstore command is not on PATH (set "
                                "EMBSTORE_CLI to its path)")
    return found


def _run_cli(table: Table, args: list[str]) -> None:
    client = table.client
    cmd = [_cli(), *args, "--servers", client.servers, "--transport",
           client.transport, "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:2])} of table {table.name!r} "
                           f"failed ({r.returncode}): {r.stderr.strip()}")


def _table_dir(root: Path, i: int, table: Table) -> Path:
    return root / "tables" / f"{i}-{table.name}"


def save(model: nn.Module, dir: Union[str, os.PathLike],
         optimizer: Optional[SparseOptimizer] = None,
         dense_optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Writes model's embeddings and dense state to dir (made if missing).

    dir/tables/<i>-<name>/: a consistent dump (``embstore dump
    --consistent``) of every table model's embstore modules read (write-
    back caches flushed first): each server's rows, weights and optimizer
    state, as of one instant between two push batches. dir/dense.pt:
    torch.save of model.state_dict() (the modules' table specs and steps),
    and the optimizers' state dicts. Call it between steps; with several
    workers, from one after a barrier, so no push lands between the
    tables' instants. Runs the embstore command (see _cli) with the
    client's servers and transport; EMB_AUTH_TOKEN_FILE passes a token.
    RuntimeError if a dump fails.
    """
    root = Path(dir)
    tables = _tables(model)
    if not tables:
        raise ValueError("the model has no embstore.torch module")
    (root / "tables").mkdir(parents=True, exist_ok=True)
    names = []
    for i, (table, cache) in enumerate(tables):
        if cache is not None:
            cache.flush()
        out = _table_dir(root, i, table)
        if out.exists():
            shutil.rmtree(out)  # the dump wants an empty directory
        _run_cli(table, ["dump", "--table", table.name, "--out", str(out),
                         "--consistent"])
        names.append(table.name)
    state = {"format": _SAVE_FORMAT, "tables": names,
             "model": model.state_dict(),
             "optimizer": optimizer.state_dict() if optimizer else None,
             "dense_optimizer":
                 dense_optimizer.state_dict() if dense_optimizer else None}
    tmp = root / "dense.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, root / "dense.pt")


def load(model: nn.Module, dir: Union[str, os.PathLike],
         optimizer: Optional[SparseOptimizer] = None,
         dense_optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Restores what save() wrote into model (built as it was, over tables
    of the same dims and optimizers, on this or another cluster of any
    size): each table's rows are assigned back (``embstore restore``,
    made if missing), then the state dicts are loaded. Rows of ids created
    after the save stay in a table loaded into; a fresh table holds
    exactly the saved ones. Pending gradients are dropped; a cache over a
    table must not hold rows yet (load before training through it).
    """
    root = Path(dir)
    state = torch.load(root / "dense.pt")
    if not isinstance(state, dict) or state.get("format") != _SAVE_FORMAT:
        raise ValueError(f"{root}: not an embstore.torch.save directory")
    tables = _tables(model)
    if len(tables) != len(state["tables"]):
        raise ValueError(f"{root} holds {len(state['tables'])} tables, the "
                         f"model reads {len(tables)}")
    for i, (table, cache) in enumerate(tables):
        if cache is not None and cache.stats().rows:
            raise ValueError("load before training: the cache of table "
                             f"{table.name!r} already holds rows")
        src = root / "tables" / f"{i}-{state['tables'][i]}"
        _run_cli(table, ["restore", "--in", str(src), "--table",
                         table.name])
    for m in model.modules():
        for slot in _slots(m).values():
            slot.clear()
    model.load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        optimizer.load_state_dict(state["optimizer"])
    if dense_optimizer is not None and state["dense_optimizer"] is not None:
        dense_optimizer.load_state_dict(state["dense_optimizer"])


__all__ = ["Embedding", "EmbeddingBag", "SparseOptimizer", "clip_grad_norm_",
           "DenseParameters", "prefetch", "unique_ids", "save", "load"]


# TorchRec-shaped modules: EmbeddingBagCollection, EmbeddingCollection,
# their configs and KeyedJaggedTensor (python/embstore/_torchrec.py).
from ._torchrec import *  # noqa: E402,F401,F403
