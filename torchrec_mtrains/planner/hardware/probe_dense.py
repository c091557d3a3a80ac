"""The dense part's cost of ``mtrains probe-hw``: what a dense layer costs a training step
from its shape, so that the planner costs the dense part of the model it plans (its
``DenseSpec``: multiply-accumulates and outputs per sample, weight matrices) rather than
of a fixed model.

MLPs of ``nn.Linear`` + ReLU layers of several shapes and batches run training steps
(forward, a loss, backward, Adagrad) on the calling thread budget (timed by
``timing.step_clock``); a non-negative least
squares fit of the median step times gives the seconds per multiply-accumulate per sample
(``dense_mac_s``), per output value per sample (``dense_activation_s``) and per weight
matrix per step (``dense_layer_s``). The shapes span the small MLPs of the example DLRM
to the reference DLRM (13-512-256-64 + 415-512-512-256-1), whose per-sample cost at batch
2048 is written as ``dense_time_per_sample`` for models planned without their dense layers.
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch

from torchrec_mtrains.planner.hardware.timing import nonneg_fit, step_clock
from torchrec_mtrains.planner.model.model_spec import DenseSpec

__all__ = ["REFERENCE_MLPS", "dense_costs"]

REFERENCE_MLPS = ((13, 512, 256, 64), (415, 512, 512, 256, 1))
"""The DLRM whose per-sample cost becomes ``dense_time_per_sample`` (the fallback)."""
REFERENCE_BATCH = 2048
# (MLPs, batch): small and large MLPs, few wide and many narrow layers, two batches.
_CASES: Tuple[Tuple[Tuple[Tuple[int, ...], ...], int], ...] = (
    (((13, 128, 32), (98, 256, 128, 1)), 128),
    (((13, 128, 32), (98, 256, 128, 1)), 512),
    (((64,) * 9,), 512),
    (REFERENCE_MLPS, 512),
)


def _shapes(mlps: Sequence[Sequence[int]]) -> List[Tuple[int, int]]:
    return [(a, b) for widths in mlps for a, b in zip(widths, widths[1:])]


def _step_seconds(mlps: Sequence[Sequence[int]], batch: int, steps: int) -> float:
    """Median seconds of a training step of the MLPs on random inputs."""
    import statistics

    clock = step_clock()
    gen = torch.Generator().manual_seed(batch)
    nets = []
    for widths in mlps:
        layers: List[torch.nn.Module] = []
        for a, b in zip(widths, widths[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        nets.append(torch.nn.Sequential(*layers[:-1]))
    params = [p for net in nets for p in net.parameters()]
    opt = torch.optim.Adagrad(params, lr=0.01)
    inputs = [torch.rand(batch, widths[0], generator=gen) for widths in mlps]
    times = []
    for i in range(steps + 2):
        t0 = clock()
        opt.zero_grad()
        sum(net(x).square().mean() for net, x in zip(nets, inputs)).backward()
        opt.step()
        if i >= 2:
            times.append(clock() - t0)
    return statistics.median(times)


def dense_costs(steps: int) -> Tuple[Dict[str, float], Dict[str, str]]:
    """The ``ComputeSpec`` dense fields (``dense_mac_s``, ``dense_activation_s``,
    ``dense_layer_s``, ``dense_s_per_sample``) and a note per YAML key."""
    points, seen = [], []
    for mlps, batch in _CASES:
        spec = DenseSpec.of_shapes(_shapes(mlps))
        t = _step_seconds(mlps, batch, steps)
        points.append(((batch * spec.macs_per_sample, batch * spec.outputs_per_sample, float(spec.layers)), t))
        seen.append(f"{'+'.join('-'.join(map(str, w)) for w in mlps)} x {batch}: {t * 1e3:.2f} ms")
    mac_s, out_s, layer_s = nonneg_fit(points)
    ref = DenseSpec.of_shapes(_shapes(REFERENCE_MLPS))
    per_sample = ref.macs_per_sample * mac_s + ref.outputs_per_sample * out_s + ref.layers * layer_s / REFERENCE_BATCH
    fields = {"dense_mac_s": mac_s, "dense_activation_s": out_s, "dense_layer_s": layer_s,
              "dense_s_per_sample": per_sample}
    fit = "fit of training steps (forward, loss, backward, Adagrad) of MLPs: " + "; ".join(seen)
    ref_name = " + ".join("-".join(map(str, w)) for w in REFERENCE_MLPS)
    return fields, {
        "dense_mac_cost": "per multiply-accumulate per sample; " + fit,
        "dense_activation_cost": "per layer output per sample; see dense_mac_cost",
        "dense_layer_cost": "per weight matrix per step; see dense_mac_cost",
        "dense_time_per_sample": f"the fit at the reference DLRM MLPs {ref_name}, batch {REFERENCE_BATCH} "
                                 "(for models planned without their dense layers)",
    }
