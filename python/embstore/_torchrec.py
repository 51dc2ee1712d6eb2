"""TorchRec-shaped modules over embstore tables: configs, KeyedJaggedTensor,
KeyedTensor, EmbeddingBagCollection and EmbeddingCollection, with
TorchRec's names, fields and defaults (torchrec.modules.embedding_configs,
torchrec.sparse.jagged_tensor, torchrec.modules.embedding_modules), so a
model written for TorchRec runs here with ``client=`` added to its
collections. Re-exported by embstore.torch.

A collection holds many tables (each config's ``name`` is its embstore
table's name) and reads all of them for a step at once: forward gathers
each table's distinct ids over every feature it serves and makes ONE
``Client.pull_many`` call for all tables, then pools on the torch side
with differentiable ops over the pulled rows, so autograd gives the
gradient of each table's distinct rows only; backward records those, and
``embstore.torch.SparseOptimizer.step()`` pushes every table's in one
``Client.push_many`` call. No gradient of a whole table is made.

What differs from TorchRec: no sharding planner or DistributedModelParallel
(the servers shard every table by id hash), ``num_embeddings`` is not a
bound (tables hold any 64-bit id, int64 taken bit for bit as uint64), rows
are float32 only, initial values come from the servers' initializer
(``init``, by default TorchRec's uniform(-sqrt(1/dim), sqrt(1/dim))), and
the optimizer of each table runs on the servers (``optimizer``).

A module is used from one thread. Ids may be on any device: they are
read, and rows pooled, on the CPU, and the output goes to the ids' device
(``device=`` is taken for TorchRec's sake and does not change that).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum, unique
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .client import Client, Table
# Defined before torch.py imports this module (at its end).
from .torch import _check_unpushed, _record_grads, _slot


@unique
class PoolingType(Enum):
    """How an EmbeddingBagCollection reduces a bag's rows: TorchRec's SUM,
    MEAN and NONE (no pooling: EmbeddingCollection's), and MAX (torch's
    EmbeddingBag mode="max")."""

    SUM = "SUM"
    MEAN = "MEAN"
    MAX = "MAX"
    NONE = "NONE"


@unique
class DataType(Enum):
    """TorchRec's DataType: how the servers keep a table's weights. FP32,
    FP16, BF16 and INT8 are embstore's row formats (Client.table()'s
    row_format); INT4 and INT2 have none and are refused. The lookups give
    float32 whatever the format."""

    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"
    INT8 = "INT8"
    INT4 = "INT4"
    INT2 = "INT2"


# DataType -> Client.table()'s row_format.
_ROW_FORMATS = {DataType.FP32: "fp32", DataType.FP16: "fp16",
                DataType.BF16: "bf16", DataType.INT8: "int8"}


@dataclass
class BaseEmbeddingConfig:
    """One table: TorchRec's fields first (same names, order and
    defaults), then embstore's.

    Args:
        num_embeddings: TorchRec's row count; kept for compatibility and
            not a bound (an embstore table holds any 64-bit id).
        embedding_dim: floats per row, 1..4096.
        name: the embstore table's name (1..63 bytes of [A-Za-z0-9_.-]);
            the collection creates it, or opens an identical one.
        data_type: how the servers keep the weights: DataType.FP32, FP16,
            BF16 or INT8 (Client.table()'s row_format); the optimizer and
            the modules' outputs stay float32.
        feature_names: the KeyedJaggedTensor keys this table embeds; empty
            means [name], as in TorchRec.
        weight_init_max, weight_init_min: bounds of TorchRec's default
            uniform initializer (+-sqrt(1/embedding_dim) when None), used
            when init is None.
        init_fn: TorchRec's callable initializer; refused (rows are made
            on the servers): use init.
        optimizer: the servers' optimizer for this table, as
            Client.table() takes it ("adagrad:lr=0.05", "sgd:lr=0.1", ...).
        init: the servers' initializer ("zeros", "constant:V",
            "uniform:A,B", "normal:MEAN,STD"); None means
            "uniform:weight_init_min,weight_init_max".
        seed: with the id, decides a new row's values.
        mode: "async", "sync" or "stale:K", as Client.table() takes it.
        padding_idx: an id whose rows contribute nothing (left out of its
            bag, as torch's EmbeddingBag padding_idx; zeros in an
            EmbeddingCollection) and are never pulled nor pushed.
    """

    num_embeddings: int
    embedding_dim: int
    name: str = ""
    data_type: DataType = DataType.FP32
    feature_names: List[str] = field(default_factory=list)
    weight_init_max: Optional[float] = None
    weight_init_min: Optional[float] = None
    init_fn: Optional[Callable[[torch.Tensor], Any]] = None
    optimizer: str = "adagrad:lr=0.05"
    init: Optional[str] = None
    seed: int = 0
    mode: str = "async"
    padding_idx: Optional[int] = None

    def get_weight_init_max(self) -> float:
        if self.weight_init_max is None:
            return math.sqrt(1 / self.embedding_dim)
        return self.weight_init_max

    def get_weight_init_min(self) -> float:
        if self.weight_init_min is None:
            return -math.sqrt(1 / self.embedding_dim)
        return self.weight_init_min

    def num_features(self) -> int:
        return len(self.feature_names)

    def table_init(self) -> str:
        """The servers' initializer string for this table."""
        if self.init is not None:
            return self.init
        return (f"uniform:{self.get_weight_init_min()!r},"
                f"{self.get_weight_init_max()!r}")


