"""State shared by the expert-parallel MoE layers of one model: the process group, the layout
source (one C++ policy for all layers), the step counter, the optimizer whose state moves with
main instances, byte counters and per-(step, layer) records."""

from __future__ import annotations

import contextlib
import operator
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Union

import numpy as np
import torch

from cobalt.torch._no_copy import NotCopyable
from cobalt.torch.ep_group import EPGroup
from cobalt.torch.layout_source import LayoutSource
from cobalt.torch.traffic import TrafficStats

__all__ = ["ExpertParallelRuntime", "StepRecord"]


@dataclass
class StepRecord:
    """One layer's forward at one step, from the global routing (identical on every rank).

    cross_node_tokens is Cobalt's V (``cross_node_transfers(...).dedup``): token copies that
    cross node boundaries in one exchange; the layer's forward moves 2 V such rows (dispatch +
    combine) and its backward another 2 V.
    """

    step: int
    layer: int
    version: int  # layout version in force for this forward
    layout_changed: bool  # a new version was applied by this forward
    migration_ok: bool  # False when a layout change was rolled back
    num_tokens: int
    num_tasks: int
    cross_node_tokens: int
    cross_node_tasks_no_dedup: int
    rank_loads: np.ndarray  # [G] tasks executed per rank
    imbalance: float
    num_replicas: int


class ExpertParallelRuntime(NotCopyable):
    """Shared by all :class:`~cobalt.torch.ExpertParallelMoE` layers of a model.

    Usage per training step::

        out = model(x); loss.backward()      # layers exchange tokens and replica gradients
        optimizer.step(); optimizer.zero_grad()
        runtime.end_step()                   # the next forward may apply a new layout

    Layout changes are applied by the forward that first sees them, before any expert runs:
    main instances move with their gradient and optimizer state rows (attach the optimizer with
    :meth:`attach_optimizer`). Within a step (gradient accumulation, several forwards into one
    backward) mains never move while a forward still waits for its backward pass; the change
    then lands at a later forward. A step's backward passes must end before :meth:`end_step`.
    """

    #: Records kept by default (``keep_records=True``): the most recent ones, so that a long run
    #: does not grow without bound (about 1 KB each at 64 ranks: 1026 bytes by tracemalloc,
    #: 2026-12-05, a record with a [64] int64 rank_loads and distinct scalars).
    DEFAULT_RECORDS = 4096

    def __init__(self, ep: EPGroup, source: LayoutSource, *, verify_decisions: bool = True,
                 keep_records: Union[bool, int, None] = True) -> None:
        """keep_records: the :class:`StepRecord` of every (forward, layer) goes to
        :attr:`records`, which keeps the most recent ``DEFAULT_RECORDS`` (True), the most recent
        N (an int N >= 0; 0 or False: none, and no step metrics are computed) or all (None)."""
        self.ep = ep
        self.source = source
        self.step = 0
        self.verify_decisions = verify_decisions
        self.keep_records = keep_records  # validated by the property
        self.optimizer: Optional[torch.optim.Optimizer] = None
        self.optimizer_attached = False
        self.traffic = TrafficStats(ep.rank, ep.ranks_per_node)
        self.records: list[StepRecord] = []  # the most recent max_records (add_record)
        self.layouts_frozen = False  # frozen_layouts()
        self._end_step_hooks: list[weakref.WeakMethod] = []

    @property
    def keep_records(self) -> bool:
        """Whether forwards add records. Set it to True, False, None or an int N >= 0, as the
        constructor's argument (the bound applies from the next record on)."""
        return self.max_records != 0

    @keep_records.setter
    def keep_records(self, keep: Union[bool, int, None]) -> None:
        if keep is True:
            self.max_records: Optional[int] = self.DEFAULT_RECORDS
        elif keep is None:
            self.max_records = None
        else:
            try:
                bound = operator.index(keep)  # False is 0; numpy integers are ints
            except TypeError:
                bound = -1
            if bound < 0:
                raise ValueError(f"ExpertParallelRuntime: keep_records {keep!r} must be True, "
                                 "False, None or an int >= 0")
            self.max_records = bound

    def add_record(self, record: StepRecord) -> None:
        """Appends to :attr:`records`, dropping the oldest beyond :attr:`max_records`."""
        self.records.append(record)
        if self.max_records is not None and len(self.records) > self.max_records:
            del self.records[:len(self.records) - self.max_records]

    @property
    def slots_per_rank(self) -> int:
        return self.source.slots_per_rank

    def attach_optimizer(self, optimizer: Optional[torch.optim.Optimizer]) -> None:
        """The optimizer that steps the expert banks: its per-parameter state rows migrate with
        main instances (call on every rank, with the same optimizer type). None declares that no
        optimizer keeps per-parameter state for the banks (e.g. plain SGD, or forward and
        backward passes only). Main instances of a trainable bank do not move before this is
        called: the layer raises ValueError on every rank instead (their optimizer state would
        be left behind in the slots they leave)."""
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"attach_optimizer: expected a torch.optim.Optimizer or None, got "
                             f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.optimizer_attached = True

    @contextlib.contextmanager
    def frozen_layouts(self) -> Iterator[None]:
        """Within: every layer keeps the layout in force and assigns tasks on it with cobalt+'s
        balanced cover (``cobalt.assign_balanced_cover``); the layout source is not asked, so its
        statistics and plans do not see these forwards, and no expert moves. For evaluation
        between training steps (outputs are exact under any layout). A layer that has not run a
        forward yet asks the layout source. Every rank must enter it alike: with
        ``verify_decisions`` ranks that do not raise RuntimeError on every rank; without it they
        exchange under different plans (a gloo error or a hang)."""
        before = self.layouts_frozen
        self.layouts_frozen = True
        try:
            yield
        finally:
            self.layouts_frozen = before

    def on_end_step(self, method: Callable[[], None]) -> None:
        """Calls the bound `method` at every :meth:`end_step` while its object lives."""
        self._end_step_hooks.append(weakref.WeakMethod(method))

    def end_step(self) -> None:
        """Marks the end of a training step (after optimizer.step())."""
        self.step += 1
        alive = []
        for ref in self._end_step_hooks:
            method = ref()
            if method is not None:
                method()
                alive.append(ref)
        self._end_step_hooks = alive
