"""torchx component of the tiered-DLRM example.

    torchx run -s local_cwd examples/dlrm/component.py:dlrm -- --steps 200 --out build/example-run
    torchx run -s slurm examples/dlrm/component.py:dlrm -j 2x4 -- --hardware node.yaml --storage-dir /local/mtrains

Run from the repository root (the script path is relative to the job's working directory:
the repository on local_cwd and slurm, the image's working directory on kubernetes). Several
nodes, and the exact Slurm and Kubernetes commands: docs/example.md.
"""

from typing import Dict, List, Optional

import torchx.specs as specs
from torchx.components.dist import ddp

SCRIPT = "examples/dlrm/train.py"


def dlrm(
    *script_args: str,
    j: str = "1x2",
    image: str = "",
    name: str = "mtrains-dlrm",
    cpu: int = 2,
    memMB: int = 8192,
    h: Optional[str] = None,
    env: Optional[Dict[str, str]] = None,
    max_retries: int = 0,
    mounts: Optional[List[str]] = None,
) -> specs.AppDef:
    """Trains TorchRec's DLRM with embedding tables on DRAM/SCM/SSD tiers (examples/dlrm/train.py).

    Args:
        script_args: arguments of train.py (see ``python examples/dlrm/train.py --help``)
        j: {nnodes}x{nproc_per_node}: nodes, and processes (ranks) on each
        image: image (docker, kubernetes) or working directory (local_cwd, slurm); "" = the current one
        name: job name
        cpu: cpus per node
        memMB: memory per node in MB
        h: a registered named resource (takes precedence over cpu and memMB)
        env: environment variables for the run; OMP_NUM_THREADS defaults to 1 (train.py sets
            each rank's threads to the node's cores over its ranks itself; given here,
            torchrun does not warn that it chose one); MALLOC_MMAP_THRESHOLD_ defaults to 4194304
            (glibc then maps every buffer of 4 MiB or more on its own and returns it when freed,
            instead of letting its sliding threshold move such buffers onto the heap, where the
            tiered kernel's per-step row buffers fragment it; 262144 keeps the RSS flat but
            costs ~30% of the example's QPS in page faults; docs/results/reliability.md measures it)
        max_retries: scheduler retries allowed
        mounts: mounts into each node's container (docker, kubernetes), e.g.
            type=bind,src=/mnt/nvme,dst=/mnt/nvme (a host path: node-local table files) or
            type=volume,src=CLAIM,dst=/ckpt (a persistent volume claim: checkpoints)
    """
    env = {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "4194304", **(env or {})}
    return ddp(
        *script_args,
        script=SCRIPT,
        image=image,
        name=name,
        cpu=cpu,
        memMB=memMB,
        h=h,
        j=j,
        env=env,
        max_retries=max_retries,
        mounts=mounts,
    )