@dataclass
class EmbeddingBagConfig(BaseEmbeddingConfig):
    """A table whose features are pooled (EmbeddingBagCollection):
    pooling is PoolingType.SUM (the default), MEAN or MAX."""

    pooling: PoolingType = PoolingType.SUM


@dataclass
class EmbeddingConfig(BaseEmbeddingConfig):
    """A table whose features are looked up row by row
    (EmbeddingCollection)."""


# ---- jagged tensors ----------------------------------------------------


def _offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    """[0, l0, l0+l1, ...]: n + 1 offsets of n lengths."""
    return torch.cat([lengths.new_zeros(1, dtype=torch.int64),
                      torch.cumsum(lengths, 0, dtype=torch.int64)])


def _lengths_of(offsets: torch.Tensor) -> torch.Tensor:
    return offsets[1:] - offsets[:-1]


class JaggedTensor:
    """Rows of variable length: values, and lengths (or offsets) saying
    how many belong to each row, optional weights alongside values
    (TorchRec's JaggedTensor)."""

    def __init__(self, values: torch.Tensor,
                 weights: Optional[torch.Tensor] = None,
                 lengths: Optional[torch.Tensor] = None,
                 offsets: Optional[torch.Tensor] = None) -> None:
        self._values = values
        self._weights = weights
        if lengths is None and offsets is None:
            raise ValueError("a JaggedTensor needs lengths or offsets")
        self._lengths = lengths
        self._offsets = offsets

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise ValueError("this JaggedTensor has no weights")
        return self._weights

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights

    def lengths(self) -> torch.Tensor:
        if self._lengths is None:
            self._lengths = _lengths_of(self._offsets)
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = _offsets_of(self._lengths)
        return self._offsets

    def to_dense(self) -> List[torch.Tensor]:
        """The values of each row, one tensor per row."""
        return list(torch.split(self._values, self.lengths().tolist()))

    def to(self, device: Union[str, torch.device],
           non_blocking: bool = False) -> "JaggedTensor":
        def mv(t):
            return None if t is None else t.to(device,
                                                non_blocking=non_blocking)
        return JaggedTensor(mv(self._values), mv(self._weights),
                            mv(self._lengths), mv(self._offsets))

    def __repr__(self) -> str:
        return (f"JaggedTensor(values={self._values}, "
                f"lengths={self.lengths()})")


