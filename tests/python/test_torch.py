"""embstore.torch: modules over tables train exactly as torch.nn ones do,
push only the batch's distinct rows, prefetch in order, raise when a
server dies, and carry their table (and with save_rows its rows) in
state_dict()."""

from __future__ import annotations

import io
import subprocess
import sys
import warnings

import numpy as np
import pytest

import embstore

torch = pytest.importorskip("torch")
import embstore.torch as et  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

ADAGRAD = "adagrad:lr=0.05,acc=0.1,eps=1e-8"


@pytest.fixture(scope="module")
def client(servers):
    with embstore.connect(servers=servers, transport="tcp") as c:
        yield c


class Model(nn.Module):
    """Embedding [B, F, 4] + bag of wide weights [B, 1] + MLP."""

    def __init__(self, deep: nn.Module, wide: nn.Module, fields: int = 3):
        super().__init__()
        self.deep = deep
        self.wide = wide
        self.mlp = nn.Sequential(nn.Linear(4 * fields, 5), nn.ReLU(),
                                 nn.Linear(5, 1))

    def forward(self, ids):
        return self.mlp(self.deep(ids).flatten(1)).squeeze(1) + \
            self.wide(ids).squeeze(1)


def _data(vocab, steps=20, batch=8, fields=3):
    rng = np.random.default_rng(1)
    idx = rng.integers(0, len(vocab), (steps, batch, fields))
    labels = rng.integers(0, 2, (steps, batch)).astype(np.float32)
    ids = torch.from_numpy(vocab[idx].view(np.int64))
    return ids, torch.from_numpy(idx + 0), torch.from_numpy(labels)


@pytest.mark.parametrize("cached", [False, True])
def test_weights_equal_local_training_in_sync_mode(client, name, cached):
    """One worker, sync mode: embstore modules (+ DenseParameters, Adam on
    the servers) end within 1e-5 of torch.nn modules with torch's Adagrad
    and Adam started from the same values."""
    torch.manual_seed(0)
    seed = 5
    emb = client.table(name + "e", 4, optimizer=ADAGRAD,
                       init="normal:0,0.05", mode="sync", seed=seed)
    wide = client.table(name + "w", 1, optimizer=ADAGRAD, init="zeros",
                        mode="sync", seed=seed)
    dense = client.table(name + "d", 16, optimizer="adam:lr=0.01",
                         init="zeros", mode="sync")
    vocab = np.arange(1, 40, dtype=np.uint64) * np.uint64(0x9e3779b97f4a7c15)
    src_e, src_w = emb, wide
    if cached:
        # write-through with staleness 0 reads what the servers hold
        src_e = emb.cached(mode="through", rows=256, prefetch=0,
                           staleness=0, max_batch=64)
        src_w = wide.cached(mode="through", rows=256, prefetch=0,
                            staleness=0, max_batch=64)
    remote = Model(et.Embedding(src_e), et.EmbeddingBag(src_w, mode="sum"))
    local = Model(nn.Embedding(len(vocab), 4, sparse=True),
                  nn.EmbeddingBag(len(vocab), 1, mode="sum", sparse=True))
    local.mlp.load_state_dict(remote.mlp.state_dict())
    with torch.no_grad():
        local.deep.weight.copy_(torch.from_numpy(embstore.initial_rows(
            "normal:0,0.05", seed, vocab, 4)))
        local.wide.weight.zero_()
    ps = et.DenseParameters(remote.mlp, dense)
    sparse = et.SparseOptimizer(remote)
    opts = [torch.optim.Adagrad(list(local.deep.parameters()) +
                                list(local.wide.parameters()), lr=0.05,
                                initial_accumulator_value=0.1, eps=1e-8),
            torch.optim.Adam(local.mlp.parameters(), lr=0.01)]
    ids, idx, labels = _data(vocab)
    for b in range(len(ids)):
        ps.pull()
        loss = F.binary_cross_entropy_with_logits(remote(ids[b]), labels[b])
        loss.backward()
        sparse.step()
        sparse.zero_grad()
        ps.push()
        for o in opts:
            o.zero_grad()
        F.binary_cross_entropy_with_logits(local(idx[b]), labels[b]
                                           ).backward()
        for o in opts:
            o.step()
    ps.pull()
    np.testing.assert_allclose(emb.pull(vocab), local.deep.weight.detach(),
                               atol=1e-5)
    np.testing.assert_allclose(wide.pull(vocab), local.wide.weight.detach(),
                               atol=1e-5)
    for a, b in zip(remote.mlp.parameters(), local.mlp.parameters()):
        np.testing.assert_allclose(a.detach(), b.detach(), atol=1e-5)
    assert remote.deep.step == len(ids) and ps.step == len(ids)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_matches_torch(client, name, mode):
    t = client.table(name, 3, optimizer="sgd:lr=1", init="uniform:-1,1",
                     seed=2)
    ids = torch.tensor([5, 6, 5, 7, 8, 5], dtype=torch.int64)
    offsets = torch.tensor([0, 2, 5])
    uniq = np.array([5, 6, 7, 8], dtype=np.uint64)
    w0 = t.pull(uniq)
    bag = et.EmbeddingBag(t, mode=mode)
    ref = nn.EmbeddingBag(4, 3, mode=mode)
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(w0))
    ref_ids = torch.tensor([0, 1, 0, 2, 3, 0])
    out = bag(ids, offsets)
    want = ref(ref_ids, offsets)
    torch.testing.assert_close(out, want)
    (out * torch.arange(9.0).reshape(3, 3)).sum().backward()
    et.SparseOptimizer(bag).step()
    (want * torch.arange(9.0).reshape(3, 3)).sum().backward()
    # SGD with lr 1: the pushed rows moved by minus their gradient.
    np.testing.assert_allclose(t.pull(uniq), w0 - ref.weight.grad.numpy(),
                               atol=1e-6)
    # 2-D ids are bags of one row each.
    two_d = bag(torch.tensor([[5, 6], [7, 8]]))
    assert two_d.shape == (2, 3)
    with pytest.raises(ValueError):
        bag(ids)  # 1-D without offsets
    with pytest.raises(ValueError):
        et.EmbeddingBag(t, mode="max")


