"""embstore.torch.SparseOptimizer: backward only records the embedding
gradients and step() pushes them, so GradScaler, clipping by total norm and
accumulation over micro-batches give what torch gives for
nn.Embedding(sparse=True); save()/load() round-trip tables and dense state;
ids, devices and dtypes other than int64/float32 CPU."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import embstore

torch = pytest.importorskip("torch")
import embstore.torch as et  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402
from torch.cuda.amp import grad_scaler  # noqa: E402

from test_torch import Model  # noqa: E402


@pytest.fixture(scope="module")
def client(servers):
    with embstore.connect(servers=servers, transport="tcp") as c:
        yield c


def _pair(client, name, lr=0.1, vocab=30, seed=4, sparse=True):
    """An embstore model over SGD tables and a pure-torch one (sparse
    embeddings or not), with the same initial weights."""
    emb = client.table(name + "e", 4, optimizer=f"sgd:lr={lr}",
                       init="normal:0,0.3", seed=seed)
    wide = client.table(name + "w", 1, optimizer=f"sgd:lr={lr}",
                        init="uniform:-0.5,0.5", seed=seed)
    torch.manual_seed(0)
    remote = Model(et.Embedding(emb), et.EmbeddingBag(wide, mode="sum"))
    local = Model(nn.Embedding(vocab, 4, sparse=sparse),
                  nn.EmbeddingBag(vocab, 1, mode="sum", sparse=sparse))
    local.mlp.load_state_dict(remote.mlp.state_dict())
    ids = np.arange(vocab, dtype=np.uint64)
    with torch.no_grad():
        local.deep.weight.copy_(torch.from_numpy(emb.pull(ids)))
        local.wide.weight.copy_(torch.from_numpy(wide.pull(ids)))
    return remote, local, emb, wide


def _batches(steps, batch=8, vocab=30, seed=1):
    rng = np.random.default_rng(seed)
    return [(torch.from_numpy(rng.integers(0, vocab, (batch, 3))),
             torch.from_numpy(rng.integers(0, 2, batch).astype(np.float32)))
            for _ in range(steps)]


def _assert_same(remote, local, emb, wide, vocab=30, atol=1e-5):
    ids = np.arange(vocab, dtype=np.uint64)
    np.testing.assert_allclose(emb.pull(ids), local.deep.weight.detach(),
                               atol=atol)
    np.testing.assert_allclose(wide.pull(ids), local.wide.weight.detach(),
                               atol=atol)
    for a, b in zip(remote.mlp.parameters(), local.mlp.parameters()):
        np.testing.assert_allclose(a.detach(), b.detach(), atol=atol)


def test_backward_records_and_step_pushes(client, name):
    t = client.table(name, 4, optimizer="sgd:lr=1", init="zeros")
    m = et.Embedding(t)
    opt = et.SparseOptimizer(m)
    m(torch.tensor([3, 1, 3])).sum().backward()
    assert t.stats()["pushes"] == 0
    (leaf,) = opt.param_groups[0]["params"]
    assert leaf.grad.shape == (2, 4) and leaf not in list(m.parameters())
    np.testing.assert_array_equal(leaf.grad[:, 0], [1.0, 2.0])
    opt.step()
    np.testing.assert_array_equal(t.pull([1, 3])[:, 0], [-1.0, -2.0])
    assert m.step == 1 and opt.param_groups[0]["params"] == []
    # zero_grad drops what backward recorded: nothing is pushed
    m(torch.tensor([1])).sum().backward()
    opt.zero_grad()
    opt.step()
    assert t.stats()["rows_pushed"] == 2 and m.step == 1
    with pytest.raises(ValueError, match="no embstore"):
        et.SparseOptimizer(nn.Linear(1, 1))


def test_micro_batches_push_their_sum_once(client, name):
    """Three micro-batches then one step: one push of the summed gradient
    per table, and the rows (SGD) equal one big batch's."""
    remote, _, emb, wide = _pair(client, name + "a")
    big, _, emb2, wide2 = _pair(client, name + "b")
    dense = torch.optim.SGD(remote.parameters(), lr=0.1)
    dense2 = torch.optim.SGD(big.parameters(), lr=0.1)
    sparse, sparse2 = et.SparseOptimizer(remote), et.SparseOptimizer(big)
    batches = _batches(3)
    for ids, y in batches:
        F.binary_cross_entropy_with_logits(remote(ids), y,
                                           reduction="sum").backward()
    assert emb.stats()["pushes"] == 0
    dense.step()
    sparse.step()
    ids = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    F.binary_cross_entropy_with_logits(big(ids), y,
                                       reduction="sum").backward()
    dense2.step()
    sparse2.step()
    # each distinct id once: one push of the union
    distinct = len(np.unique(ids.numpy()))
    assert emb.stats()["rows_pushed"] == wide.stats()["rows_pushed"] == \
        distinct < ids.numel()
    assert emb.stats()["pushes"] == emb2.stats()["pushes"]
    assert remote.deep.step == 1
    vocab = np.arange(30, dtype=np.uint64)
    np.testing.assert_allclose(emb.pull(vocab), emb2.pull(vocab), atol=1e-5)
    np.testing.assert_allclose(wide.pull(vocab), wide2.pull(vocab),
                               atol=1e-5)