def _check_jagged(keys: Sequence[str], values: torch.Tensor,
                  lengths: torch.Tensor, weights: Optional[torch.Tensor],
                  stride: Optional[int]) -> int:
    """Checks a KeyedJaggedTensor's parts and returns its stride (bags
    per key): ValueError or TypeError saying what is wrong."""
    if len(set(keys)) != len(keys):
        raise ValueError(f"KeyedJaggedTensor keys repeat: {list(keys)}")
    if not isinstance(values, torch.Tensor) or values.dim() != 1 or \
            values.dtype.is_floating_point or values.is_complex() or \
            values.dtype == torch.bool:
        raise TypeError("KeyedJaggedTensor values must be a 1-D integer "
                        "tensor of ids, not "
                        f"{getattr(values, 'dtype', type(values).__name__)}"
                        f" of shape {tuple(getattr(values, 'shape', ()))}")
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1 or \
            lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise TypeError("KeyedJaggedTensor lengths must be a 1-D integer "
                        "tensor")
    if stride is None:
        stride = lengths.numel() // len(keys) if keys else 0
    if lengths.numel() != len(keys) * stride:
        raise ValueError(f"KeyedJaggedTensor has {lengths.numel()} lengths,"
                         f" not {len(keys)} keys x stride {stride}")
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError("KeyedJaggedTensor lengths must be >= 0")
    total = int(lengths.sum()) if lengths.numel() else 0
    if total != values.numel():
        raise ValueError(f"KeyedJaggedTensor lengths sum to {total}, but "
                         f"there are {values.numel()} values")
    if weights is not None:
        if not isinstance(weights, torch.Tensor) or \
                not weights.dtype.is_floating_point or \
                weights.shape != values.shape:
            raise TypeError("KeyedJaggedTensor weights must be a floating "
                            f"tensor of shape {tuple(values.shape)}, one "
                            "per value")
    return stride


class KeyedJaggedTensor:
    """Sparse features of a batch (TorchRec's KeyedJaggedTensor): for F
    keys and B examples (the stride), values holds the ids of key 0's B
    bags, then key 1's, ...; lengths [F * B] gives each bag's size
    (offsets [F * B + 1] the same as prefix sums); weights, optional, one
    per value.

    Build it with from_lengths_sync or from_offsets_sync (which check it)
    or the constructor (TorchRec's arguments; checked too). A KJT from
    torchrec itself goes into the collections as it is.
    """

    def __init__(self, keys: List[str], values: torch.Tensor,
                 weights: Optional[torch.Tensor] = None,
                 lengths: Optional[torch.Tensor] = None,
                 offsets: Optional[torch.Tensor] = None,
                 stride: Optional[int] = None,
                 length_per_key: Optional[List[int]] = None,
                 offset_per_key: Optional[List[int]] = None,
                 **torchrec_only: Any) -> None:
        # TorchRec's other arguments (variable strides, inverse indices,
        # a jt_dict cache) are accepted when unset, as TorchRec code
        # passes them; set, they would change what the KJT means.
        for k, v in torchrec_only.items():
            if v is not None:
                raise ValueError(f"KeyedJaggedTensor: {k} is not supported")
        self._keys = list(keys)
        self._values = values
        self._weights = weights
        if lengths is None:
            if offsets is None:
                raise ValueError("a KeyedJaggedTensor needs lengths or "
                                 "offsets")
            if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 \
                    or offsets.numel() < 1 or int(offsets[0]) != 0:
                raise ValueError("KeyedJaggedTensor offsets must be 1-D, "
                                 "starting at 0")
            lengths = _lengths_of(offsets)
        self._lengths = lengths
        self._offsets = offsets
        self._stride = _check_jagged(self._keys, values, lengths, weights,
                                     stride)
        self._length_per_key = length_per_key
        self._offset_per_key = offset_per_key

    @staticmethod
    def from_lengths_sync(keys: List[str], values: torch.Tensor,
                          lengths: torch.Tensor,
                          weights: Optional[torch.Tensor] = None,
                          stride: Optional[int] = None
                          ) -> "KeyedJaggedTensor":
        return KeyedJaggedTensor(keys, values, weights, lengths=lengths,
                                 stride=stride)

    @staticmethod
    def from_offsets_sync(keys: List[str], values: torch.Tensor,
                          offsets: torch.Tensor,
                          weights: Optional[torch.Tensor] = None,
                          stride: Optional[int] = None
                          ) -> "KeyedJaggedTensor":
        return KeyedJaggedTensor(keys, values, weights, offsets=offsets,
                                 stride=stride)

    @staticmethod
    def from_jt_dict(jt_dict: Dict[str, JaggedTensor]) -> "KeyedJaggedTensor":
        """One KJT of JaggedTensors with the same number of rows."""
        keys = list(jt_dict)
        jts = list(jt_dict.values())
        ws = [jt.weights_or_none() for jt in jts]
        if any(w is None for w in ws) and not all(w is None for w in ws):
            raise ValueError("either every JaggedTensor has weights or none")
        vals = torch.cat([jt.values() for jt in jts]) if jts else \
            torch.empty(0, dtype=torch.int64)
        lens = torch.cat([jt.lengths() for jt in jts]) if jts else \
            torch.empty(0, dtype=torch.int64)
        weights = torch.cat(ws) if jts and ws[0] is not None else None
        return KeyedJaggedTensor(keys, vals, weights, lengths=lens)

    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def weights(self) -> torch.Tensor:
        if self._weights is None:
            raise ValueError("this KeyedJaggedTensor has no weights")
        return self._weights

    def weights_or_none(self) -> Optional[torch.Tensor]:
        return self._weights

    def lengths(self) -> torch.Tensor:
        return self._lengths

    def lengths_or_none(self) -> Optional[torch.Tensor]:
        return self._lengths

    def offsets(self) -> torch.Tensor:
        if self._offsets is None:
            self._offsets = _offsets_of(self._lengths)
        return self._offsets

    def offsets_or_none(self) -> Optional[torch.Tensor]:
        return self._offsets

    def stride(self) -> int:
        return self._stride

    def length_per_key(self) -> List[int]:
        """Values per key."""
        if self._length_per_key is None:
            self._length_per_key = self._lengths.reshape(
                len(self._keys), self._stride).sum(1).tolist() \
                if self._keys else []
        return self._length_per_key

    def offset_per_key(self) -> List[int]:
        """Where each key's values start, and the end: F + 1 entries."""
        if self._offset_per_key is None:
            out = [0]
            for n in self.length_per_key():
                out.append(out[-1] + n)
            self._offset_per_key = out
        return self._offset_per_key

    def __getitem__(self, key: str) -> JaggedTensor:
        try:
            k = self._keys.index(key)
        except ValueError:
            raise KeyError(f"{key!r} is not a key of this KeyedJaggedTensor"
                           f" ({self._keys})") from None
        opk = self.offset_per_key()
        a, b = opk[k], opk[k + 1]
        w = self._weights[a:b] if self._weights is not None else None
        s = self._stride
        return JaggedTensor(self._values[a:b], w,
                            lengths=self._lengths[k * s:(k + 1) * s])

    def to_dict(self) -> Dict[str, JaggedTensor]:
        """{key: JaggedTensor of its B bags}."""
        return {k: self[k] for k in self._keys}

    def to(self, device: Union[str, torch.device],
           non_blocking: bool = False) -> "KeyedJaggedTensor":
        def mv(t):
            return None if t is None else t.to(device,
                                                non_blocking=non_blocking)
        return KeyedJaggedTensor(self._keys, mv(self._values),
                                 mv(self._weights), mv(self._lengths),
                                 mv(self._offsets), self._stride,
                                 self._length_per_key, self._offset_per_key)

    def __repr__(self) -> str:
        return (f"KeyedJaggedTensor(keys={self._keys}, stride={self._stride},"
                f" values={self._values}, lengths={self._lengths})")


