"""Adam, partial row-wise Adam, LAMB and partial row-wise LAMB on tiered tables: 50 steps of
Zipf batches on each tier match a reference written from FBGEMM's definitions
(fbgemm_gpu/codegen/genscript/optimizers.py: only the rows a batch touches change, bias
correction by the step count, weight decay as a decoupled term) to 1e-6 of the weights'
scale; pooling, per-sample weights, shared tables, sequences, variable batches, fp16
weights, gradient clipping; the settings refused with their reason."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

from torchrec_mtrains import Tier
from torchrec_mtrains.kernels.tiered_embedding_bags import TieredEmbeddingBags

ADAM_FAMILY = (EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_ADAM, EmbOptimType.LAMB,
               EmbOptimType.PARTIAL_ROWWISE_LAMB)
SPECS = ((600, 8), (300, 16))
STEPS = 50
LR, EPS = 0.02, 1e-8


# ---------------------------------------------------------------- the reference ----
class Reference:
    """Dense fp32 tables trained with FBGEMM's definitions of the Adam family."""

    def __init__(self, weights: Sequence[torch.Tensor], optimizer: EmbOptimType, beta1: float = 0.9,
                 beta2: float = 0.999, weight_decay: float = 0.0, max_gradient: Optional[float] = None) -> None:
        self.w = [w.float().clone() for w in weights]
        self.m1 = [torch.zeros_like(w) for w in self.w]
        rowwise = optimizer in (EmbOptimType.PARTIAL_ROWWISE_ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB)
        self.m2 = [torch.zeros(w.shape[0]) if rowwise else torch.zeros_like(w) for w in self.w]
        self.rowwise, self.lamb = rowwise, optimizer in (EmbOptimType.LAMB, EmbOptimType.PARTIAL_ROWWISE_LAMB)
        # FBGEMM's kernels take the terms as fp32 (1 - beta2 is then 0.00099998713, not 0.001).
        self.b1, self.b2, self.wd = (float(torch.tensor(x, dtype=torch.float32)) for x in (beta1, beta2, weight_decay))
        self.clip = max_gradient
        self.step = 0

    def update(self, grads: Dict[Tuple[int, int], torch.Tensor]) -> None:
        """One step: ``grads`` maps (table, row) to the row's summed gradient."""
        self.step += 1
        t_ = self.step
        # powf(beta, iter), in fp32 as FBGEMM computes it.
        c1, c2 = (1 - float(torch.tensor(b, dtype=torch.float32) ** t_) for b in (self.b1, self.b2))
        for (t, row), g in grads.items():
            if self.clip is not None:
                g = g.clamp(-self.clip, self.clip)
            w = self.w[t][row].clone()
            m = self.b1 * self.m1[t][row] + (1 - self.b1) * g
            self.m1[t][row] = m
            if self.rowwise:
                v = self.b2 * self.m2[t][row] + (1 - self.b2) * (g * g).mean()
                self.m2[t][row] = v
                denominator = torch.sqrt(v / c2) + EPS
            else:
                v = self.b2 * self.m2[t][row] + (1 - self.b2) * g * g
                self.m2[t][row] = v
                denominator = torch.sqrt(v / c2) + EPS
            r = m / c1 / denominator + self.wd * w
            if self.lamb:
                r_norm = torch.linalg.norm(r)
                ratio = torch.linalg.norm(w) / r_norm if r_norm > 0 else torch.tensor(0.0)
                self.w[t][row] = w - LR * ratio * r
            else:
                self.w[t][row] = w - LR * r


