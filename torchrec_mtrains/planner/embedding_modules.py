"""The embedding collections of a module the planners plan: TorchRec's
EmbeddingBagCollections (pooled bags) and EmbeddingCollections (a row per id: sequences)."""

from __future__ import annotations

import dataclasses
from typing import Any, List

from torch import nn
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

__all__ = ["EmbeddingModule", "embedding_modules"]


@dataclasses.dataclass(frozen=True)
class EmbeddingModule:
    """One collection: its path in the module, itself, its table configs, the module dict of
    its tables (``tables[name].weight``) and whether it looks ids up unpooled."""

    path: str
    module: nn.Module
    configs: List[Any]
    tables: nn.ModuleDict
    sequence: bool


def embedding_modules(module: nn.Module) -> List[EmbeddingModule]:
    out = []
    for path, m in module.named_modules():
        if isinstance(m, EmbeddingBagCollection):
            out.append(EmbeddingModule(path, m, m.embedding_bag_configs(), m.embedding_bags, False))
        elif isinstance(m, EmbeddingCollection):
            out.append(EmbeddingModule(path, m, m.embedding_configs(), m.embeddings, True))
    return out
