"""Bad inputs from Python: a one-line error naming the range, never a crash, and objects that
were validated stay what was validated (found by a review that tried to break the bindings)."""

from __future__ import annotations

import errno
import math
import os

import numpy as np
import pytest

import cobalt


def _topology() -> cobalt.Topology:
    return cobalt.Topology(2, 4)


def test_an_empty_array_of_a_non_integer_dtype_is_refused_not_a_crash() -> None:
    structured = np.zeros((0, 2), dtype=[("a", "i4"), ("b", "i4")])
    with pytest.raises(cobalt.InvalidArgumentError, match="expected an integer array"):
        cobalt.RoutingBatch(structured, None, 8, 4)
    with pytest.raises(cobalt.InvalidArgumentError, match="expected an integer array"):
        cobalt.rank_loads(np.zeros(0, dtype=[("a", "i4"), ("b", "i4")]), 4)
    # An empty float array is an empty integer array (np.asarray([]) is float64).
    assert cobalt.RoutingBatch(np.zeros((0, 2)), None, 8, 4).num_tokens == 0


def test_rank_and_node_lookups_are_range_checked() -> None:
    layout = cobalt.ExpertLayout.static_ep(_topology(), 8, 2)
    for bad in (-1, 4, 10**8):
        with pytest.raises(cobalt.InvalidArgumentError, match=r"rank -?\d+ out of range \[0, 4\)"):
            layout.num_used_slots(bad)
        with pytest.raises(cobalt.InvalidArgumentError, match=r"rank -?\d+ out of range \[0, 4\)"):
            layout.topology.node_of(bad)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"node 2 out of range \[0, 2\)"):
        _topology().first_rank_of(2)
    assert [layout.num_used_slots(r) for r in range(4)] == [2, 2, 2, 2]
    assert _topology().node_of(3) == 1 and _topology().first_rank_of(1) == 2


def test_routing_batch_is_always_validated() -> None:
    ids = np.array([[0, 100000], [1, 2]], dtype=np.int32)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"out of range \[0, 8\)"):
        cobalt.RoutingBatch(ids, None, 8, 4)
    with pytest.raises(TypeError):  # there is no unchecked form any more
        cobalt.RoutingBatch(ids, None, 8, 4, validate=False)  # type: ignore[call-arg]
    with pytest.raises(cobalt.InvalidArgumentError, match=r"experts 70000 out of range \[1, 65536\]"):
        cobalt.RoutingBatch(np.array([[0, 1]], dtype=np.int32), None, 70000, 4)


def test_validated_objects_cannot_be_changed_through_their_accessors() -> None:
    layout = cobalt.ExpertLayout.static_ep(_topology(), 8, 2)
    links = layout.topology.links
    links.nvlink_bytes_per_s = float("nan")
    assert layout.topology.links.nvlink_bytes_per_s == 900e9
    config = cobalt.PolicyConfig(_topology(), 8, 2, slots_per_rank=3)
    policy = cobalt.make_policy("static", config)
    policy.config.num_experts = 16
    assert policy.config.num_experts == 8
    load = np.ones(8)
    coactivation = np.ones((8, 8))
    plan_input = cobalt.GlobalPlanInput(_topology(), 8, 3, load, coactivation)
    load[:] = -50.0
    coactivation[:] = np.nan
    assert plan_input.total_load() == 8.0
    assert not plan_input.expert_load.flags.writeable
    with pytest.raises(ValueError):
        plan_input.expert_load.setflags(write=True)


def test_counts_that_are_not_task_counts_are_refused() -> None:
    with pytest.raises(cobalt.InvalidArgumentError, match="rank 0 has -1 tasks, must be >= 0"):
        cobalt.imbalance(np.array([-1, 1]))
    with pytest.raises(cobalt.InvalidArgumentError, match="sum past 2"):
        cobalt.imbalance(np.array([2**62] * 3))
    with pytest.raises(cobalt.InvalidArgumentError, match="sum past 2"):
        cobalt.max_violation(np.array([2**62] * 4))
    assert math.isclose(cobalt.imbalance(np.array([3, 1])), 1.5)


