"""TieredProposer: TorchRec's ``Proposer`` for the tiered search space.

Proposes one option per table: table-wise first (one rank holds the table, so no extra
sharding group and its collectives); after a failed partition, row-wise for the tables the
partitioner could not place (their shards left without a rank), and again until a proposal
partitions or no table has another option.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from torchrec.distributed.planner.types import Enumerator, Proposer, ShardingOption, Topology
from torchrec.distributed.types import ShardingType

__all__ = ["TieredProposer"]

_PREFERENCE = (ShardingType.TABLE_WISE.value, ShardingType.ROW_WISE.value)


class TieredProposer(Proposer):
    def __init__(self) -> None:
        self._options: Dict[str, List[ShardingOption]] = {}  # fqn -> options, most preferred first
        self._choice: Dict[str, int] = {}
        self._done = True

    def load(self, search_space: List[ShardingOption], enumerator: Optional[Enumerator] = None) -> None:
        self._options = {}
        for option in search_space:
            self._options.setdefault(option.fqn, []).append(option)
        for options in self._options.values():
            options.sort(key=lambda o: _PREFERENCE.index(o.sharding_type) if o.sharding_type in _PREFERENCE else 99)
        self._choice = {fqn: 0 for fqn in self._options}
        self._done = not self._options

    def propose(self) -> Optional[List[ShardingOption]]:
        if self._done:
            return None
        return [self._options[fqn][k] for fqn, k in self._choice.items()]

    def feedback(
        self,
        partitionable: bool,
        plan: Optional[List[ShardingOption]] = None,
        perf_rating: Optional[float] = None,
        storage_constraint: Optional[Topology] = None,
    ) -> None:
        if partitionable or plan is None:
            self._done = True
            return
        moved = False
        for option in plan:
            if any(shard.rank is None for shard in option.shards):  # the partitioner could not place it
                k = self._choice[option.fqn]
                if k + 1 < len(self._options[option.fqn]):
                    self._choice[option.fqn] = k + 1
                    moved = True
        self._done = not moved