def test_clipping_by_total_norm_matches_torch(client, name):
    """clip_grad_norm_ over dense and embedding gradients scales the
    pushed ones as torch scales an nn.Embedding's. The reference has dense
    gradients: torch 1.13's clip_grad_norm_ counts sparse ones in the norm
    but leaves them unscaled (detach().mul_() of a sparse tensor writes a
    copy), which embstore.torch.clip_grad_norm_ does not imitate."""
    remote, local, emb, wide = _pair(client, name, sparse=False)
    dense = torch.optim.SGD(remote.parameters(), lr=0.1)
    sparse = et.SparseOptimizer(remote)
    ref = torch.optim.SGD(local.parameters(), lr=0.1)
    clipped = 0
    for ids, y in _batches(6):
        F.binary_cross_entropy_with_logits(remote(ids), y).backward()
        n = et.clip_grad_norm_(remote.parameters(), 0.05, sparse)
        F.binary_cross_entropy_with_logits(local(ids), y).backward()
        want = nn.utils.clip_grad_norm_(local.parameters(), 0.05)
        assert n.item() == pytest.approx(want.item(), rel=1e-5)
        clipped += want.item() > 0.05
        for o in (dense, sparse, ref):
            o.step()
            o.zero_grad()
    assert clipped >= 3  # the clipping did act
    _assert_same(remote, local, emb, wide)


class CpuGradScaler(torch.cuda.amp.GradScaler):
    """torch.cuda.amp.GradScaler's own unscale_() and step() on CPU
    tensors: torch 1.13 has its inf check and update kernels for CUDA only
    (and the class disables itself without CUDA), so this enables it,
    scales by a fixed factor, and the test puts CPU versions of the inf
    check and of the per-device copier in place; update() only starts the
    next iteration."""

    def __init__(self, scale: float) -> None:
        super().__init__(enabled=False)
        self._enabled = True
        self.update()
        self._scale = torch.full((), scale)
        self._growth_tracker = torch.zeros((), dtype=torch.int32)

    def scale(self, outputs):
        return outputs * self._scale

    def update(self, new_scale=None):
        self._per_optimizer_states = collections.defaultdict(
            grad_scaler._refresh_per_optimizer_state)


class _CpuReplicator(grad_scaler._MultiDeviceReplicator):
    """The same without its assertion that the tensor is on CUDA."""

    def __init__(self, master_tensor):
        self.master = master_tensor
        self._per_device_tensors = {}


def _cpu_check_and_unscale(grads, found_inf, inv_scale):
    for g in grads:
        if not torch.isfinite(g).all():
            found_inf.fill_(1.0)
        g.mul_(inv_scale)