class KeyedTensor:
    """Pooled features (TorchRec's KeyedTensor): values [B, sum of dims],
    key i in columns offset_per_key()[i]:offset_per_key()[i + 1]."""

    def __init__(self, keys: List[str], length_per_key: List[int],
                 values: torch.Tensor, key_dim: int = 1) -> None:
        if key_dim != 1:
            raise ValueError("KeyedTensor keys run along dim 1")
        self._keys = list(keys)
        self._length_per_key = list(length_per_key)
        self._values = values
        self._key_dim = key_dim
        self._offset_per_key = [0]
        for n in self._length_per_key:
            self._offset_per_key.append(self._offset_per_key[-1] + n)

    def keys(self) -> List[str]:
        return self._keys

    def values(self) -> torch.Tensor:
        return self._values

    def key_dim(self) -> int:
        return self._key_dim

    def length_per_key(self) -> List[int]:
        return self._length_per_key

    def offset_per_key(self) -> List[int]:
        return self._offset_per_key

    def __getitem__(self, key: str) -> torch.Tensor:
        try:
            i = self._keys.index(key)
        except ValueError:
            raise KeyError(f"{key!r} is not a key of this KeyedTensor "
                           f"({self._keys})") from None
        return self._values[:, self._offset_per_key[i]:
                            self._offset_per_key[i + 1]]

    def to_dict(self) -> Dict[str, torch.Tensor]:
        """{key: its [B, dim] columns}."""
        return {k: self[k] for k in self._keys}

    def to(self, device: Union[str, torch.device],
           non_blocking: bool = False) -> "KeyedTensor":
        return KeyedTensor(self._keys, self._length_per_key,
                           self._values.to(device, non_blocking=non_blocking))

    def __repr__(self) -> str:
        return (f"KeyedTensor(keys={self._keys}, "
                f"length_per_key={self._length_per_key})")