def test_sizes_are_refused_before_anything_is_allocated_from_them() -> None:
    with pytest.raises(cobalt.InvalidArgumentError, match=r"slots per rank -1 out of range"):
        cobalt.ExpertLayout.static_ep(_topology(), 8, -1)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"experts 1073741824 out of range"):
        cobalt.ExpertLayout.static_ep(_topology(), 2**30, 2)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"slots per rank 0 out of range \[2, 8\]"):
        cobalt.make_policy("static", cobalt.PolicyConfig(_topology(), 8, 2, slots_per_rank=0))
    with pytest.raises(cobalt.InvalidArgumentError, match=r"slots per rank 1073741824 out of range"):
        cobalt.make_policy("static", cobalt.PolicyConfig(_topology(), 8, 2, slots_per_rank=2**30))
    with pytest.raises(cobalt.InvalidArgumentError, match=r"eps inf out of range \[0, 1000000\]"):
        cobalt.make_policy("static",
                           cobalt.PolicyConfig(_topology(), 8, 2, slots_per_rank=3,
                                               eps=float("inf")))
    # Sizes past any layout's range, named (ceil(E / G) overflowed int: slots -1073741824).
    with pytest.raises(cobalt.InvalidArgumentError, match=r"experts 2147483647 out of range"):
        cobalt.slots_for_extra(2**31 - 1, 2, 0)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"ranks 2147483647 out of range"):
        cobalt.slots_for_rho(16, 2**31 - 1, 0.5)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"experts 2147483647 out of range"):
        cobalt.PolicyConfig(_topology(), 2**31 - 1, 2).validate()
    with pytest.raises(cobalt.InvalidArgumentError, match=r"slots per rank 536870912 out of range"):
        cobalt.GlobalPlanInput(_topology(), 16, 2**29, np.ones(16), np.zeros((16, 16)))
    # eps beyond [0, 1e6] is refused when the policy is made (1e308 overflowed the rank cap at
    # the first plan, in the middle of a run).
    with pytest.raises(cobalt.InvalidArgumentError, match=r"eps 1e\+308 out of range \[0, 1000000\]"):
        cobalt.make_policy("cobalt", cobalt.PolicyConfig(_topology(), 8, 2, slots_per_rank=3,
                                                         eps=1e308))


def test_an_assignment_that_breaks_the_layout_is_an_invalid_argument() -> None:
    layout = cobalt.ExpertLayout.static_ep(_topology(), 8, 2)
    batch = cobalt.RoutingBatch(np.array([[0, 7]], dtype=np.int32), None, 8, 4)
    with pytest.raises(cobalt.InvalidArgumentError, match="task 1 on rank 0 which lacks expert 7"):
        cobalt.replica_task_counts(batch, layout, np.array([0, 0], dtype=np.int32))
    with pytest.raises(cobalt.InvalidArgumentError, match=r"task 1 has execution rank 6 out of "
                                                          r"range \[0, 4\)"):
        cobalt.replica_task_counts(batch, layout, np.array([0, 6], dtype=np.int32))