def row_grads(indices: torch.Tensor, offsets: torch.Tensor, grad: torch.Tensor, feature_tables: Sequence[int],
              dims: Sequence[int], pooling: PoolingMode, psw: Optional[torch.Tensor] = None,
              batch_sizes: Optional[List[List[int]]] = None) -> Dict[Tuple[int, int], torch.Tensor]:
    """Each touched (table, row)'s summed gradient, from the output's gradient (FBGEMM's
    layouts: [B, sum(dims)] pooled, 1-D rank by rank under a variable batch, [N, dim] for
    sequences)."""
    out: Dict[Tuple[int, int], torch.Tensor] = {}
    num_f = len(feature_tables)
    grad = grad.float()
    starts: List[Tuple[int, int]] = []  # per bag: (output start, dim)
    if batch_sizes is None:
        batch = (offsets.numel() - 1) // num_f
        col = 0
        for f in range(num_f):
            starts += [(b * sum(dims[t] for t in feature_tables) + col, dims[feature_tables[f]]) for b in range(batch)]
            col += dims[feature_tables[f]]
        bags_of = [batch] * num_f
    else:
        ranks = len(batch_sizes[0])
        at, start_of = 0, {}
        for r in range(ranks):
            for f in range(num_f):
                start_of[(f, r)] = at
                at += batch_sizes[f][r] * dims[feature_tables[f]]
        for f in range(num_f):
            for r in range(ranks):
                starts += [(start_of[(f, r)] + b * dims[feature_tables[f]], dims[feature_tables[f]])
                           for b in range(batch_sizes[f][r])]
        bags_of = [sum(batch_sizes[f]) for f in range(num_f)]
    flat = grad.reshape(-1)
    bag = 0
    for f in range(num_f):
        t = feature_tables[f]
        for _ in range(bags_of[f]):
            lo, hi = int(offsets[bag]), int(offsets[bag + 1])
            for i in range(lo, hi):
                scale = 1.0 if psw is None else float(psw[i])
                if pooling == PoolingMode.MEAN:
                    scale /= hi - lo
                if pooling == PoolingMode.NONE:
                    g = grad[i]
                else:
                    s, d = starts[bag]
                    g = flat[s:s + d]
                key = (t, int(indices[i]))
                out[key] = out.get(key, 0) + scale * g
            bag += 1
    return out


# ---------------------------------------------------------------- batches ----
def zipf_ids(rows: int, n: int, g: torch.Generator, alpha: float = 1.1) -> torch.Tensor:
    """``n`` ids in [0, rows) with Zipf(alpha) popularity over a fixed shuffle of the rows."""
    if n == 0:
        return torch.empty(0, dtype=torch.long)
    ranks = torch.arange(1, rows + 1, dtype=torch.float64)
    p = ranks ** -alpha
    perm = torch.randperm(rows, generator=torch.Generator().manual_seed(rows))
    return perm[torch.multinomial(p / p.sum(), n, replacement=True, generator=g)]


def pooled_batches(feature_tables: Sequence[int], batch: int, steps: int, seed: int = 0):
    """(indices, offsets, output gradient) per step, bags of 0..6 ids."""
    g = torch.Generator().manual_seed(seed)
    dims_total = sum(SPECS[t][1] for t in feature_tables)
    for _ in range(steps):
        lengths = torch.randint(0, 7, (len(feature_tables) * batch,), generator=g)
        ids = []
        for f, t in enumerate(feature_tables):
            n = int(lengths[f * batch:(f + 1) * batch].sum())
            ids.append(zipf_ids(SPECS[t][0], n, g))
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        yield torch.cat(ids), offsets, torch.randn(batch, dims_total, generator=g)


def kernel(tmp_path: Path, optimizer: EmbOptimType, tier: Tier, specs=SPECS, **kw) -> TieredEmbeddingBags:
    kw.setdefault("cache_rows", 96)  # far fewer slots than rows: misses, evictions, write-backs
    return TieredEmbeddingBags(list(specs), tier=tier, storage_dir=str(tmp_path), optimizer=optimizer,
                               learning_rate=LR, eps=EPS, prefetch_pipeline=False, **kw)


def assert_matches(k: TieredEmbeddingBags, ref: Reference) -> None:
    """Weights and both momenta equal the reference's to 1e-6 of the weights' scale."""
    weights, states = k.split_embedding_weights(), k.split_optimizer_states()
    for t, (w, (m1, m2)) in enumerate(zip(weights, states)):
        scale = max(1.0, float(ref.w[t].abs().max()))
        for name, got, want in (("weights", w.float(), ref.w[t]), ("momentum1", m1, ref.m1[t]),
                                ("momentum2", m2, ref.m2[t])):
            err = float((got - want).abs().max()) / max(scale if name == "weights" else 1.0,
                                                      float(want.abs().max()))
            assert err <= 1e-6, f"table {t} {name}: max abs diff {err:.3g} relative"


def train(k: TieredEmbeddingBags, ref: Reference, batches, feature_tables, pooling=PoolingMode.SUM) -> None:
    dims = [d for _, d in k.embedding_specs]
    for indices, offsets, grad in batches:
        out = k(indices, offsets)
        out.backward(grad)
        ref.update(row_grads(indices, offsets, grad, feature_tables, dims, pooling))