def test_grad_scaler_unscales_and_skips_inf_steps(client, name,
                                                  monkeypatch):
    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_",
                        _cpu_check_and_unscale)
    monkeypatch.setattr(grad_scaler, "_MultiDeviceReplicator",
                        _CpuReplicator)
    remote, local, emb, wide = _pair(client, name)
    dense = torch.optim.SGD(remote.parameters(), lr=0.1)
    sparse = et.SparseOptimizer(remote)
    ref = torch.optim.SGD(local.parameters(), lr=0.1)
    scaler = CpuGradScaler(1024.0)
    for i, (ids, y) in enumerate(_batches(5)):
        loss = F.binary_cross_entropy_with_logits(remote(ids), y)
        if i == 2:
            loss = loss * float("inf")  # an overflow: the step is skipped
        scaler.scale(loss).backward()
        pushes = emb.stats()["rows_pushed"]
        scaler.step(dense)
        scaler.step(sparse)
        scaler.update()
        dense.zero_grad()
        sparse.zero_grad()
        if i == 2:
            assert emb.stats()["rows_pushed"] == pushes
            continue
        assert emb.stats()["rows_pushed"] > pushes
        F.binary_cross_entropy_with_logits(local(ids), y).backward()
        ref.step()
        ref.zero_grad()
    assert remote.deep.step == 4
    _assert_same(remote, local, emb, wide, atol=1e-4)


def test_unpushed_gradients_raise_at_the_next_forward(client, name):
    m = et.Embedding(client.table(name, 4))
    m(torch.tensor([1])).sum().backward()
    with pytest.raises(RuntimeError, match="SparseOptimizer"):
        m(torch.tensor([2]))
    m.eval()
    m(torch.tensor([2]))  # evaluation records nothing: allowed
    m.train()
    opt = et.SparseOptimizer(m)  # owns it now: accumulation is allowed
    m(torch.tensor([2])).sum().backward()
    opt.step()
    assert m.step == 1


def test_cached_table_needs_a_step_between_forwards(client, name):
    t = client.table(name, 4, optimizer="sgd:lr=1", init="zeros")
    m = et.Embedding(t.cached(mode="through", rows=64, max_batch=16))
    opt = et.SparseOptimizer(m)
    m(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="CachedTable"):
        m(torch.tensor([3]))
    opt.step()
    np.testing.assert_array_equal(t.pull([1, 2])[:, 0], [-1.0, -1.0])
    m(torch.tensor([3])).sum().backward()
    opt.zero_grad()  # a skipped step: the cache looks up the next batch
    m(torch.tensor([4])).sum().backward()
    opt.step()
    np.testing.assert_array_equal(t.pull([3, 4], create=False)[:, 0],
                                  [0.0, -1.0])