def test_torch_ops_refuse_what_a_cast_would_truncate() -> None:
    import torch

    from cobalt.torch import ops

    topology = _topology()
    with pytest.raises(ValueError, match="demand must be int32 or int64, got torch.float32"):
        ops.solve_topoep(torch.full((4, 8), 0.99), topology, 3, token_bytes=1.0,
                         expert_param_bytes=1.0)
    with pytest.raises(TypeError, match="topk_ids must be a torch.Tensor, got ndarray"):
        ops.routing_counts(np.zeros((2, 2), dtype=np.int32), 8)
    with pytest.raises(TypeError, match="layout must be a cobalt.ExpertLayout"):
        ops.assign_tasks(torch.zeros((1, 2), dtype=torch.int32), torch.zeros(1, dtype=torch.int32),
                         None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exec_rank must be int32 or int64, got torch.float64"):
        ops.dispatch_layout(torch.zeros((1, 2), dtype=torch.float64),
                            torch.zeros(1, dtype=torch.int32), topology)


def test_the_recorder_refuses_ids_it_could_not_store_when_they_arrive() -> None:
    import torch

    from cobalt.torch import RoutingRecorder

    router = torch.nn.Identity()
    for ids, message in ((np.array([[0.2, 1.7]]), "dtype float64, expected integers"),
                         (np.array([[3, 3]]), "token 0 selects expert 3 twice")):
        recorder = RoutingRecorder(8, 2, extract=lambda module, inputs, output, ids=ids: ids)
        recorder.attach(router, 0)
        with pytest.raises(ValueError, match=message):
            router(torch.zeros(1))
        recorder.detach()
    with pytest.raises(ValueError, match=r"metadata keys \['top_k'\] are reserved"):
        RoutingRecorder(8, 2, metadata={"top_k": "3"})
    with pytest.raises(ValueError, match="source_rank -1 must be >= 0"):
        RoutingRecorder(8, 2, source_rank=-1)


def test_a_workspace_of_the_wrong_type_is_a_type_error() -> None:
    topology = _topology()
    exec_rank = np.zeros((2, 2), dtype=np.int32)
    with pytest.raises(TypeError, match="workspace must be a DispatchLayoutWorkspace, got int"):
        cobalt.dispatch_layout(exec_rank, np.zeros(2, dtype=np.int32), topology, workspace=5)


def test_both_trace_data_forms_are_reachable_positionally(tmp_path) -> None:
    counts = np.arange(2 * 1 * 3 * 8, dtype=np.int64).reshape(2, 1, 3, 8)
    load_only = cobalt.TraceData(8, 2, counts)  # was taken as topk_ids = 2
    assert load_only.top_k == 2 and load_only.num_count_steps == 2
    cobalt.write_trace(str(tmp_path / "counts.safetensors"), load_only)
    ids = np.array([[[0, 1], [2, 3]]], dtype=np.int32)
    tokens = cobalt.TraceData(8, ids)
    assert tokens.top_k == 2 and tokens.num_tokens == 2


def test_file_errors_are_os_errors_with_their_errno(tmp_path) -> None:
    # A missing trace was a plain InvalidArgumentError: `except FileNotFoundError` / `except
    # OSError` missed it. It stays an InvalidArgumentError (a ValueError) too.
    missing = str(tmp_path / "missing.safetensors")
    with pytest.raises(FileNotFoundError, match="cannot open: No such file") as info:
        cobalt.TraceReader(missing)
    assert isinstance(info.value, cobalt.IoFileNotFoundError)
    assert isinstance(info.value, cobalt.InvalidArgumentError)
    assert info.value.errno == errno.ENOENT
    assert str(info.value).startswith(f"trace {missing}: cannot open")  # not "[Errno 2] ..."
    ids = np.array([[[0, 1], [2, 3]]], dtype=np.int32)
    data = cobalt.TraceData(8, ids)
    with pytest.raises(FileNotFoundError):  # into a directory that does not exist
        cobalt.write_trace(str(tmp_path / "no-such-dir" / "t.safetensors"), data)
    # Another errno: an OSError of the base class, with that errno.
    (tmp_path / "file").write_text("x")
    with pytest.raises(cobalt.IoError) as not_dir:
        cobalt.write_trace(str(tmp_path / "file" / "t.safetensors"), data)
    assert isinstance(not_dir.value, OSError) and not_dir.value.errno == errno.ENOTDIR
    assert not isinstance(not_dir.value, FileNotFoundError)
    # Content errors are not OS errors.
    (tmp_path / "garbage.safetensors").write_bytes(b"\x01")
    with pytest.raises(cobalt.InvalidArgumentError) as garbage:
        cobalt.TraceReader(str(tmp_path / "garbage.safetensors"))
    assert not isinstance(garbage.value, OSError)


def test_value_types_compare_and_hash_like_python_values() -> None:
    topology = cobalt.Topology(2, 4)
    assert {topology: "a"}[cobalt.Topology(2, 4)] == "a"  # was unhashable
    assert hash(topology) != hash(cobalt.Topology(4, 8))
    faster = cobalt.LinkParams()
    faster.nvlink_bytes_per_s *= 2
    same_shape = cobalt.Topology(2, 4, faster)  # equal (the shape), so the same hash
    assert same_shape == topology and hash(same_shape) == hash(topology)
    assert len({topology, same_shape}) == 1
    assert (topology == 5) is False and (topology != "2x4") is True  # was a TypeError dump
    layout = cobalt.ExpertLayout.static_ep(topology, 8, 2)
    assert (layout == 5) is False and (layout != None) is True  # noqa: E711
    assert layout == cobalt.ExpertLayout.static_ep(topology, 8, 2)


def test_a_malformed_pickle_state_is_an_invalid_argument() -> None:
    blank = cobalt.ExpertLayout.__new__(cobalt.ExpertLayout)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"expected \(num_nodes, .* got 1 items"):
        blank.__setstate__((1,))  # was an IndexError
    with pytest.raises(cobalt.InvalidArgumentError, match=r"slots must be \[G, S\]"):
        blank.__setstate__((1, 2, 2, np.array([0, 1], dtype=np.int32)))
    with pytest.raises(cobalt.InvalidArgumentError, match="got 2 items"):
        cobalt.Topology.__new__(cobalt.Topology).__setstate__((1, 2))
    # The right length with the wrong types (was pybind11's "Unable to cast" RuntimeError).
    with pytest.raises(cobalt.InvalidArgumentError, match=r"expected \(int, int, float, float\)"):
        cobalt.Topology.__new__(cobalt.Topology).__setstate__(("a", "b", 1.0, 2.0))
    with pytest.raises(cobalt.InvalidArgumentError, match="must be integers, got 'a', 2, 2"):
        blank.__setstate__(("a", 2, 2, np.zeros((2, 1), dtype=np.int32)))


