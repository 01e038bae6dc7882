"""Node-deduplicated dispatch/combine plans (identical on every rank).

Every rank knows the whole step's routing (expert ids, execution ranks and source ranks of all T
tokens, gathered once per layer), so every rank can derive every message of the exchange without
exchanging metadata. :func:`build_exchange_plan` returns the index arrays one rank needs (the C++
``cobalt.exchange_plan``, include/cobalt/assign/exchange_plan.hpp, two passes over the tokens);
:func:`build_exchange_plan_reference` computes the same arrays with numpy sorts, as the
definitions below read (the tests compare them).

Ranks: G = N * M, rank r on node r // M with local index r % M. The *rail peer* of rank s on node n
is n * M + s % M (the rank with the same local index).

A *delivery* is a unique (token t, execution rank d) pair: d needs token t once, however many of
t's K experts it runs. For a token from source rank s on node ns:

* d == s: local, nothing moves.
* node(d) == ns: **intra** delivery, s -> d directly (dispatch stage 1, intra-node).
* node(d) != ns: **remote** delivery. The token crosses to node(d) **once**, to the rail peer
  p = rail(node(d), s) (stage 1, cross-node, one copy per (token, remote node)); p forwards it to
  d when d != p (stage 2, intra-node).

Combine mirrors it: d holds a partial sum of its tasks' gated expert outputs for t. Intra: d -> s
(combine stage A). Remote: d -> p when d != p (stage A, intra-node), p adds the partials of its
node (and its own) and sends one row to s (stage B, cross-node). So the rows crossing node
boundaries in dispatch stage 1 and in combine stage B both equal Cobalt's metric
V = sum_t |{node(exec(t, k))} minus {node(src_t)}| (``cross_node_transfers(...).dedup``). The
backward pass runs the same two exchanges in reverse (same row counts), so one layer's step moves
4 V token rows across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import cobalt

__all__ = ["ExchangePlan", "RoutingGlobal", "build_exchange_plan", "build_exchange_plan_reference"]

_I64 = np.int64


@dataclass(frozen=True)
class RoutingGlobal:
    """One layer's step, as every rank sees it after the gather.

    Attributes:
        topk_ids: [T, K] int32 expert ids (tokens of rank 0 first, then rank 1, ...).
        exec_rank: [T, K] int32 execution rank of every task.
        source_rank: [T] int32 rank each token comes from (non-decreasing).
        token_offsets: [G + 1] int64, rank r owns tokens token_offsets[r] .. token_offsets[r+1]-1.
        slots: [G, S] int32 expert id per rank slot of the layout in force (-1 empty).
        ranks_per_node: M.
    """

    topk_ids: np.ndarray
    exec_rank: np.ndarray
    source_rank: np.ndarray
    token_offsets: np.ndarray
    slots: np.ndarray
    ranks_per_node: int

    @property
    def num_ranks(self) -> int:
        return int(self.slots.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.topk_ids.shape[0])


@dataclass
class ExchangePlan:
    """What one rank sends, receives and computes for one layer's step.

    Row-index arrays are int64 numpy arrays. "splits" are per-peer row counts for
    ``all_to_all_single`` (length G). Notation: T_r local tokens, R = rows of the token table
    (unique tokens this rank executes tasks for).

    Dispatch:
        s1_send_idx [n1_send]: local token index of each stage-1 row, ordered by (dest, token).
        s2_send_idx [n2_send]: row of the stage-1 receive buffer to forward in stage 2.
        table_idx [R]: row of cat(local payload, stage-1 recv, stage-2 recv) for each table row.
    Experts:
        slot_rows[j] / slot_k[j]: table rows and top-k positions of the tasks of local slot j.
    Combine:
        ca_send_idx [nA_send]: table row of each stage-A row (partial sums), ordered by (dest, t).
        q_own_dst/q_own_src: stage-B row <- table row (this rank's own partial, as rail peer).
        q_recv_dst/q_recv_src: stage-B row <- stage-A recv row (node partials, as rail peer).
        nb_send: rows sent in stage B (all of the rail buffer, in order).
        y_own_dst/y_own_src: local token <- table row (tasks run on the source rank itself).
        y_recv_a_dst/y_recv_a_src: local token <- stage-A recv row (same-node executors).
        y_recv_b_dst [nB_recv]: local token of each stage-B recv row (remote nodes).
    """

    rank: int
    num_local_tokens: int
    s1_send_idx: np.ndarray
    s1_send_splits: list[int]
    s1_recv_splits: list[int]
    s2_send_idx: np.ndarray
    s2_send_splits: list[int]
    s2_recv_splits: list[int]
    table_idx: np.ndarray
    slot_rows: list[np.ndarray]
    slot_k: list[np.ndarray]
    ca_send_idx: np.ndarray
    ca_send_splits: list[int]
    ca_recv_splits: list[int]
    q_own_dst: np.ndarray
    q_own_src: np.ndarray
    q_recv_dst: np.ndarray
    q_recv_src: np.ndarray
    cb_send_splits: list[int]
    cb_recv_splits: list[int]
    y_own_dst: np.ndarray
    y_own_src: np.ndarray
    y_recv_a_dst: np.ndarray
    y_recv_a_src: np.ndarray
    y_recv_b_dst: np.ndarray
    # Global message counts (identical on every rank), for accounting and tests.
    totals: dict[str, int] = field(default_factory=dict)

    @property
    def num_table_rows(self) -> int:
        return int(self.table_idx.shape[0])


def _lexsort(*keys: np.ndarray) -> np.ndarray:
    """Indices sorting by keys[0], then keys[1], ... (np.lexsort takes the last key first)."""
    return np.lexsort(tuple(reversed(keys)))


def _positions_within_groups(group: np.ndarray, order: np.ndarray) -> np.ndarray:
    """pos[i] = rank of element i among the elements of its group, in `order`."""
    pos = np.empty(group.shape[0], dtype=_I64)
    if group.shape[0] == 0:
        return pos
    g_sorted = group[order]
    starts = np.r_[0, np.flatnonzero(g_sorted[1:] != g_sorted[:-1]) + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, g_sorted.shape[0]]))
    pos[order] = np.arange(g_sorted.shape[0], dtype=_I64) - run_start
    return pos


def _counts(values: np.ndarray, num_ranks: int) -> list[int]:
    return np.bincount(values, minlength=num_ranks).astype(_I64).tolist()


class _PairLookup:
    """Maps (a, t) pairs to values; every queried pair must exist."""

    def __init__(self, a: np.ndarray, t: np.ndarray, values: np.ndarray, num_tokens: int) -> None:
        self._stride = max(num_tokens, 1)
        keys = a.astype(_I64) * self._stride + t.astype(_I64)
        order = np.argsort(keys, kind="stable")
        self._keys = keys[order]
        self._values = values[order]

    def __call__(self, a: np.ndarray | int, t: np.ndarray) -> np.ndarray:
        keys = np.asarray(a, dtype=_I64) * self._stride + t.astype(_I64)
        idx = np.searchsorted(self._keys, keys)
        if keys.shape[0] and (
            idx.max(initial=0) >= self._keys.shape[0] or not np.array_equal(self._keys[idx], keys)
        ):
            raise AssertionError("exchange plan: missing (rank, token) pair in lookup")
        return self._values[idx]


def build_exchange_plan(routing: RoutingGlobal, rank: int) -> ExchangePlan:
    """Builds rank `rank`'s plan for one layer's step (see the module docstring for the routes):
    the C++ ``cobalt.exchange_plan`` (O(T K^2), the same work on every rank), equal field for
    field to :func:`build_exchange_plan_reference`."""
    g, m = routing.num_ranks, routing.ranks_per_node
    d = cobalt.exchange_plan(
        np.ascontiguousarray(routing.topk_ids, dtype=np.int32),
        np.ascontiguousarray(routing.exec_rank, dtype=np.int32),
        np.ascontiguousarray(routing.source_rank, dtype=np.int32),
        cobalt.Topology(g // m, g),
        np.ascontiguousarray(routing.slots[rank], dtype=np.int32), rank)
    offsets = d["slot_offsets"]
    slot_rows = [d["slot_rows"][offsets[j]:offsets[j + 1]] for j in range(offsets.shape[0] - 1)]
    slot_k = [d["slot_k"][offsets[j]:offsets[j + 1]] for j in range(offsets.shape[0] - 1)]
    return ExchangePlan(
        rank=rank,
        num_local_tokens=int(d["num_local_tokens"]),
        s1_send_idx=d["s1_send_idx"],
        s1_send_splits=d["s1_send_splits"].tolist(),
        s1_recv_splits=d["s1_recv_splits"].tolist(),
        s2_send_idx=d["s2_send_idx"],
        s2_send_splits=d["s2_send_splits"].tolist(),
        s2_recv_splits=d["s2_recv_splits"].tolist(),
        table_idx=d["table_idx"],
        slot_rows=slot_rows,
        slot_k=slot_k,
        ca_send_idx=d["ca_send_idx"],
        ca_send_splits=d["ca_send_splits"].tolist(),
        ca_recv_splits=d["ca_recv_splits"].tolist(),
        q_own_dst=d["q_own_dst"],
        q_own_src=d["q_own_src"],
        q_recv_dst=d["q_recv_dst"],
        q_recv_src=d["q_recv_src"],
        cb_send_splits=d["cb_send_splits"].tolist(),
        cb_recv_splits=d["cb_recv_splits"].tolist(),
        y_own_dst=d["y_own_dst"],
        y_own_src=d["y_own_src"],
        y_recv_a_dst=d["y_recv_a_dst"],
        y_recv_a_src=d["y_recv_a_src"],
        y_recv_b_dst=d["y_recv_b_dst"],
        totals={
            "deliveries": int(d["num_deliveries"]),
            "dispatch_cross_rows": int(d["num_cross_rows"]),
            "dispatch_intra_rows": int(d["num_intra_rows"]),
            "combine_cross_rows": int(d["num_cross_rows"]),
            "combine_intra_rows": int(d["num_intra_rows"]),
            "stage1_rows": int(d["num_stage1_rows"]),
            "stage1_cross_rows": int(d["num_cross_rows"]),
        },
    )


def build_exchange_plan_reference(routing: RoutingGlobal, rank: int) -> ExchangePlan:
    """:func:`build_exchange_plan` with numpy sorts over the whole step, as the module docstring
    defines the routes: the reference the C++ plan is tested against.

    Cost O(T K log(T K)) numpy work, the same on every rank.
    """
    ids = np.ascontiguousarray(routing.topk_ids, dtype=_I64)
    exe = np.ascontiguousarray(routing.exec_rank, dtype=_I64)
    src = np.ascontiguousarray(routing.source_rank, dtype=_I64)
    offsets = np.asarray(routing.token_offsets, dtype=_I64)
    G = routing.num_ranks
    M = routing.ranks_per_node
    T, K = ids.shape
    r = rank
    my_first = int(offsets[r])
    my_tokens = int(offsets[r + 1] - offsets[r])

    # Deliveries: unique (t, d), sorted by t then d.
    tok = np.repeat(np.arange(T, dtype=_I64), K)
    keys = np.unique(tok * G + exe.ravel())
    dt, dd = keys // G, keys % G
    ds = src[dt]
    d_node, s_node = dd // M, ds // M
    is_local = dd == ds
    is_intra = (d_node == s_node) & ~is_local
    is_remote = d_node != s_node
    rail = d_node * M + ds % M

    # Stage 1 (dispatch): intra deliveries s -> d, and one copy per (token, remote node) s -> rail.
    rem_pairs = np.unique(dt[is_remote] * G + rail[is_remote])
    m1_t = np.r_[dt[is_intra], rem_pairs // G]
    m1_q = np.r_[dd[is_intra], rem_pairs % G]
    m1_s = src[m1_t]
    m1_cross = np.r_[np.zeros(int(is_intra.sum()), bool), np.ones(rem_pairs.shape[0], bool)]
    pos1 = _positions_within_groups(m1_q, _lexsort(m1_q, m1_s, m1_t))  # recv order (s, t)
    lookup1 = _PairLookup(m1_q, m1_t, pos1, T)

    mine = m1_s == r
    order = _lexsort(m1_q[mine], m1_t[mine])
    s1_send_idx = (m1_t[mine][order] - my_first).astype(_I64)
    s1_send_splits = _counts(m1_q[mine], G)
    s1_recv_splits = _counts(m1_s[m1_q == r], G)
    n1_recv = int(sum(s1_recv_splits))

    # Stage 2 (dispatch): the rail peer forwards to the other executors of its node.
    fwd = is_remote & (dd != rail)
    m2_t, m2_p, m2_d = dt[fwd], rail[fwd], dd[fwd]
    pos2 = _positions_within_groups(m2_d, _lexsort(m2_d, m2_p, m2_t))  # recv order (p, t)
    lookup2 = _PairLookup(m2_d, m2_t, pos2, T)
    mine = m2_p == r
    order = _lexsort(m2_d[mine], m2_t[mine])
    s2_send_idx = lookup1(r, m2_t[mine][order])
    s2_send_splits = _counts(m2_d[mine], G)
    s2_recv_splits = _counts(m2_p[m2_d == r], G)

    # Token table of this rank: its deliveries, by token.
    at_me = dd == r
    table_t = dt[at_me]
    table_local = is_local[at_me]
    table_from_s2 = fwd[at_me]
    table_idx = np.empty(table_t.shape[0], dtype=_I64)
    table_idx[table_local] = table_t[table_local] - my_first
    via_s1 = ~table_local & ~table_from_s2
    table_idx[via_s1] = my_tokens + lookup1(r, table_t[via_s1])
    table_idx[table_from_s2] = my_tokens + n1_recv + lookup2(r, table_t[table_from_s2])

    # Expert tasks of this rank, per local slot.
    my_slots = np.asarray(routing.slots[r], dtype=_I64)
    num_slots = my_slots.shape[0]
    valid = my_slots >= 0
    slot_of = np.full(max(int(my_slots.max(initial=-1)), int(ids.max(initial=-1))) + 1, -1, _I64)
    slot_of[my_slots[valid]] = np.flatnonzero(valid)
    task_t, task_k = np.nonzero(exe == r)
    task_slot = slot_of[ids[task_t, task_k]] if task_t.shape[0] else np.zeros(0, _I64)
    if task_slot.shape[0] and task_slot.min() < 0:
        bad = int(np.flatnonzero(task_slot < 0)[0])
        raise RuntimeError(
            f"exchange plan: rank {r} executes expert {int(ids[task_t[bad], task_k[bad]])} "
            f"(token {int(task_t[bad])}) but does not hold it in the layout"
        )
    task_row = np.searchsorted(table_t, task_t)
    slot_rows = [task_row[task_slot == j].astype(_I64) for j in range(num_slots)]
    slot_k = [task_k[task_slot == j].astype(_I64) for j in range(num_slots)]

    # Combine stage A: intra executors -> source; remote executors -> rail peer (d != rail).
    ma_t = np.r_[dt[is_intra], m2_t]
    ma_from = np.r_[dd[is_intra], m2_d]
    ma_to = np.r_[ds[is_intra], m2_p]
    ma_to_source = np.r_[np.ones(int(is_intra.sum()), bool), np.zeros(m2_t.shape[0], bool)]
    pos_a = _positions_within_groups(ma_to, _lexsort(ma_to, ma_from, ma_t))  # recv order
    mine = ma_from == r
    order = _lexsort(ma_to[mine], ma_t[mine])
    ca_send_idx = np.searchsorted(table_t, ma_t[mine][order]).astype(_I64)
    ca_send_splits = _counts(ma_to[mine], G)
    ca_recv_splits = _counts(ma_from[ma_to == r], G)

    # Combine stage B: one row per (token, remote node), rail peer -> source.
    mb_t, mb_p = rem_pairs // G, rem_pairs % G
    mb_s = src[mb_t]
    pos_b_send = _positions_within_groups(mb_p, _lexsort(mb_p, mb_s, mb_t))
    lookup_b = _PairLookup(mb_p, mb_t, pos_b_send, T)
    cb_send_splits = _counts(mb_s[mb_p == r], G)
    cb_recv_splits = _counts(mb_p[mb_s == r], G)
    # Rail buffer contributions: own partials (remote deliveries executed on the rail peer itself).
    own_rail = is_remote & (dd == rail) & (dd == r)
    q_own_dst = lookup_b(r, dt[own_rail])
    q_own_src = np.searchsorted(table_t, dt[own_rail]).astype(_I64)
    # ... and the stage-A rows received as rail peer.
    to_me_rail = (ma_to == r) & ~ma_to_source
    q_recv_dst = lookup_b(r, ma_t[to_me_rail])
    q_recv_src = pos_a[to_me_rail]

    # Final sums at the source.
    own = is_local & (dd == r)
    y_own_dst = dt[own] - my_first
    y_own_src = np.searchsorted(table_t, dt[own]).astype(_I64)
    to_me_src = (ma_to == r) & ma_to_source
    y_recv_a_dst = ma_t[to_me_src] - my_first
    y_recv_a_src = pos_a[to_me_src]
    mine_b = mb_s == r
    order = _lexsort(mb_p[mine_b], mb_t[mine_b])
    y_recv_b_dst = mb_t[mine_b][order] - my_first

    totals = {
        "deliveries": int(keys.shape[0]),
        "dispatch_cross_rows": int(rem_pairs.shape[0]),
        "dispatch_intra_rows": int(is_intra.sum() + fwd.sum()),
        "combine_cross_rows": int(rem_pairs.shape[0]),
        "combine_intra_rows": int(is_intra.sum() + fwd.sum()),
        "stage1_rows": int(m1_t.shape[0]),
        "stage1_cross_rows": int(m1_cross.sum()),
    }
    return ExchangePlan(
        rank=r,
        num_local_tokens=my_tokens,
        s1_send_idx=s1_send_idx,
        s1_send_splits=s1_send_splits,
        s1_recv_splits=s1_recv_splits,
        s2_send_idx=s2_send_idx.astype(_I64),
        s2_send_splits=s2_send_splits,
        s2_recv_splits=s2_recv_splits,
        table_idx=table_idx,
        slot_rows=slot_rows,
        slot_k=slot_k,
        ca_send_idx=ca_send_idx,
        ca_send_splits=ca_send_splits,
        ca_recv_splits=ca_recv_splits,
        q_own_dst=q_own_dst.astype(_I64),
        q_own_src=q_own_src,
        q_recv_dst=q_recv_dst.astype(_I64),
        q_recv_src=q_recv_src.astype(_I64),
        cb_send_splits=cb_send_splits,
        cb_recv_splits=cb_recv_splits,
        y_own_dst=y_own_dst.astype(_I64),
        y_own_src=y_own_src,
        y_recv_a_dst=y_recv_a_dst.astype(_I64),
        y_recv_a_src=y_recv_a_src.astype(_I64),
        y_recv_b_dst=y_recv_b_dst.astype(_I64),
        totals=totals,
    )