# ---- the collections -------------------------------------------------


class _Features:
    """A KeyedJaggedTensor (embstore's or torchrec's, duck-typed on
    keys/values/lengths/weights_or_none/stride), checked, on the CPU, with
    each key's slice of values at hand."""

    def __init__(self, kjt: Any) -> None:
        for m in ("keys", "values", "lengths"):
            if not callable(getattr(kjt, m, None)):
                raise TypeError("features must be a KeyedJaggedTensor "
                                "(embstore.torch's or torchrec's), not "
                                f"{type(kjt).__name__}")
        self.keys = list(kjt.keys())
        values = kjt.values()
        self.device = values.device if isinstance(values, torch.Tensor) \
            else torch.device("cpu")
        lengths = kjt.lengths()
        wfn = getattr(kjt, "weights_or_none", None)
        weights = wfn() if callable(wfn) else None
        sfn = getattr(kjt, "stride", None)
        stride = int(sfn()) if callable(sfn) else None
        # Checked even when it is our own KJT (cheap: a sum), since a
        # torchrec KJT is not checked when built.
        self.stride = _check_jagged(self.keys, values, lengths, weights,
                                    stride)
        self.values = values.cpu().long()
        self.lengths = lengths.cpu().long()
        self.weights = None if weights is None else weights.cpu().float()
        per_key = self.lengths.reshape(len(self.keys), self.stride).sum(1) \
            .tolist() if self.keys else []
        self.start = {}
        off = 0
        for i, (k, n) in enumerate(zip(self.keys, per_key)):
            self.start[k] = (i, off, off + n)
            off += n

    def get(self, key: str, table: str, pad: Optional[int]
            ) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """Key's (ids, lengths [B], weights or None), padding ids left
        out."""
        if key not in self.start:
            raise ValueError(f"feature {key!r} of table {table!r} is not "
                             f"among the KeyedJaggedTensor's keys "
                             f"{self.keys}")
        i, a, b = self.start[key]
        ids = self.values[a:b]
        lens = self.lengths[i * self.stride:(i + 1) * self.stride]
        w = None if self.weights is None else self.weights[a:b]
        if pad is not None:
            keep = ids != pad
            if not bool(keep.all()):
                kept = _offsets_of(keep.long())
                lens = kept[_offsets_of(lens)]
                lens = lens[1:] - lens[:-1]
                ids = ids[keep]
                w = None if w is None else w[keep]
        return ids, lens, w


class _PullAll(torch.autograd.Function):
    """forward: the rows of every table's distinct ids, one float32
    [u_t, dim_t] tensor per table, from one pull_many. backward: records
    their gradients for SparseOptimizer.step()."""

    @staticmethod
    def forward(ctx, anchor, module, uniqs):  # noqa: D401 (torch's API)
        ctx.set_materialize_grads(False)
        ctx.module = module
        ctx.uniqs = uniqs
        rows = module._pull(uniqs, create=True)
        return tuple(torch.from_numpy(r) for r in rows)

    @staticmethod
    def backward(ctx, *grads):
        ctx.module._record(ctx.uniqs, grads)
        return None, None, None


# Version of the extra state the collections put in a state dict.
_STATE_FORMAT = 1


