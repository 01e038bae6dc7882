"""cobalt.torch.ops on CPU tensors: the CPU references behind the device-dispatching ops, checked
against brute-force definitions and the direct cobalt calls (test_cuda.py compares the CUDA path
with these on a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import cobalt
from cobalt.torch import ops
from op_inputs import demand_of, random_ids, random_layout, random_sources


@pytest.mark.parametrize("nodes,per_node,experts,k", [(2, 4, 16, 2), (4, 2, 32, 4), (3, 2, 12, 6)])
def test_assign_tasks_is_algorithm_1(nodes: int, per_node: int, experts: int, k: int) -> None:
    rng = np.random.default_rng(nodes * 100 + k)
    topo = cobalt.Topology(nodes, nodes * per_node)
    layout = random_layout(rng, topo, experts, experts // topo.num_ranks + 3)
    ids = random_ids(rng, 300, experts, k, skew=1.0)
    src = random_sources(rng, 300, topo.num_ranks)
    for search in ("auto", "masks", "subset_dp"):
        got = ops.assign_tasks(ids, src, layout, seed=5, step=3, layer=1, token_offset=40,
                               search=search)
        assert got.dtype == torch.int32 and got.shape == (300, k)
        batch = cobalt.RoutingBatch(ids.numpy(), src.numpy(), experts, topo.num_ranks)
        want = cobalt.assign_node_cover(batch, layout, seed=5, step=3, layer=1, token_offset=40,
                                        search={"auto": cobalt.CoverSearch.AUTO,
                                                "masks": cobalt.CoverSearch.MASK_ENUMERATION,
                                                "subset_dp": cobalt.CoverSearch.SUBSET_DP}[search])
        np.testing.assert_array_equal(got.numpy(), want)
        cobalt.validate_assignment(batch, layout, got.numpy())
    # Threads share the tokens on CPU in chunks of at least 8192; the ranks do not depend on how
    # many (20000 tokens: 2 chunks on 2 threads, 2 on 3).
    big_ids = random_ids(rng, 20000, experts, k, skew=1.0)
    big_src = random_sources(rng, 20000, topo.num_ranks)
    one_thread = ops.assign_tasks(big_ids, big_src, layout, seed=5, step=3).numpy()
    for threads in (2, 3):
        np.testing.assert_array_equal(
            ops.assign_tasks(big_ids, big_src, layout, seed=5, step=3,
                             num_threads=threads).numpy(), one_thread)
    # int64 inputs (what torch.topk returns) give the same answer.
    np.testing.assert_array_equal(ops.assign_tasks(ids.long(), src.long(), layout).numpy(),
                                  ops.assign_tasks(ids, src, layout).numpy())


def test_assign_tasks_rejects_bad_input() -> None:
    topo = cobalt.Topology(2, 4)
    layout = cobalt.ExpertLayout.static_ep(topo, 8, 2)
    ids = torch.tensor([[0, 9]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"expert id 9 out of range \[0, 8\)"):
        ops.assign_tasks(ids, torch.zeros(1, dtype=torch.int32), layout)
    with pytest.raises(ValueError, match="unknown cover search 'greedy'"):
        ops.assign_tasks(ids, torch.zeros(1, dtype=torch.int32), layout, search="greedy")
    with pytest.raises(ValueError, match="must be int32 or int64, got torch.float32"):
        ops.assign_tasks(ids.float(), torch.zeros(1, dtype=torch.int32), layout)
    for dtype in (torch.int16, torch.uint8):  # integer, but not an id dtype: named as such
        with pytest.raises(ValueError, match=f"topk_ids must be int32 or int64, got {dtype}"):
            ops.assign_tasks(ids.to(dtype), torch.zeros(1, dtype=torch.int32), layout)
    with pytest.raises(ValueError, match=r"num_threads must be an int >= 0 .*, got -1"):
        ops.assign_tasks(torch.tensor([[0, 1]], dtype=torch.int32),
                         torch.zeros(1, dtype=torch.int32), layout, num_threads=-1)
    # int64 values beyond int32 are refused, not wrapped (2^32 + 1 would wrap to expert 1).
    with pytest.raises(ValueError, match=r"topk_ids: integer array values \[0, 4294967297\] "
                       r"out of range \[-2147483648, 2147483647\]"):
        ops.assign_tasks(torch.tensor([[0, 2**32 + 1]]), torch.zeros(1, dtype=torch.int64),
                         layout)


def test_cpu_errors_name_the_argument() -> None:
    topo = cobalt.Topology(2, 4)
    for name, exec_rank, source in (
            ("exec_rank", torch.tensor([[0, 2**33]]), torch.zeros(1, dtype=torch.int64)),
            ("source_rank", torch.tensor([[0, 1]]), torch.tensor([-2**40]))):
        with pytest.raises(ValueError, match=f"dispatch_layout {name}: integer array values"):
            ops.dispatch_layout(exec_rank, source, topo)


def test_routing_counts_match_brute_force() -> None:
    rng = np.random.default_rng(3)
    for experts, k in [(8, 1), (16, 2), (40, 6)]:
        ids = random_ids(rng, 500, experts, k, skew=1.5)
        counts, coact = ops.routing_counts(ids, experts)
        want_counts = np.bincount(ids.numpy().ravel(), minlength=experts)
        want_coact = np.zeros((experts, experts), dtype=np.int64)
        for row in ids.numpy():
            for a in row:
                for b in row:
                    if a != b:
                        want_coact[a, b] += 1
        np.testing.assert_array_equal(counts.numpy(), want_counts)
        np.testing.assert_array_equal(coact.numpy(), want_coact)
        threaded = ops.routing_counts(ids, experts, num_threads=3)
        assert torch.equal(threaded[0], counts) and torch.equal(threaded[1], coact)
    with pytest.raises(ValueError, match=r"out of range \[0, 8\)"):
        ops.routing_counts(torch.tensor([[8]], dtype=torch.int32), 8)


def test_dispatch_layout_matches_definitions() -> None:
    rng = np.random.default_rng(11)
    topo = cobalt.Topology(3, 6)
    g, t, k = topo.num_ranks, 200, 4
    exec_rank = torch.from_numpy(rng.integers(0, g, (t, k), dtype=np.int32))
    src = random_sources(rng, t, g)
    d = ops.dispatch_layout(exec_rank, src, topo)
    er = exec_rank.numpy()
    in_rank = np.zeros((t, g), dtype=np.uint8)
    in_rank[np.repeat(np.arange(t), k), er.ravel()] = 1
    np.testing.assert_array_equal(d.token_in_rank.numpy(), in_rank)
    np.testing.assert_array_equal(d.rank_counts.numpy(), in_rank.sum(0))
    node_of = np.arange(g) // topo.ranks_per_node
    in_node = np.zeros((t, topo.num_nodes), dtype=bool)
    for tok in range(t):
        in_node[tok, node_of[er[tok]]] = True
    np.testing.assert_array_equal(d.node_counts.numpy(), in_node.sum(0))
    np.testing.assert_array_equal(d.rank_offsets.numpy(),
                                  np.concatenate([[0], np.cumsum(in_rank.sum(0))]))
    pairs = np.zeros((g, g), dtype=np.int64)
    np.add.at(pairs, (np.repeat(src.numpy(), g), np.tile(np.arange(g), t)), in_rank.ravel())
    np.testing.assert_array_equal(d.pair_counts.numpy(), pairs)
    # slot: rank offset + the token's position among the rank's tokens.
    before = np.cumsum(in_rank, axis=0) - in_rank
    want_slot = d.rank_offsets.numpy()[er] + before[np.arange(t)[:, None], er]
    np.testing.assert_array_equal(d.slot.numpy(), want_slot)


def test_dispatch_layout_into_a_kept_workspace(recwarn: pytest.WarningsRecorder) -> None:
    rng = np.random.default_rng(12)
    topo = cobalt.Topology(2, 4)
    g = topo.num_ranks
    ws = cobalt.DispatchLayoutWorkspace(topo, 300, 4)
    fields = ("rank_counts", "node_counts", "rank_offsets", "pair_counts", "token_in_rank", "slot")
    previous = None
    for t, k in ((300, 4), (17, 2), (0, 3), (120, 4)):
        exec_rank = torch.from_numpy(rng.integers(0, g, (t, k), dtype=np.int32))
        src = random_sources(rng, t, g)
        want = ops.dispatch_layout(exec_rank, src, topo)
        got = ops.dispatch_layout(exec_rank, src, topo, workspace=ws)
        for name in fields:
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        if previous is not None:
            # Views of the same buffers: the previous call's counts now read this call's.
            assert torch.equal(previous.rank_counts, got.rank_counts)
        previous = got
    assert not [w for w in recwarn if "not writable" in str(w.message)]
    with pytest.raises(ValueError, match="exceed the workspace's 300 x 4"):
        ops.dispatch_layout(torch.zeros((301, 4), dtype=torch.int32),
                            torch.zeros(301, dtype=torch.int32), topo, workspace=ws)
    with pytest.raises(TypeError, match="DispatchLayoutWorkspace"):
        ops.dispatch_layout(torch.zeros((1, 1), dtype=torch.int32),
                            torch.zeros(1, dtype=torch.int32), topo, workspace="buffers")


def test_solve_topoep_plan_is_consistent() -> None:
    rng = np.random.default_rng(5)
    topo = cobalt.Topology(2, 8)
    experts, slots = 32, 6
    ids = random_ids(rng, 800, experts, 4, skew=1.2)
    src = random_sources(rng, 800, topo.num_ranks)
    omega = demand_of(ids, src, topo.num_ranks, experts)
    plan = ops.solve_topoep(omega, topo, slots, token_bytes=8192.0, expert_param_bytes=2.0e6)
    again = ops.solve_topoep(omega, topo, slots, token_bytes=8192.0, expert_param_bytes=2.0e6)
    for name in ("slots", "source_offsets", "quota_expert", "quota_dst", "quota_count"):
        assert torch.equal(getattr(plan, name), getattr(again, name)), name
    offsets = plan.source_offsets.numpy()
    got = np.zeros_like(omega.numpy())
    loads = np.zeros(topo.num_ranks, dtype=np.int64)
    slot_table = plan.slots.numpy()
    for s in range(topo.num_ranks):
        for q in range(offsets[s], offsets[s + 1]):
            e, dst, c = (int(plan.quota_expert[q]), int(plan.quota_dst[q]),
                         int(plan.quota_count[q]))
            assert c > 0 and e in slot_table[dst], (s, e, dst)
            got[s, e] += c
            loads[dst] += c
    np.testing.assert_array_equal(got, omega.numpy())
    np.testing.assert_array_equal(plan.rank_loads.numpy(), loads)
    with pytest.raises(ValueError, match="negative"):
        bad = omega.clone()
        bad[0, 0] = -1
        ops.solve_topoep(bad, topo, slots, token_bytes=1.0, expert_param_bytes=1.0)