# ---------------------------------------------------------------- tests ----
@pytest.mark.parametrize("tier", [Tier.DRAM, Tier.SCM, Tier.SSD], ids=lambda t: t.name)
@pytest.mark.parametrize("optimizer", ADAM_FAMILY, ids=lambda o: o.name)
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_matches_reference_over_50_zipf_steps(tmp_path: Path, tier: Tier, optimizer: EmbOptimType,
                                              weight_decay: float) -> None:
    settings = {"weight_decay": weight_decay} if weight_decay else {}
    k = kernel(tmp_path, optimizer, tier, tbe_settings=settings)
    ref = Reference(k.split_embedding_weights(), optimizer, weight_decay=weight_decay)
    train(k, ref, pooled_batches([0, 1], batch=16, steps=STEPS), [0, 1])
    assert k.optimizer_step == STEPS
    assert all(st["update_seconds"] > 0 for st in k.cache_stats().values())
    assert sum(s["misses"] for s in k.cache_stats().values()) > 0  # the cache moved rows to and from the tier
    assert_matches(k, ref)
    k.close()


@pytest.mark.parametrize("lookahead", [0, 2])
def test_prefetched_steps_on_the_kernels_threads(tmp_path: Path, lookahead: int) -> None:
    """Batches prefetched ahead on the kernel's threads (and a look-ahead window) while the
    update of the step before runs: the same rows as the reference."""
    k = TieredEmbeddingBags(list(SPECS), tier=Tier.SSD, storage_dir=str(tmp_path), optimizer=EmbOptimType.ADAM,
                            learning_rate=LR, eps=EPS, cache_rows=96, prefetch_pipeline=True, lookahead=lookahead)
    ref = Reference(k.split_embedding_weights(), EmbOptimType.ADAM)
    batches = list(pooled_batches([0, 1], batch=16, steps=30, seed=4))
    ahead = lookahead + 1
    for indices, offsets, _ in batches[:ahead]:
        k.prefetch(indices, offsets)
    for i, (indices, offsets, grad) in enumerate(batches):
        out = k(indices, offsets)
        if i + ahead < len(batches):
            k.prefetch(*batches[i + ahead][:2])
        out.backward(grad)
        ref.update(row_grads(indices, offsets, grad, [0, 1], [8, 16], PoolingMode.SUM))
    assert_matches(k, ref)
    k.close()


@pytest.mark.parametrize("optimizer", ADAM_FAMILY, ids=lambda o: o.name)
def test_mean_pooling_per_sample_weights_and_shared_table(tmp_path: Path, optimizer: EmbOptimType) -> None:
    """Three features, two on table 0; MEAN bags with per-sample weights; beta terms and
    gradient clipping given as FBGEMM's keywords."""
    ftm = [0, 0, 1]
    settings = {"beta1": 0.8, "beta2": 0.99, "gradient_clipping": True, "max_gradient": 0.05}
    k = kernel(tmp_path, optimizer, Tier.SSD, pooling_mode=PoolingMode.MEAN, feature_table_map=ftm,
               tbe_settings=settings)
    ref = Reference(k.split_embedding_weights(), optimizer, beta1=0.8, beta2=0.99, max_gradient=0.05)
    g = torch.Generator().manual_seed(3)
    dims = [d for _, d in SPECS]
    for indices, offsets, grad in pooled_batches(ftm, batch=8, steps=20, seed=1):
        psw = torch.rand(indices.numel(), generator=g) * 2
        k(indices, offsets, psw).backward(grad)
        ref.update(row_grads(indices, offsets, grad, ftm, dims, PoolingMode.MEAN, psw))
    assert_matches(k, ref)
    k.close()


@pytest.mark.parametrize("optimizer", ADAM_FAMILY, ids=lambda o: o.name)
def test_sequences(tmp_path: Path, optimizer: EmbOptimType) -> None:
    """PoolingMode.NONE (TorchRec's EmbeddingCollection): one output row per id."""
    specs = ((500, 8), (200, 8))
    k = kernel(tmp_path, optimizer, Tier.SSD, specs=specs, pooling_mode=PoolingMode.NONE,
               tbe_settings={"weight_decay": 0.02})
    ref = Reference(k.split_embedding_weights(), optimizer, weight_decay=0.02)
    g = torch.Generator().manual_seed(5)
    for _ in range(20):
        lengths = torch.randint(0, 5, (2 * 6,), generator=g)
        ids = [zipf_ids(specs[t][0], int(lengths[t * 6:(t + 1) * 6].sum()), g) for t in range(2)]
        indices = torch.cat(ids)
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        grad = torch.randn(indices.numel(), 8, generator=g)
        k(indices, offsets).backward(grad)
        ref.update(row_grads(indices, offsets, grad, [0, 1], [8, 8], PoolingMode.NONE))
    assert_matches(k, ref)
    k.close()