class _Collection(nn.Module):
    """What both collections share: the tables, the one pull of a step,
    the gradients recorded for SparseOptimizer, the step count, the state
    dict's entry."""

    def __init__(self, tables: Sequence[BaseEmbeddingConfig],
                 client: Optional[Client], device: Optional[torch.device],
                 create_in_eval: bool, config_type: type) -> None:
        super().__init__()
        if not isinstance(client, Client):
            raise TypeError(f"{type(self).__name__} needs client=, an "
                            "embstore Client (embstore.connect(...)): its "
                            "tables live on the servers")
        self._device = torch.device("cpu" if device is None else device)
        if self._device.type == "meta":
            # TorchRec's meta device defers materializing weights to a
            # sharder; here the rows are on the servers from the start.
            raise ValueError(f"{type(self).__name__} has no meta-device "
                             "form: its tables are on the servers")
        self.client = client
        self.create_in_eval = create_in_eval
        self._configs = list(tables)
        seen = set()
        self.tables: Dict[str, Table] = {}
        """{config name: its embstore Table}."""
        for c in self._configs:
            if not isinstance(c, config_type):
                raise TypeError(f"{type(self).__name__} takes "
                                f"{config_type.__name__}s, not "
                                f"{type(c).__name__}")
            if not c.name:
                raise ValueError("each config needs a name: it names its "
                                 "embstore table")
            if c.name in seen:
                raise ValueError(f"Duplicate table name {c.name}")
            seen.add(c.name)
            if c.data_type not in _ROW_FORMATS:
                raise ValueError(f"table {c.name!r}: embstore keeps rows "
                                 f"in FP32, FP16, BF16 or INT8, not "
                                 f"{c.data_type}")
            if c.init_fn is not None:
                raise ValueError(f"table {c.name!r}: init_fn cannot make rows"
                                 " on the servers; give init='uniform:A,B' "
                                 "(or weight_init_min/max) instead")
            if c.padding_idx is not None and not isinstance(c.padding_idx,
                                                            int):
                raise TypeError(f"table {c.name!r}: padding_idx must be an "
                                "int")
            if not c.feature_names:
                c.feature_names = [c.name]  # as TorchRec
            if len(set(c.feature_names)) != len(c.feature_names):
                raise ValueError(f"table {c.name!r} lists a feature twice: "
                                 f"{c.feature_names}")
        for c in self._configs:
            self.tables[c.name] = client.table(
                c.name, c.embedding_dim, optimizer=c.optimizer,
                init=c.table_init(), mode=c.mode, seed=c.seed,
                row_format=_ROW_FORMATS[c.data_type])
        self._table_list = [self.tables[c.name] for c in self._configs]
        # Where backward records each table's gradients (torch.py's
        # _Slot, one per table): SparseOptimizer(model) finds them, pushes
        # them all in one push_many per step, and save()/load() find the
        # tables.
        self._slots = [_slot(self, t) for t in self._table_list]
        # TorchRec's names: a feature read by several tables is
        # "feature@table" in the output.
        count: Dict[str, int] = {}
        for c in self._configs:
            for f in c.feature_names:
                count[f] = count.get(f, 0) + 1
        self._embedding_names = [[f if count[f] == 1 else f"{f}@{c.name}"
                                  for f in c.feature_names]
                                 for c in self._configs]
        # A leaf that requires grad, so that autograd calls
        # _PullAll.backward; not a Parameter: torch optimizers never see it.
        self._anchor = torch.zeros((), requires_grad=True)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def step(self) -> int:
        """Pushes made (SparseOptimizer steps and push_empty calls): the
        step passed to the servers, for sync and stale:K tables; every
        table of the collection takes each step."""
        return self._slots[0].step if self._slots else 0

    @step.setter
    def step(self, value: int) -> None:
        for s in self._slots:
            s.step = int(value)

    # ---- the step's pull and gradients ---------------------------------

    def _pull(self, uniqs: List[np.ndarray], create: bool
              ) -> List[np.ndarray]:
        return self.client.pull_many(list(zip(self._table_list, uniqs)),
                                     create=create)

    def _record(self, uniqs: List[np.ndarray],
                grads: Sequence[Optional[torch.Tensor]]) -> None:
        for t, u, g in zip(self._table_list, uniqs, grads):
            if g is None:
                # The loss did not use this table's rows: no gradient, as
                # torch's optimizers skip a weight whose grad is None, but
                # the table still takes the step (sync tables count them,
                # and the tables stay in one push_many).
                u = np.empty(0, np.uint64)
                g = torch.zeros((0, t.dim))
            _record_grads(self, t, u, g)

    def push_empty(self) -> None:
        """A step without examples (sync tables: every worker takes each
        step)."""
        step = self.step
        self.client.push_many(
            [(t, np.empty(0, np.uint64), np.empty((0, t.dim), np.float32))
             for t in self._table_list], step=step)
        self.step = step + 1

    def _lookup(self, feats: _Features):
        """Per table: its features' (ids, lengths, weights) and the
        inverse map of their ids into the table's distinct ids; and the
        rows of those ids, [u_t, dim_t] each, from one pull."""
        per_table = []
        uniqs = []
        for c in self._configs:
            parts = [feats.get(f, c.name, c.padding_idx)
                     for f in c.feature_names]
            ids = torch.cat([p[0] for p in parts])
            uniq, inv = torch.unique(ids, sorted=True, return_inverse=True)
            uniqs.append(uniq.numpy().view(np.uint64))
            invs = torch.split(inv, [p[0].numel() for p in parts])
            per_table.append([(iv, p[1], p[2]) for iv, p in zip(invs, parts)])
        if self.training and torch.is_grad_enabled():
            for t in self._table_list:
                _check_unpushed(self, t)
            rows = _PullAll.apply(self._anchor, self, uniqs)
        else:
            # Evaluation reads without creating rows (unseen ids read as
            # zeros), unless create_in_eval.
            rows = tuple(torch.from_numpy(r) for r in
                         self._pull(uniqs, create=self.create_in_eval))
        return per_table, rows

    # ---- state dict ----------------------------------------------------

    def get_extra_state(self) -> dict:
        """What state_dict() holds: each table's spec (Table.spec()) and
        the step (the rows stay on the servers: `embstore dump`)."""
        return {"format": _STATE_FORMAT, "step": self.step,
                "tables": [t.spec() for t in self._table_list]}

    def set_extra_state(self, state: dict) -> None:
        """Takes the step; ValueError for a state of other tables or dims."""
        if not isinstance(state, dict) or \
                state.get("format") != _STATE_FORMAT:
            raise ValueError("not an embstore.torch collection's state")
        saved = [(s["name"], s["dim"]) for s in state["tables"]]
        mine = [(t.name, t.dim) for t in self._table_list]
        if saved != mine:
            raise ValueError(f"state of tables {saved}, this collection's "
                             f"{mine}")
        self.step = int(state["step"])

    def extra_repr(self) -> str:
        return ", ".join(f"{c.name!r}: dim={c.embedding_dim} "
                         f"features={c.feature_names}"
                         for c in self._configs)


