"""cobalt.torch.launch reports the rank that failed first, not the follow-on failure of another
rank that lost its connection to it (which torch's join reported about half the time), also when
that rank died by a signal without a Python exception."""

from __future__ import annotations

import pytest
import torch.multiprocessing as mp

from cobalt.torch import launch

import small_workers


@pytest.mark.parametrize("failing_rank", [1, 3])
def test_the_first_failure_is_reported(failing_rank: int) -> None:
    with pytest.raises(mp.ProcessRaisedException) as info:
        launch(small_workers.one_rank_fails, 4, (failing_rank,), timeout_s=60,
               collective_timeout_s=20)
    message = str(info.value)
    assert message.startswith(f"rank {failing_rank} failed first:"), message
    assert f"ValueError: the root cause, on rank {failing_rank}" in message
    assert info.value.error_index == failing_rank


def test_a_rank_killed_by_a_signal_is_reported_first() -> None:
    # It leaves no Python exception; the others' "Connection closed by peer" came first.
    with pytest.raises(mp.ProcessRaisedException) as info:
        launch(small_workers.one_rank_is_killed, 3, (1,), timeout_s=60, collective_timeout_s=20)
    message = str(info.value)
    assert message.startswith("rank 1 died with signal SIGKILL, without a Python exception"), \
        message
    assert info.value.error_index == 1
