"""What TorchRec's own planner needs to plan for the tiered sharder on the CPU.

Importing the sharder imports this, which adjusts two of TorchRec's planner defaults:

- TorchRec prices a shard by its kernel's bandwidth, which it knows for KEY_VALUE on CUDA
  only (FBGEMM's RocksDB TBE) and refuses elsewhere. The tiered sharder offers KEY_VALUE on
  the CPU, so this registers, under TorchRec's default estimator name, TorchRec's default
  config with one more entry: a KEY_VALUE shard on the CPU reads its cache hits at the
  topology's DDR bandwidth and its misses at its SSD bandwidth. The virtual-table kernels,
  which the sharder also offers on the CPU, are priced alike: ``dram_virtual_table`` at DDR
  bandwidth, ``ssd_virtual_table`` and ``dram_ssd_virtual_table`` as KEY_VALUE. Every other
  (device, kernel) pair is priced as before.
- TorchRec's enumerator proposes every kernel a sharder offers, except the "guarded" ones,
  to tables without constraints. The tiered sharder offers CUSTOMIZED_KERNEL, whose plan
  entries need tier settings that only ``tiered_sharding_plan`` and the StorageAwarePlanner
  write, so it joins TorchRec's guarded kernels: TorchRec's planner uses it only for a
  table whose constraints name it (as it does KEY_VALUE).
"""

from __future__ import annotations

from typing import Optional

from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner import enumerators
from torchrec.distributed.planner.constants import DEFAULT_PERF_ESTIMATOR
from torchrec.distributed.planner.estimator.config import EmbeddingPerfEstimatorConfig
from torchrec.distributed.planner.estimator.estimator import EmbeddingPerfEstimatorFactory

__all__ = ["CpuKeyValuePerfConfig", "key_value_bandwidth"]

_CPU_KEY_VALUE = ("cpu", EmbeddingComputeKernel.KEY_VALUE.value)
# The virtual-table kernels the tiered sharder offers on the CPU (sharding/virtual_tables.py).
_CPU_SSD_LIKE = {("cpu", k.value) for k in (EmbeddingComputeKernel.SSD_VIRTUAL_TABLE,
                                            EmbeddingComputeKernel.DRAM_SSD_VIRTUAL_TABLE)} | {_CPU_KEY_VALUE}
_CPU_DRAM_VIRTUAL = ("cpu", EmbeddingComputeKernel.DRAM_VIRTUAL_TABLE.value)

enumerators.GUARDED_COMPUTE_KERNELS.add(EmbeddingComputeKernel.CUSTOMIZED_KERNEL)


def key_value_bandwidth(ddr_mem_bw: float, ssd_mem_bw: float, caching_ratio: Optional[float]) -> float:
    """Bytes per ms of a KEY_VALUE shard on the CPU: a ``caching_ratio`` share of its rows
    from the DRAM row cache, the rest from the SSD (None: all from the SSD)."""
    hit = 0.0 if caching_ratio is None else min(1.0, max(0.0, float(caching_ratio)))
    return 1.0 / (hit / ddr_mem_bw + (1.0 - hit) / ssd_mem_bw)


@EmbeddingPerfEstimatorFactory.register(DEFAULT_PERF_ESTIMATOR)
class CpuKeyValuePerfConfig(EmbeddingPerfEstimatorConfig):
    """TorchRec's default perf config, plus KEY_VALUE on the CPU (the tiered kernel)."""

    def get_device_bw(
        self,
        compute_device: str,
        compute_kernel: str,
        hbm_mem_bw: float,
        ddr_mem_bw: float,
        ssd_mem_bw: float,
        hbm_to_ddr_mem_bw: float,
        caching_ratio: Optional[float] = None,
        prefetch_pipeline: bool = False,
    ) -> Optional[float]:
        pair = (compute_device.lower(), compute_kernel.lower())
        if pair in _CPU_SSD_LIKE:
            return key_value_bandwidth(ddr_mem_bw, ssd_mem_bw, caching_ratio)
        if pair == _CPU_DRAM_VIRTUAL:
            return ddr_mem_bw
        return super().get_device_bw(compute_device, compute_kernel, hbm_mem_bw, ddr_mem_bw, ssd_mem_bw,
                                     hbm_to_ddr_mem_bw, caching_ratio, prefetch_pipeline)
