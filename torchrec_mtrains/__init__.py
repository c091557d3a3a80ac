"""torchrec-mtrains: train TorchRec embedding tables on HBM, DRAM, SCM and SSD tiers.

Importing the package is cheap: it loads neither torch nor the compiled
extension. Subpackages (``torchrec_mtrains.storage``, ...) import those on use.
"""

from torchrec_mtrains.types import Tier

# Single source of the version: pyproject.toml reads it from here.
__version__ = "0.1.0"

__all__ = ["Tier", "__version__"]