def test_an_array_past_the_memory_budget_is_refused_naming_it() -> None:
    with pytest.raises(cobalt.FailedPreconditionError,
                       match=r"contiguous_source_ranks: \[T\] int32 for 4611686018427387904 "):
        cobalt.contiguous_source_ranks(2**62, 4)  # was "cannot create std::vector larger ..."


def test_an_object_where_an_array_belongs_is_named() -> None:
    topology = cobalt.Topology(2, 4)
    layout = cobalt.ExpertLayout.static_ep(topology, 8, 2)
    batch = cobalt.RoutingBatch(np.array([[0, 1], [2, 3]]), None, 8, 4)
    # Arguments in the wrong order: the layout where exec_rank belongs ("got dtype object").
    with pytest.raises(cobalt.InvalidArgumentError, match="integer array .* got ExpertLayout$"):
        cobalt.cross_node_transfers(batch, layout, topology)
    with pytest.raises(cobalt.InvalidArgumentError, match=r"got dtype float64 \(values would be"):
        cobalt.imbalance(np.array([1.5, 2.0]))
    with pytest.raises(cobalt.InvalidArgumentError, match="got dtype <U1$"):
        cobalt.imbalance(["a"])
    # A list numpy turns into an object array because of an element: the elements are blamed.
    for bad in ([1, None], [1, 2**70]):
        with pytest.raises(cobalt.InvalidArgumentError,
                           match="got a list with elements that are not all integers"):
            cobalt.imbalance(bad)