def test_backward_pushes_only_the_distinct_rows(client, name):
    t = client.table(name, 4, optimizer="sgd:lr=0.1", init="zeros")
    m = et.Embedding(t)
    ids = torch.tensor([[1, 2, 1], [2, 2, 3]])
    out = m(ids)
    assert out.shape == (2, 3, 4) and out.dtype == torch.float32
    out.sum().backward()
    assert t.stats()["pushes"] == 0  # backward only records
    et.SparseOptimizer(m).step()
    st = t.stats()
    assert st["rows_pushed"] == 3 and st["pushes"] >= 1
    # each id moved by lr * (its number of positions)
    np.testing.assert_allclose(t.pull([1, 2, 3])[:, 0], [-0.2, -0.3, -0.1],
                               rtol=1e-6)
    assert m._anchor.grad is None
    assert list(m.parameters()) == []  # nothing for a torch optimizer


def test_eval_reads_without_creating_rows(client, name):
    t = client.table(name, 4, init="constant:1")
    m = et.Embedding(t)
    m(torch.tensor([1]))  # training forward creates row 1
    m.eval()
    out = m(torch.tensor([1, 99]))
    np.testing.assert_array_equal(out[0].numpy(), 1.0)
    np.testing.assert_array_equal(out[1].numpy(), 0.0)
    m.train()
    with torch.no_grad():
        assert m(torch.tensor([99]))[0, 0].item() == 0.0
    assert t.stats()["rows"] == 1
    assert et.Embedding(t, create_in_eval=True).eval()(
        torch.tensor([99]))[0, 0].item() == 1.0


def test_ids_must_be_integers(client, name):
    m = et.Embedding(client.table(name, 4))
    with pytest.raises(TypeError):
        m(torch.tensor([1.0]))
    with pytest.raises(TypeError):
        et.Embedding(object())


class Loader:
    """Batches of ids with the order they were handed out recorded."""

    def __init__(self, batches):
        self.batches = batches
        self.read = []

    def __iter__(self):
        for i, b in enumerate(self.batches):
            self.read.append(i)
            yield {"ids": b, "i": i}