@pytest.mark.parametrize("optimizer", [EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB], ids=lambda o: o.name)
def test_variable_batch(tmp_path: Path, optimizer: EmbOptimType) -> None:
    """FBGEMM's VBE: bags ordered feature by feature, the output rank by rank."""
    ftm = [0, 0, 1]
    k = kernel(tmp_path, optimizer, Tier.SCM, feature_table_map=ftm)
    ref = Reference(k.split_embedding_weights(), optimizer)
    g = torch.Generator().manual_seed(7)
    dims = [d for _, d in SPECS]
    for _ in range(15):
        sizes = [[int(torch.randint(0, 5, (1,), generator=g)) for _ in range(2)] for _ in ftm]
        lengths = [torch.randint(0, 4, (sum(per_rank),), generator=g) for per_rank in sizes]
        indices = torch.cat([zipf_ids(SPECS[ftm[f]][0], int(n.sum()), g) for f, n in enumerate(lengths)])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), torch.cat(lengths).cumsum(0)])
        numel = sum(b * dims[ftm[f]] for f, per_rank in enumerate(sizes) for b in per_rank)
        grad = torch.randn(numel, generator=g)
        k(indices, offsets, batch_size_per_feature_per_rank=sizes).backward(grad)
        ref.update(row_grads(indices, offsets, grad, ftm, dims, PoolingMode.SUM, batch_sizes=sizes))
    assert_matches(k, ref)
    k.close()


def test_fp16_weights_round_to_nearest(tmp_path: Path) -> None:
    """fp16 weights: the update runs in fp32 from the fp16 weights and rounds to nearest;
    the momenta stay fp32 (a step of the reference from the same fp16 weights agrees)."""
    k = kernel(tmp_path, EmbOptimType.ADAM, Tier.SSD, weights_precision=SparseType.FP16)
    for indices, offsets, grad in pooled_batches([0, 1], batch=8, steps=10, seed=2):
        before = [w.float() for w in k.split_embedding_weights()]
        m1_before = [s[0].clone() for s in k.split_optimizer_states()]
        m2_before = [s[1].clone() for s in k.split_optimizer_states()]
        ref = Reference(before, EmbOptimType.ADAM)
        ref.m1, ref.m2, ref.step = m1_before, m2_before, k.optimizer_step
        k(indices, offsets).backward(grad)
        ref.update(row_grads(indices, offsets, grad, [0, 1], [8, 16], PoolingMode.SUM))
        for t, w in enumerate(k.split_embedding_weights()):
            assert w.dtype == torch.float16
            assert torch.equal(w, ref.w[t].half()) or float((w.float() - ref.w[t].half().float()).abs().max()) <= 2 ** -10
    k.close()


def test_step_counts_every_forward_as_fbgemm(tmp_path: Path) -> None:
    """FBGEMM's iter: eval and no-grad forwards count too; set_optimizer_step restores it."""
    k = kernel(tmp_path, EmbOptimType.ADAM, Tier.DRAM)
    idx, off = torch.tensor([1, 2, 3]), torch.tensor([0, 2, 2, 3, 3])
    k(idx, off).sum().backward()
    k.eval()
    with torch.no_grad():
        k(idx, off)
    assert k.optimizer_step == 2
    k.set_optimizer_step(40)
    assert k.optimizer_step == 40
    with pytest.raises(ValueError, match="step"):
        k.set_optimizer_step(-1)
    k.close()


def test_untouched_rows_and_state_layout(tmp_path: Path) -> None:
    """Rows no batch touched keep their weights and zero momenta; state shapes are FBGEMM's."""
    for optimizer in ADAM_FAMILY:
        k = kernel(tmp_path / optimizer.value, optimizer, Tier.SSD)
        w0 = k.split_embedding_weights()
        k(torch.tensor([5, 6]), torch.tensor([0, 1, 2])).sum().backward()
        w1 = k.split_embedding_weights()
        m1, m2 = k.split_optimizer_states()[0]
        rowwise = optimizer in (EmbOptimType.PARTIAL_ROWWISE_ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB)
        assert m1.shape == (600, 8) and m2.shape == ((600,) if rowwise else (600, 8))
        changed = (w1[0] != w0[0]).any(dim=1).nonzero().flatten().tolist()
        assert changed == [5]
        assert (w1[1] != w0[1]).any(dim=1).nonzero().flatten().tolist() == [6]
        assert float(m1[torch.arange(600) != 5].abs().max()) == 0.0
        k.close()