def test_integers_beyond_the_fields_range_are_named() -> None:
    # pybind11 answered these with a multi-line TypeError listing every signature.
    topology = cobalt.Topology(2, 4)
    with pytest.raises(cobalt.InvalidArgumentError,
                       match=r"^seed -1 out of range \[0, 2\^64 - 1\]$"):
        cobalt.PolicyConfig(topology, 8, 2, seed=-1)
    with pytest.raises(cobalt.InvalidArgumentError, match="num_experts 1099511627776 out of range"):
        cobalt.PolicyConfig(topology, 2**40, 2)
    config = cobalt.PolicyConfig(topology, 8, 2, seed=np.uint64(2**63))  # numpy integers work
    assert config.seed == 2**63
    with pytest.raises(cobalt.InvalidArgumentError, match="planner_restarts 4294967296 out of"):
        config.planner_restarts = 2**32
    with pytest.raises(cobalt.InvalidArgumentError, match="seed 18446744073709551616 out of"):
        config.seed = 2**64
    with pytest.raises(TypeError, match="seed must be an integer, got float"):
        config.seed = 1.5
    config.num_experts = np.int64(16)
    assert config.num_experts == 16
    with pytest.raises(cobalt.InvalidArgumentError, match="number of nodes 1099511627776 out of"):
        cobalt.Topology(2**40, 4)


def test_every_int_argument_beyond_int32_is_named() -> None:
    # Every int argument of _core goes through PyInt + int_arg: these raised pybind11's TypeError
    # listing every signature. Floats are still TypeErrors; numpy integers and bools are ints.
    topology = cobalt.Topology(2, 8)
    layout = cobalt.ExpertLayout.static_ep(topology, 16, 2)
    batch = cobalt.RoutingBatch(np.array([[0, 1]], dtype=np.int32), None, 16, 8)
    calls = {
        "num_experts 1099511627776": lambda: cobalt.ExpertLayout.static_ep(topology, 2**40, 2),
        "num_experts 1180591620717411303424": lambda: cobalt.ExpertLayout.static_ep(topology,
                                                                                     2**70, 2),
        "slots_per_rank -4294967296": lambda: cobalt.ExpertLayout.static_ep(topology, 16, -2**32),
        "num_ranks 8589934592": lambda: cobalt.RoutingBatch(np.array([[0, 1]]), None, 16, 2**33),
        "num_experts 2147483648": lambda: cobalt.RoutingStats(np.int64(2**31), 0.5),
        "max_top_k 4294967296": lambda: cobalt.DispatchLayoutWorkspace(topology, 10, 2**32),
        "num_threads 4294967296": lambda: cobalt.assign_node_cover(batch, layout,
                                                                   num_threads=2**32),
        "layer 4294967296": lambda: cobalt.assign_node_cover(batch, layout, layer=2**32),
    }
    for message, call in calls.items():
        with pytest.raises(cobalt.InvalidArgumentError,
                           match=rf"^{message} out of range for a 32-bit integer "
                                 r"\[-2147483648, 2147483647\]$"):
            call()
    with pytest.raises(cobalt.InvalidArgumentError, match=r"^seed -1 out of range \[0, 2\^64"):
        cobalt.assign_node_cover(batch, layout, seed=-1)
    for not_an_int in (16.0, "16", np.array([16, 17])):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            cobalt.ExpertLayout.static_ep(topology, not_an_int, 2)
    assert cobalt.ExpertLayout.static_ep(topology, np.int32(16), np.uint8(2)).num_experts == 16
    # Int fields of the value types too, and a numpy integer is a number, not a 0-d array of
    # ids (TraceData(E, top_k, counts) took the token-trace overload with np.int64(2)).
    for value_type, field in ((cobalt.TraceStatsOptions(), "hot_count"),
                              (cobalt.CostParams(), "hidden_size"),
                              (cobalt.PolicyConfig(topology, 16, 2), "num_threads")):
        with pytest.raises(cobalt.InvalidArgumentError,
                           match=rf"^{field} 1099511627776 out of range for a 32-bit integer"):
            setattr(value_type, field, 2**40)
        setattr(value_type, field, np.int64(3))
        assert getattr(value_type, field) == 3
    counts = np.zeros((1, 1, 2, 8), dtype=np.int32)
    counts[0, 0, 0, :2] = 1
    assert cobalt.TraceData(8, np.int64(2), counts).top_k == 2
    assert "num_experts: int" in cobalt.ExpertLayout.static_ep.__doc__


