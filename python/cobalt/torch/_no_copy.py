"""Refusing copies of the runtime's objects with a message that says what to do instead."""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["NotCopyable"]


class NotCopyable:
    """Mixin: copy.copy, copy.deepcopy and pickling (torch.save of a module, which
    torch.optim.swa_utils.AveragedModel's deepcopy also meets) raise TypeError naming the class
    and what to use instead. A copy would share the runtime's process group and layout policy
    with the original (neither can be copied), and its bank rows, which move between slots as
    layouts change, would be matched by position with the original's."""

    def _refuse_copy(self) -> NoReturn:
        raise TypeError(
            f"{type(self).__name__} cannot be copied or pickled (copy.deepcopy, torch.save of "
            "a module, AveragedModel): it shares the runtime's process group and layout policy, "
            "and its expert bank rows move between slots as layouts change. Save "
            "model.state_dict() on every rank (or cobalt.torch.gather_training_state); for a "
            "copy of the weights by expert id (an EMA, say) use moe.gather_expert_weights()")

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        self._refuse_copy()

    def __copy__(self) -> NoReturn:
        self._refuse_copy()

    def __deepcopy__(self, memo: Any) -> NoReturn:
        self._refuse_copy()