def test_lamb_zero_update_keeps_the_row(tmp_path: Path) -> None:
    """A LAMB row with an all-zero gradient and no decay keeps its weights (FBGEMM would
    divide by a zero norm and write NaN)."""
    k = kernel(tmp_path, EmbOptimType.LAMB, Tier.DRAM)
    w0 = k.split_embedding_weights()[0].clone()
    out = k(torch.tensor([4]), torch.tensor([0, 1, 1]))
    out.backward(torch.zeros_like(out))
    w1 = k.split_embedding_weights()[0]
    assert torch.equal(w0, w1) and not torch.isnan(w1).any()
    k.close()


def test_refused_settings_name_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="weight_decay_mode"):
        kernel(tmp_path, EmbOptimType.ADAM, Tier.DRAM,
               tbe_settings={"weight_decay": 0.1, "weight_decay_mode": 1})  # L2
    with pytest.raises(ValueError, match="beta1"):
        kernel(tmp_path, EmbOptimType.ADAM, Tier.DRAM, tbe_settings={"beta1": 1.5})
    with pytest.raises(ValueError, match="beta2"):
        kernel(tmp_path, EmbOptimType.EXACT_ROWWISE_ADAGRAD, Tier.DRAM, tbe_settings={"beta2": 0.5})
    k = kernel(tmp_path, EmbOptimType.ADAM, Tier.DRAM)
    with pytest.raises(ValueError, match="per_sample_weights"):
        k(torch.tensor([1]), torch.tensor([0, 1, 1]), torch.ones(1, requires_grad=True))
    assert k.optimizer_step == 0  # the refused call counted no step
    k.prefetch(torch.tensor([1]), torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="per_sample_weights"):
        k(torch.tensor([1]), torch.tensor([0, 1, 1]), torch.ones(1, requires_grad=True))
    assert k.pending_prefetches == 1  # nor took the prefetched step
    k(torch.tensor([1]), torch.tensor([0, 1, 1])).sum().backward()
    assert k.pending_prefetches == 0 and k.optimizer_step == 1
    k.close()


def test_row_bytes_carry_the_momenta() -> None:
    from torchrec_mtrains.layout import TableLayout
    assert TableLayout(64, "fp32", EmbOptimType.ADAM).row_bytes == 64 * 4 * 3
    assert TableLayout(64, "fp32", EmbOptimType.PARTIAL_ROWWISE_ADAM).row_bytes == 64 * 4 * 2 + 4
    assert TableLayout(64, "fp16", EmbOptimType.LAMB).row_bytes == 64 * 2 + 64 * 8
    assert math.isclose(TableLayout(8, "fp32", "partial_rowwise_lamb").state_values, 9)


@pytest.mark.parametrize("optimizer", [EmbOptimType.ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB], ids=lambda o: o.name)
def test_virtual_table_matches_a_dense_one(tmp_path: Path, optimizer: EmbOptimType) -> None:
    """A virtual table (ids as keys, a row made per live id) trains each id as the dense
    table trains the same row: weights and both momenta, read by id."""
    from torchrec_mtrains.kernels.virtual_rows import VirtualTableSpec
    specs = ((600, 8),)
    dense = kernel(tmp_path / "dense", optimizer, Tier.SSD, specs=specs, cache_rows=64)
    virt = kernel(tmp_path / "virt", optimizer, Tier.SSD, specs=specs, cache_rows=64,
                  virtual_tables=[VirtualTableSpec(id_space=600)])
    g = torch.Generator().manual_seed(9)
    seen = set()
    for _ in range(20):
        lengths = torch.randint(0, 5, (8,), generator=g)
        indices = zipf_ids(600, int(lengths.sum()), g)
        seen.update(indices.tolist())
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        grad = torch.randn(8, 8, generator=g)
        dense(indices, offsets).backward(grad)
        virt(indices, offsets).backward(grad)
    ids = torch.tensor(sorted(seen))
    w, state = virt.read_ids(0, ids)
    dw, dstate = dense.read_rows(0, 0, 600)
    assert torch.equal(w, dw[ids]) and torch.equal(state, dstate[ids])
    dense.close()
    virt.close()