def test_prefetch_keeps_order_and_reads_ahead(client, name):
    t = client.table(name, 4, optimizer="sgd:lr=0.01", init="constant:0.5")
    ct = t.cached(mode="through", rows=1024, prefetch=2, staleness=2,
                  max_batch=64)
    m = et.Embedding(ct)
    rng = np.random.default_rng(3)
    # Disjoint batches, so no row is fetched for one batch and found too
    # old in a later one (which lookup would refetch itself).
    batches = [torch.from_numpy(rng.permutation(16).reshape(4, 4) + 16 * i)
               for i in range(10)]
    loader = Loader(batches)
    order = []
    opt = et.SparseOptimizer(m)
    for batch in et.prefetch(loader, {m: "ids"}, depth=2):
        order.append(batch["i"])
        # the loader is read two batches ahead of training
        assert loader.read[-1] == min(batch["i"] + 2, 9)
        m(batch["ids"]).sum().backward()
        opt.step()
    assert order == list(range(10))
    st = ct.stats()
    assert st["lookups"] == 10
    # every batch was queued ahead, and its lookup found its rows fetched
    # by the prefetch rather than fetching them itself
    assert st["sync_fetches"] == 0 and st["fetch_calls"] == 10
    assert m.step == 10
    # without prefetch, the same training gives the same rows
    t2 = client.table(name + "b", 4, optimizer="sgd:lr=0.01",
                      init="constant:0.5")
    m2 = et.Embedding(t2.cached(mode="through", rows=1024, prefetch=2,
                                staleness=2, max_batch=64))
    opt2 = et.SparseOptimizer(m2)
    for b in batches:
        m2(b).sum().backward()
        opt2.step()
    ids = np.unique(torch.cat([b.reshape(-1) for b in batches]).numpy())
    np.testing.assert_allclose(t.pull(ids), t2.pull(ids), atol=1e-6)


def test_prefetch_used_out_of_order_still_trains(client, name):
    t = client.table(name, 4, optimizer="sgd:lr=0.01", init="zeros")
    m = et.Embedding(t.cached(mode="through", rows=256, prefetch=1,
                              staleness=1, max_batch=16))
    opt = et.SparseOptimizer(m)
    m.prefetch(torch.tensor([1, 2]))
    m(torch.tensor([3, 4])).sum().backward()  # not the announced batch
    opt.step()
    m(torch.tensor([1, 2])).sum().backward()
    opt.step()
    np.testing.assert_allclose(t.pull([1, 3])[:, 0], -0.01, rtol=1e-6)
    with pytest.raises(ValueError):
        list(et.prefetch([], {m: None}, depth=0))
    with pytest.raises(TypeError):
        list(et.prefetch([], {nn.Linear(1, 1): None}))


def test_cached_module_needs_backward_between_forwards(client, name):
    t = client.table(name, 4)
    m = et.Embedding(t.cached(mode="through", rows=64, max_batch=16))
    a = m(torch.tensor([1]))
    m(torch.tensor([2]))
    with pytest.raises(RuntimeError):
        a.sum().backward()


def test_plain_table_prefetch_is_a_no_op(client, name):
    m = et.Embedding(client.table(name, 4))
    batches = [torch.tensor([1, 2]), torch.tensor([3])]
    assert [b.tolist() for b in et.prefetch(batches, {m: None})] == \
        [[1, 2], [3]]


def test_dense_parameters(client, name):
    t = client.table(name, 8, optimizer="sgd:lr=0.5", init="zeros")
    torch.manual_seed(1)
    a = nn.Linear(3, 4)
    want = [p.detach().clone() for p in a.parameters()]
    pa = et.DenseParameters(a, t)  # rank 0 stores a's values: 16 floats
    assert len(pa.ids) == 2
    b = nn.Linear(3, 4)
    et.DenseParameters(b, t)  # finds them: b now holds a's values
    for p, w in zip(b.parameters(), want):
        torch.testing.assert_close(p.detach(), w)
    a(torch.ones(1, 3)).sum().backward()
    grads = [p.grad.clone() for p in a.parameters()]
    pa.push()
    assert all(p.grad is None for p in a.parameters())
    pa.pull()
    for p, w, g in zip(a.parameters(), want, grads):
        torch.testing.assert_close(p.detach(), w - 0.5 * g)
    pa.push_empty()
    assert pa.step == 2
    with pytest.raises(TypeError):
        et.DenseParameters(nn.Linear(2, 2).double(), t, first_id=100)


def test_forward_raises_when_a_server_dies(start_server):
    s = start_server()
    c = embstore.connect(servers=s.addr, transport="tcp", timeout_ms=2000)
    m = et.Embedding(c.table("dies", 4))
    opt = et.SparseOptimizer(m)
    m(torch.tensor([1])).sum().backward()
    opt.step()
    out = m(torch.tensor([2]))
    s.kill()
    out.sum().backward()  # records only
    with pytest.raises(embstore.ConnectionError):
        opt.step()
    with pytest.raises(embstore.ConnectionError):
        m(torch.tensor([3]))
    c.close()