def test_a_read_only_file_system_is_not_a_permission_error(tmp_path) -> None:
    # access(W_OK) says EROFS there; it was reported as EACCES (a PermissionError, "change its
    # permissions"). Needs a private read-only bind mount: root and unshare, else skipped.
    import shutil
    import subprocess
    import sys
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a read-only bind mount")
    target = tmp_path / "ro"
    target.mkdir()
    (target / "t.safetensors").write_bytes(b"old")
    script = (
        "import sys, numpy as np; sys.path.insert(0, sys.argv[1]); import cobalt\n"
        "d = cobalt.TraceData(8, np.array([[[0, 1]]], dtype=np.int32))\n"
        "try:\n    cobalt.write_trace(sys.argv[2], d)\n"
        "except OSError as e:\n    print(type(e).__name__, e.errno, isinstance(e, PermissionError),"
        " e)\n")
    python_dir = os.path.dirname(os.path.dirname(cobalt.__file__))
    command = (f"mount --bind -o ro {target} {target} 2>/dev/null || "
               f"{{ mount --bind {target} {target} && mount -o remount,bind,ro {target}; }} && "
               f"{sys.executable} -c '{script}' {python_dir} {target / 't.safetensors'}")
    run = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True)
    if run.returncode != 0 or not run.stdout:
        pytest.skip(f"no read-only bind mount here: {run.stderr.strip()[:200]}")
    assert run.stdout.startswith(f"IoError {errno.EROFS} False "), run.stdout
    assert "is on a read-only file system" in run.stdout, run.stdout
    assert (target / "t.safetensors").read_bytes() == b"old"


def test_int64_arguments_beyond_int64_are_named(tmp_path) -> None:
    # Steps, token offsets and token counts are int64 in C++: beyond it, pybind11 raised its
    # TypeError listing every signature.
    topology = cobalt.Topology(2, 8)
    layout = cobalt.ExpertLayout.static_ep(topology, 16, 2)
    batch = cobalt.RoutingBatch(np.array([[0, 1]], dtype=np.int32), None, 16, 8)
    policy = cobalt.make_policy("static", cobalt.PolicyConfig(topology, 16, 2, slots_per_rank=2))
    path = str(tmp_path / "t.safetensors")
    cobalt.write_trace(path, cobalt.TraceData(16, topk_ids=np.array([[[0, 1]]], dtype=np.int32),
                                              step_offsets=np.array([0, 1])))
    reader = cobalt.TraceReader(path)
    calls = {
        f"step {2**63}": lambda: cobalt.assign_node_cover(batch, layout, step=2**63),
        f"token_offset {-2**63 - 1}": lambda: cobalt.assign_node_cover(batch, layout,
                                                                       token_offset=-2**63 - 1),
        f"max_tokens {2**64}": lambda: cobalt.DispatchLayoutWorkspace(topology, 2**64, 2),
        f"num_tokens {2**64}": lambda: cobalt.contiguous_source_ranks(2**64, 8),
        f"step {2**70}": lambda: policy.run(2**70, 0, batch),
        f"step {-2**64}": lambda: policy.run_loads(-2**64, 0, np.zeros((8, 16), np.int64)),
        f"step {2**65}": lambda: cobalt.time_step_operations(batch, topology, 2, step=2**65),
        f"begin {2**64}": lambda: reader.topk_ids(0, 2**64),
        f"end {2**64}": lambda: reader.source_rank(0, 2**64),
    }
    for message, call in calls.items():
        with pytest.raises(cobalt.InvalidArgumentError,
                           match=rf"^{message} out of range for a 64-bit integer "
                                 r"\[-2\^63, 2\^63 - 1\]$"):
            call()
    with pytest.raises(TypeError, match="incompatible function arguments"):
        policy.run(1.5, 0, batch)
    assert reader.topk_ids(np.int64(0), np.int64(0), np.uint8(1)).shape == (1, 2)
    assert policy.run(np.int64(3), 0, batch)[1].shape == (1, 2)