class EmbeddingBagCollection(_Collection):
    """TorchRec's EmbeddingBagCollection over embstore tables.

    forward(features: KeyedJaggedTensor) -> KeyedTensor of [B, sum of
    dims]: per table (in the order given), per feature (in feature_names
    order), the pooled rows of each bag (an empty bag gives zeros).

    Args:
        tables: EmbeddingBagConfigs; pooling SUM, MEAN or MAX.
        is_weighted: bags are pooled with the KJT's weights (SUM: the
            weighted sum; MEAN: the weighted sum over the bag's size, as
            TorchRec's fused kernels; MAX refuses weights).
        device: TorchRec's argument (kept as .device); the output goes to
            the device of the KJT's values, whatever it is.
        client: the embstore Client whose servers hold the tables
            (keyword only, required).
        create_in_eval: in eval mode (or under torch.no_grad()) rows are
            read without creating missing ones, which read as zeros;
            True creates them as training does.
    """

    def __init__(self, tables: List[EmbeddingBagConfig],
                 is_weighted: bool = False,
                 device: Optional[torch.device] = None, *,
                 client: Optional[Client] = None,
                 create_in_eval: bool = False) -> None:
        super().__init__(tables, client, device, create_in_eval,
                         EmbeddingBagConfig)
        self._is_weighted = is_weighted
        self._modes = []
        for c in self._configs:
            p = c.pooling
            if isinstance(p, str):
                p = PoolingType(p.upper())
            if p not in (PoolingType.SUM, PoolingType.MEAN, PoolingType.MAX):
                raise ValueError(f"table {c.name!r}: pooling {p} does not "
                                 "pool (EmbeddingCollection looks rows up "
                                 "unpooled)")
            if is_weighted and p == PoolingType.MAX:
                raise ValueError(f"table {c.name!r}: MAX pooling takes no "
                                 "weights (is_weighted=True)")
            self._modes.append(p.value.lower())
        self._keys = [n for names in self._embedding_names for n in names]
        self._lengths_per_key = [c.embedding_dim for c in self._configs
                                 for _ in c.feature_names]

    def is_weighted(self) -> bool:
        return self._is_weighted

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return self._configs

    def forward(self, features: Any) -> KeyedTensor:
        feats = _Features(features)
        if self._is_weighted and feats.weights is None:
            raise ValueError("is_weighted=True needs a KeyedJaggedTensor "
                             "with weights")
        per_table, rows = self._lookup(feats)
        pooled = []
        for mode, parts, r in zip(self._modes, per_table, rows):
            for inv, lens, w in parts:
                pooled.append(self._pool(mode, inv, lens, w, r, feats.stride))
        out = torch.cat(pooled, 1) if pooled else \
            torch.empty((feats.stride, 0))
        if feats.device.type != "cpu":
            out = out.to(feats.device)
        return KeyedTensor(self._keys, self._lengths_per_key, out)

    def _pool(self, mode: str, inv: torch.Tensor, lens: torch.Tensor,
              w: Optional[torch.Tensor], rows: torch.Tensor,
              bags: int) -> torch.Tensor:
        if bags == 0:
            return rows.new_zeros((0, rows.shape[1]))
        offsets = _offsets_of(lens)[:-1]
        if not self._is_weighted:
            return F.embedding_bag(inv, rows, offsets, mode=mode)
        # torch's embedding_bag weighs sums only: a weighted mean is the
        # weighted sum over the bag's size.
        out = F.embedding_bag(inv, rows, offsets, mode="sum",
                              per_sample_weights=w)
        if mode == "mean":
            out = out / lens.clamp(min=1).unsqueeze(1).to(out.dtype)
        return out