def test_import_embstore_without_torch():
    code = ("import sys; sys.modules['torch'] = None; import embstore; "
            "print(embstore.connect.__name__)\n"
            "try:\n import embstore.torch\nexcept ImportError:\n"
            " print('no torch')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["connect", "no", "torch"]


def _train(model, steps, seed=0):
    rng = np.random.default_rng(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sparse = et.SparseOptimizer(model)
    for _ in range(steps):
        ids = torch.from_numpy(rng.integers(0, 50, (8, 3)))
        loss = F.binary_cross_entropy_with_logits(
            model(ids), (ids[:, 0] % 2).float())
        opt.zero_grad()
        sparse.zero_grad()
        loss.backward()
        opt.step()
        sparse.step()


def test_table_spec_round_trips(client, name):
    t = client.table(name, 4, optimizer=ADAGRAD, init="uniform:-0.5,0.25",
                     seed=9)
    spec = t.spec()
    assert (spec["name"], spec["dim"], spec["seed"]) == (name, 4, 9)
    assert spec["optimizer"].startswith("adagrad:lr=0.05")
    assert spec["init"] == "uniform:-0.5,0.25"
    # the same floats: the servers open the table instead of refusing it
    again = client.table(**spec)
    assert again.spec() == spec
    assert client.table(name + "z", 2, init="constant:1.5").spec()["init"] \
        == "constant:1.5"


def test_state_dict_names_the_table_and_the_step(client, name):
    t = client.table(name, 4, optimizer=ADAGRAD, seed=3)
    m = et.Embedding(t)
    m(torch.tensor([1, 2])).sum().backward()
    et.SparseOptimizer(m).step()
    sd = m.state_dict()
    assert list(sd) == ["_extra_state"]
    st = sd["_extra_state"]
    assert {k: st[k] for k in ("name", "dim", "seed", "step")} == \
        {"name": name, "dim": 4, "seed": 3, "step": 1}
    assert st["optimizer"] == t.spec()["optimizer"]
    assert st["rows"] is None and st["ids"] is None
    # without rows: loading into a module over the trained table is
    # quiet and takes the step; over an empty table it warns
    m2 = et.Embedding(t)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m2.load_state_dict(sd)
    assert m2.step == 1
    with pytest.warns(RuntimeWarning, match="holds no rows of table"):
        et.Embedding(client.table(name + "_empty", 4)).load_state_dict(sd)
    with pytest.raises(ValueError, match="dim"):
        et.Embedding(client.table(name + "_d8", 8)).load_state_dict(sd)
    # a state dict from before the modules had state still loads
    with pytest.warns(RuntimeWarning, match="no state for"):
        et.Embedding(t).load_state_dict({})


@pytest.mark.parametrize("cached", [False, True])
def test_state_dict_with_rows_restores_the_embeddings(client, name, cached):
    """save_rows: the rows trained, weights and optimizer state, travel in
    the state dict (through torch.save) into fresh tables, and training
    goes on from there exactly as it would have."""
    def model(suffix, save_rows=True):
        deep = client.table(name + suffix + "d", 4, optimizer=ADAGRAD,
                            init="normal:0,0.1", seed=1)
        wide = client.table(name + suffix + "w", 1, optimizer="sgd:lr=0.1",
                            init="zeros")
        src = deep.cached(rows=256, max_batch=64) if cached else deep
        torch.manual_seed(0)
        return Model(et.Embedding(src, save_rows=save_rows),
                     et.EmbeddingBag(wide, save_rows=save_rows)), deep, wide

    a, a_deep, a_wide = model("a")
    _train(a, 5)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf)
    ids = np.sort(a.deep.seen_ids())
    assert len(ids) == len(sd["deep._extra_state"]["ids"]) > 0
    assert sd["deep._extra_state"]["rows"].shape == (len(ids),
                                                     a_deep.row_floats)

    b, b_deep, b_wide = model("b")
    b.load_state_dict(sd)
    assert b.deep.step == a.deep.step == 5
    np.testing.assert_array_equal(b_deep.pull(ids, with_state=True),
                                  a_deep.pull(ids, with_state=True))
    np.testing.assert_array_equal(b_wide.pull(ids, create=False),
                                  a_wide.pull(ids, create=False))
    # the same next steps give the same rows
    _train(a, 3, seed=1)
    _train(b, 3, seed=1)
    if cached:
        a.deep.cache.flush()
        b.deep.cache.flush()
    np.testing.assert_allclose(b_deep.pull(np.arange(50)),
                               a_deep.pull(np.arange(50)), rtol=1e-6)
    if cached:
        with pytest.raises(ValueError, match="before training"):
            b.load_state_dict(sd)