def test_ids_of_other_dtypes_and_gradients_of_other_dtypes(client, name):
    t = client.table(name, 3, optimizer="sgd:lr=1", init="constant:0.5")
    m = et.EmbeddingBag(t).to("cpu")
    opt = et.SparseOptimizer(m)
    ids = torch.tensor([[7, 8], [8, 9]], dtype=torch.int32)
    out = m(ids)
    assert out.device == ids.device and out.dtype == torch.float32
    # autocast: the rows enter as float32, the layers after them run in
    # bfloat16, and the gradient is pushed as float32
    lin = nn.Linear(3, 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = lin(m(ids))
    assert y.dtype == torch.bfloat16
    y.sum().backward()
    (leaf,) = opt.param_groups[0]["params"]
    assert leaf.grad.dtype == torch.float32
    want = leaf.grad.clone()
    opt.step()
    np.testing.assert_allclose(t.pull([7, 8, 9]), 0.5 - want.numpy(),
                               atol=1e-6)
    # gradients of any dtype given to _record_grads are pushed as float32
    uniq = np.array([1, 2], dtype=np.uint64)
    et._record_grads(m, t, uniq, torch.ones(2, 3, dtype=torch.float64))
    et._record_grads(m, t, uniq[:1], torch.ones(1, 3, dtype=torch.bfloat16))
    opt.step()
    np.testing.assert_array_equal(t.pull(uniq)[:, 0], [-1.5, -0.5])
    with pytest.raises(ValueError, match="shape"):
        et._record_grads(m, t, uniq, torch.ones(3, 3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA")
def test_rows_come_back_on_the_ids_device(client, name):
    t = client.table(name, 4, optimizer="sgd:lr=1", init="constant:1")
    m = et.Embedding(t)
    opt = et.SparseOptimizer(m)
    out = m(torch.tensor([1, 2], device="cuda"))
    assert out.device.type == "cuda"
    out.sum().backward()
    opt.step()
    np.testing.assert_array_equal(t.pull([1, 2]), 0.0)


def _adagrad_model(client, prefix, cached=False):
    deep = client.table(prefix + "d", 4, optimizer="adagrad:lr=0.05",
                        init="normal:0,0.1", seed=1)
    wide = client.table(prefix + "w", 1, optimizer="sgd:lr=0.1",
                        init="zeros")
    src = deep.cached(rows=256, max_batch=64) if cached else deep
    torch.manual_seed(0)
    model = Model(et.Embedding(src), et.EmbeddingBag(wide))
    return (model, et.SparseOptimizer(model),
            torch.optim.Adam(model.parameters(), lr=0.01), deep, wide)


def _steps(model, sparse, dense, n, seed):
    for ids, y in _batches(n, seed=seed):
        F.binary_cross_entropy_with_logits(model(ids), y).backward()
        dense.step()
        sparse.step()
        dense.zero_grad()
        sparse.zero_grad()


@pytest.mark.parametrize("cached", [False, True])
def test_save_and_load_restore_rows_and_dense_state(client, name, tmp_path,
                                                    start_server, cached):
    model, sparse, dense, deep, wide = _adagrad_model(client, name, cached)
    _steps(model, sparse, dense, 4, seed=1)
    et.save(model, tmp_path / "ck", sparse, dense)
    ids = np.arange(30, dtype=np.uint64)
    rows = deep.pull(ids, with_state=True)
    wrows = wide.pull(ids)
    weights = [p.detach().clone() for p in model.parameters()]
    _steps(model, sparse, dense, 3, seed=2)
    if cached:
        model.deep.cache.flush()
    assert not np.array_equal(deep.pull(ids, with_state=True), rows)
    if cached:
        with pytest.raises(ValueError, match="before training"):
            et.load(model, tmp_path / "ck", sparse, dense)
        model, sparse, dense, deep, wide = _adagrad_model(client, name,
                                                          cached)
    et.load(model, tmp_path / "ck", sparse, dense)
    np.testing.assert_array_equal(deep.pull(ids, with_state=True), rows)
    np.testing.assert_array_equal(wide.pull(ids), wrows)
    for p, w in zip(model.parameters(), weights):
        torch.testing.assert_close(p.detach(), w)
    assert model.deep.step == 4

    # into a fresh server: the embeddings, dense weights and optimizer
    # state come back, and the next steps are the same steps
    s = start_server()
    with embstore.connect(servers=s.addr, transport="tcp") as c2:
        m2, sp2, de2, deep2, wide2 = _adagrad_model(c2, name, cached)
        assert deep2.stats().rows == 0
        et.load(m2, tmp_path / "ck", sp2, de2)
        np.testing.assert_array_equal(deep2.pull(ids, with_state=True),
                                      rows)
        _steps(model, sparse, dense, 2, seed=3)
        _steps(m2, sp2, de2, 2, seed=3)
        if cached:
            model.deep.cache.flush()
            m2.deep.cache.flush()
        np.testing.assert_allclose(deep2.pull(ids), deep.pull(ids),
                                   rtol=1e-6)
        for a, b in zip(model.parameters(), m2.parameters()):
            torch.testing.assert_close(a.detach(), b.detach())