class EmbeddingCollection(_Collection):
    """TorchRec's EmbeddingCollection over embstore tables.

    forward(features: KeyedJaggedTensor) -> {feature: JaggedTensor} whose
    values are the rows of the feature's ids, float32 [n, dim], and whose
    lengths are the feature's (with need_indices, weights are the ids).
    A padding_idx id reads as zeros and gets no gradient. Tables may have
    different dims (TorchRec requires one).

    Args: tables (EmbeddingConfigs), device, need_indices, client,
    create_in_eval, as for EmbeddingBagCollection.
    """

    def __init__(self, tables: List[EmbeddingConfig],
                 device: Optional[torch.device] = None,
                 need_indices: bool = False, *,
                 client: Optional[Client] = None,
                 create_in_eval: bool = False) -> None:
        super().__init__(tables, client, device, create_in_eval,
                         EmbeddingConfig)
        self._need_indices = need_indices

    def need_indices(self) -> bool:
        return self._need_indices

    def embedding_configs(self) -> List[EmbeddingConfig]:
        return self._configs

    def embedding_names_by_table(self) -> List[List[str]]:
        return self._embedding_names

    def forward(self, features: Any) -> Dict[str, JaggedTensor]:
        feats = _Features(features)
        # Padding ids are left out of the pull and put back as zero rows:
        # _lookup drops them, so look each feature's ids up here again.
        per_table, rows = self._lookup(feats)
        out: Dict[str, JaggedTensor] = {}
        for c, names, parts, r in zip(self._configs, self._embedding_names,
                                      per_table, rows):
            for f, name, (inv, _, _) in zip(c.feature_names, names, parts):
                i, a, b = feats.start[f]
                ids = feats.values[a:b]
                lens = feats.lengths[i * feats.stride:(i + 1) * feats.stride]
                if c.padding_idx is None:
                    v = F.embedding(inv, r)
                else:
                    keep = ids != c.padding_idx
                    v = r.new_zeros((ids.numel(), c.embedding_dim))
                    v = v.index_copy(0, keep.nonzero().squeeze(1),
                                     F.embedding(inv, r))
                if feats.device.type != "cpu":
                    v = v.to(feats.device)
                out[name] = JaggedTensor(
                    v, ids if self._need_indices else None, lengths=lens)
        return out


__all__ = ["PoolingType", "DataType", "BaseEmbeddingConfig",
           "EmbeddingBagConfig", "EmbeddingConfig", "JaggedTensor",
           "KeyedJaggedTensor", "KeyedTensor", "EmbeddingBagCollection",
           "EmbeddingCollection"]
