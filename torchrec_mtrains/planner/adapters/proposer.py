"""TieredProposer: TorchRec's ``Proposer`` for the tiered search space.

Proposes one option per table, table-wise first (one rank holds the table, so no extra
sharding group and its collectives), then searches in two ways, driven by the feedback of
each proposal as TorchRec's proposers are:

- **To partition.** After a failed partition, the tables the partitioner could not place
  (their shards left without a rank) move to their next option (row-wise), again until a
  proposal partitions or no table has another option.
- **To balance.** Once a proposal partitions, its ``perf_rating`` is the predicted step of
  its slowest rank (the job runs at that rank's pace). The heaviest table-wise table on the
  slowest rank is proposed row-wise instead (its rows, cache and tier I/O spread over every
  rank); the change is kept when the slowest rank's step shrinks by more than
  ``min_gain``, and undone otherwise. The partitioner's rating counts what a row-wise
  table costs every rank (its sharding group's collectives: ``row_wise_setup_s`` once,
  ``row_wise_group_s`` per table). A split
  that leaves other tables without room (its shards take some on every rank) is proposed
  again with those tables split too, before it is judged. One table per trial, until no
  table-wise table of the slowest rank is left untried or ``max_trials`` proposals were made.

``best()`` is the best partitionable proposal seen; the planner partitions it again for the
final plan.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

from torchrec.distributed.planner.types import Enumerator, Proposer, ShardingOption, Topology
from torchrec.distributed.types import ShardingType

__all__ = ["TieredProposer"]

_TABLE_WISE, _ROW_WISE = ShardingType.TABLE_WISE.value, ShardingType.ROW_WISE.value
_PREFERENCE = (_TABLE_WISE, _ROW_WISE)


class TieredProposer(Proposer):
    """Args: ``min_gain``: the share by which a change must shorten the slowest rank's
    predicted step to be kept (a row-wise table costs collectives the model does not
    count); ``max_trials``: balancing proposals at most."""

    def __init__(self, min_gain: float = 0.02, max_trials: int = 16) -> None:
        self._min_gain = min_gain
        self._max_trials = max_trials
        self._options: Dict[str, List[ShardingOption]] = {}  # fqn -> options, most preferred first
        self._choice: Dict[str, int] = {}
        self._done = True
        self._best: Optional[Tuple[float, Dict[str, int]]] = None  # (slowest rank's step, choice)
        self._trial: Optional[Dict[str, int]] = None  # the choice before the current balancing trial
        self._tried: Set[str] = set()
        self._candidates: List[str] = []  # tables of the best proposal's slowest rank to try
        self._trials = 0

    def load(self, search_space: List[ShardingOption], enumerator: Optional[Enumerator] = None) -> None:
        self._options = {}
        for option in search_space:
            self._options.setdefault(option.fqn, []).append(option)
        for options in self._options.values():
            options.sort(key=lambda o: _PREFERENCE.index(o.sharding_type) if o.sharding_type in _PREFERENCE else 99)
        self._choice = {fqn: 0 for fqn in self._options}
        self._done = not self._options
        self._best, self._trial, self._tried, self._candidates, self._trials = None, None, set(), [], 0

    def propose(self) -> Optional[List[ShardingOption]]:
        if self._done:
            return None
        return self._proposal(self._choice)

    def best(self) -> Optional[List[ShardingOption]]:
        """The partitionable proposal whose slowest rank was fastest (None before one)."""
        return None if self._best is None else self._proposal(self._best[1])

    def best_rating(self) -> Optional[float]:
        return None if self._best is None else self._best[0]

    def feedback(
        self,
        partitionable: bool,
        plan: Optional[List[ShardingOption]] = None,
        perf_rating: Optional[float] = None,
        storage_constraint: Optional[Topology] = None,
    ) -> None:
        if self._best is None and not partitionable:
            self._done = plan is None or not self._next_options_for_unplaced(plan)
            return
        if partitionable and perf_rating is None:  # nothing to balance by: take it
            self._best = self._best or (0.0, dict(self._choice))
            self._done = True
            return
        improved = partitionable and (self._best is None or perf_rating < self._best[0] * (1 - self._min_gain))
        if improved:
            self._best = (float(perf_rating), dict(self._choice))
            self._candidates = self._on_slowest_rank(plan)
        elif self._trial is not None:
            if (not partitionable and plan is not None and self._trials < self._max_trials
                    and self._next_options_for_unplaced(plan)):
                # The split left other tables without room (its shards took some on every
                # rank): the same trial again, those tables split too.
                self._trials += 1
                return
            self._choice = self._trial  # no better, or it cannot partition: undo it
        self._trial = None
        self._done = not self._try_next()

    # ------------------------------------------------------------------ helpers ----
    def _proposal(self, choice: Dict[str, int]) -> List[ShardingOption]:
        return [self._options[fqn][k] for fqn, k in choice.items()]

    def _next_options_for_unplaced(self, plan: List[ShardingOption]) -> bool:
        """Moves each table the partitioner could not place to its next option."""
        moved = False
        for option in plan:
            if any(shard.rank is None for shard in option.shards):
                k = self._choice[option.fqn]
                if k + 1 < len(self._options[option.fqn]):
                    self._choice[option.fqn] = k + 1
                    moved = True
        return moved

    def _on_slowest_rank(self, plan: List[ShardingOption]) -> List[str]:
        """Table-wise tables of the rank with the most predicted work that have a row-wise
        option, heaviest first. A rank's work: its compute, or its busiest tier's I/O."""
        compute: Dict[int, float] = {}
        io: Dict[Tuple[int, object], float] = {}
        for option in plan:
            cost = getattr(option, "cost", None)
            if cost is None:
                continue
            for shard in option.shards:
                if shard.rank is None:
                    continue
                share = option.shard_fraction(shard)
                compute[shard.rank] = compute.get(shard.rank, 0.0) + cost.compute_s * share
                for tier, seconds in cost.io_s.items():
                    io[shard.rank, tier] = io.get((shard.rank, tier), 0.0) + seconds * share
        work = {r: max([c] + [s for (rank, _), s in io.items() if rank == r]) for r, c in compute.items()}
        if not work:
            return []
        slowest = max(work, key=lambda r: (work[r], -r))

        def load(option: ShardingOption) -> float:
            return max([option.cost.compute_s] + list(option.cost.io_s.values()))

        mine = [o for o in plan if o.sharding_type == _TABLE_WISE and getattr(o, "cost", None) is not None
                and o.shards[0].rank == slowest
                and any(alt.sharding_type == _ROW_WISE for alt in self._options[o.fqn])]
        return [o.fqn for o in sorted(mine, key=load, reverse=True)]

    def _try_next(self) -> bool:
        """Proposes the next untried table of the slowest rank row-wise; False when none is
        left or the trials are spent."""
        if self._trials >= self._max_trials:
            return False
        for fqn in self._candidates:
            if fqn in self._tried:
                continue
            self._tried.add(fqn)
            row_wise = next(k for k, o in enumerate(self._options[fqn]) if o.sharding_type == _ROW_WISE)
            self._trial = dict(self._choice)
            self._choice[fqn] = row_wise
            self._trials += 1
            return True
        return False
