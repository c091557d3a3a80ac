"""torchx component of the sequence example (examples/sequence/train.py).

    torchx run -s local_cwd examples/sequence/component.py:sequence -- --steps 200 --out build/sequence-run

Run from the repository root (the script path is relative to the job's working directory),
as the DLRM example's component (examples/dlrm/component.py, docs/example.md).
"""

from typing import Dict, Optional

import torchx.specs as specs
from torchx.components.dist import ddp

SCRIPT = "examples/sequence/train.py"


def sequence(*script_args: str, j: str = "1x2", name: str = "mtrains-sequence", cpu: int = 2, memMB: int = 8192,
             env: Optional[Dict[str, str]] = None) -> specs.AppDef:
    """Trains a small sequence recommender (TorchRec's EmbeddingCollection) on DRAM/SCM/SSD tiers.

    Args:
        script_args: arguments of train.py (see ``python examples/sequence/train.py --help``)
        j: {nnodes}x{nproc_per_node}: nodes, and processes (ranks) on each
        name: job name
        cpu: cpus per node
        memMB: memory per node in MB
        env: environment variables for the run (OMP_NUM_THREADS and MALLOC_MMAP_THRESHOLD_
            default as in examples/dlrm/component.py, which says why)
    """
    env = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "4194304", **(env or {})}
    return ddp(*script_args, script=SCRIPT, name=name, cpu=cpu, memMB=memMB, j=j, env=env)