# ------------------------------------------------- the C++ update, threads ----
def _op_tables(optimizer: EmbOptimType, seed: int = 3):
    """Weights, zeroed states and free positions for SPECS, as the kernel's slots hold them."""
    g = torch.Generator().manual_seed(seed)
    rowwise = optimizer in (EmbOptimType.PARTIAL_ROWWISE_ADAM, EmbOptimType.PARTIAL_ROWWISE_LAMB)
    weights = [torch.randn(rows, dim, generator=g) * 0.1 for rows, dim in SPECS]
    states = [torch.zeros(rows, dim + (1 if rowwise else dim)) for rows, dim in SPECS]
    positions = [torch.full((rows,), -1, dtype=torch.int32) for rows, _ in SPECS]
    return weights, states, positions


def _op_backward(optimizer: EmbOptimType, step: int, indices, offsets, grad, feature_tables, tables) -> None:
    weights, states, positions = tables
    torch.ops.mtrains.adam_family_backward(
        grad_output=grad, indices=indices, offsets=offsets, per_sample_weights=None, feature_tables=feature_tables,
        batch_sizes=[], pooling=int(PoolingMode.SUM), weights=weights, states=states, positions=positions,
        kind=ADAM_FAMILY.index(optimizer), learning_rate=LR, eps=EPS, beta1=0.9, beta2=0.999, weight_decay=0.0,
        step=step, max_gradient=-1.0)


@pytest.mark.parametrize("optimizer", ADAM_FAMILY, ids=lambda o: o.name)
def test_large_batches_split_over_threads_alike(optimizer: EmbOptimType) -> None:
    """Batches of ~18K ids split the first pass and the update over two threads (a table
    shared by two features, its hot rows touched by both threads' shares): the reference's
    results, and the same bits as one thread."""
    from torchrec_mtrains._ops import load_extension
    load_extension()
    feature_tables = [0, 1, 0]
    batches = list(pooled_batches(feature_tables, batch=2048, steps=3, seed=11))
    assert all(indices.numel() >= 4 * 4096 for indices, _, _ in batches)  # the op's shares: one per thread
    dims = [d for _, d in SPECS]
    results = []
    threads = torch.get_num_threads()
    try:
        for n in (2, 1):
            torch.set_num_threads(n)
            tables = _op_tables(optimizer)
            ref = Reference(tables[0], optimizer)
            for step, (indices, offsets, grad) in enumerate(batches, start=1):
                _op_backward(optimizer, step, indices, offsets, grad, feature_tables, tables)
                ref.update(row_grads(indices, offsets, grad, feature_tables, dims, PoolingMode.SUM))
            for t, (w, s, p) in enumerate(zip(*tables)):
                assert bool((p == -1).all()), f"table {t}: positions left set"
                scale = max(1.0, float(ref.w[t].abs().max()))
                assert float((w - ref.w[t]).abs().max()) / scale <= 1e-6, f"table {t} weights, {n} threads"
            results.append(tables)
    finally:
        torch.set_num_threads(threads)
    for two, one in zip(results[0][:2], results[1][:2]):
        for a, b in zip(two, one):
            assert torch.equal(a, b)


def test_bad_id_in_a_later_share_changes_nothing() -> None:
    """An id past a table's slots, in the second thread's share, is refused by name, and no
    row, state or position is left changed."""
    from torchrec_mtrains._ops import load_extension
    load_extension()
    feature_tables = [0, 1, 0]
    indices, offsets, grad = next(pooled_batches(feature_tables, batch=2048, steps=1, seed=12))
    indices = indices.clone()
    indices[-3] = SPECS[0][0] + 5  # the last feature is table 0's
    tables = _op_tables(EmbOptimType.ADAM)
    before = [[t.clone() for t in part] for part in tables]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(IndexError, match=f"slot {SPECS[0][0] + 5} is outside the table's {SPECS[0][0]} slots"):
            _op_backward(EmbOptimType.ADAM, 1, indices, offsets, grad, feature_tables, tables)
    finally:
        torch.set_num_threads(threads)
    for part, saved in zip(tables, before):
        for got, want in zip(part, saved):
            assert torch.equal(got, want)
