"""Training state that does not depend on the world size or the bank capacity.

A checkpoint from ``model.state_dict()`` and ``optimizer.state_dict()`` holds each rank's own
bank rows, so it loads back only on the same world size and capacity. :func:`gather_training_state`
writes every expert as full ``[E, ...]`` tensors instead (its weights and the optimizer's state
rows, e.g. Adam's moments), with the other parameters, buffers and their optimizer state by name;
:func:`load_training_state` puts it into a model and optimizer of any world size, node shape or
capacity, each rank taking its main instances' rows. Optimizer hyperparameters (learning rate,
betas) and learning-rate schedulers are not part of it: they come from the new optimizer.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import nn

from cobalt.torch.expert_store import ExpertStore
from cobalt.torch.reduce import all_reduce_sum_

__all__ = ["gather_training_state", "load_training_state"]

_FORMAT = "cobalt-training-state"
_NAMES = ("w1", "w3", "w2")


def _is_row_state(value: Any, param: torch.Tensor, num_rows: int) -> bool:
    """Whether optimizer state `value` of a bank (or full [E, ...]) tensor holds one row per
    slot (or expert): Adam's moments do, its step count does not."""
    return (torch.is_tensor(value) and value.dim() == param.dim() and value.shape[0] == num_rows
            and value.shape[1:] == param.shape[1:])


def _gather_store(store: ExpertStore, optimizer: Optional[torch.optim.Optimizer]
                  ) -> dict[str, Any]:
    """Every expert's main rows of `store` (weights, and the optimizer's row state) as [E, ...]
    tensors keyed "w1", "w1.exp_avg", ...; the optimizer's other state (e.g. "w1.step") as it is
    on this rank (every rank steps alike). A collective."""
    local = torch.as_tensor(store.local_experts(), dtype=torch.long)
    slots = torch.as_tensor(store.main_slot[store.local_experts()], dtype=torch.long)
    rows: list[tuple[str, torch.Tensor]] = []
    out: dict[str, Any] = {}
    for name, param in zip(_NAMES, store.bank):
        rows.append((name, param.detach()))
        state = optimizer.state.get(param, {}) if optimizer is not None else {}
        for key in sorted(state):
            value = state[key]
            if _is_row_state(value, param, store.capacity):
                rows.append((f"{name}.{key}", value.detach()))
            else:
                out[f"{name}.{key}"] = value.clone() if torch.is_tensor(value) else value
    # Every rank must gather the same tensors (the same optimizer state keys).
    keys: list[Any] = [None] * store.ep.world_size
    dist.all_gather_object(keys, [key for key, _ in rows], group=store.ep.group)
    if any(k != keys[0] for k in keys):
        raise ValueError("gather_training_state: the ranks' optimizer state differs in its keys: "
                         + "; ".join(f"rank {r}: {k}" for r, k in enumerate(keys)))
    for key, tensor in rows:
        full = torch.zeros((store.num_experts,) + tuple(tensor.shape[1:]), dtype=tensor.dtype)
        full[local] = tensor[slots].to(full.dtype)
        out[key] = all_reduce_sum_(full, store.ep.group)  # exact: one value and zeros
    return out


def _load_store(store: ExpertStore, state: dict[str, Any],
                optimizer: Optional[torch.optim.Optimizer], where: str) -> None:
    missing = [name for name in _NAMES if name not in state]
    if missing:
        raise ValueError(f"load_training_state: {where} lacks {', '.join(missing)}")
    store.load_main_weights(*(state[name] for name in _NAMES))
    if optimizer is None:
        return
    local = torch.as_tensor(store.local_experts(), dtype=torch.long)
    slots = torch.as_tensor(store.main_slot[store.local_experts()], dtype=torch.long)
    for name, param in zip(_NAMES, store.bank):
        prefix = name + "."
        entries = {key[len(prefix):]: value for key, value in state.items()
                   if key.startswith(prefix)}
        if not entries:
            continue
        param_state = optimizer.state[param]
        for key, value in entries.items():
            if _is_row_state(value, param, store.num_experts):
                rows = param_state.get(key)
                if not _is_row_state(rows, param, store.capacity):
                    rows = torch.zeros(param.shape, dtype=value.dtype)
                    param_state[key] = rows
                with torch.no_grad():
                    rows[slots] = value[local].to(rows.dtype)
            else:
                param_state[key] = value.clone() if torch.is_tensor(value) else value


def _stores(model: nn.Module) -> dict[str, ExpertStore]:
    return {name: m for name, m in model.named_modules() if isinstance(m, ExpertStore)}


def _outside_stores(names: list[str], stores: dict[str, ExpertStore]) -> list[str]:
    prefixes = tuple(f"{s}." if s else "" for s in stores)
    return [n for n in names if not (prefixes and n.startswith(prefixes))]


def gather_training_state(model: nn.Module,
                          optimizer: Optional[torch.optim.Optimizer] = None) -> dict[str, Any]:
    """The training state of `model` (and `optimizer`) without its world size and capacity:
    ``{"format", "experts": {store name: {"w1": [E, H, F], ..., "w1.exp_avg": [E, H, F], ...,
    "w1.step": ...}}, "model": the rest of model.state_dict(), "optimizer": {parameter name:
    state}}``. A collective: call it on every rank between steps; every rank gets the same dict
    (save it on one). torch.save / torch.load it as any state dict."""
    stores = _stores(model)
    experts = {name: _gather_store(store, optimizer) for name, store in stores.items()}
    full = model.state_dict()
    rest = {key: full[key] for key in _outside_stores(list(full), stores)}
    opt_state: dict[str, dict[str, Any]] = {}
    params = dict(model.named_parameters())
    if optimizer is not None:
        for name in _outside_stores([n for n, _ in model.named_parameters()], stores):
            param = params[name]
            if param in optimizer.state and optimizer.state[param]:
                opt_state[name] = {k: (v.clone() if torch.is_tensor(v) else v)
                                   for k, v in optimizer.state[param].items()}
    return {"format": _FORMAT, "experts": experts, "model": rest, "optimizer": opt_state}


def load_training_state(model: nn.Module, state: dict[str, Any],
                        optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Loads what :func:`gather_training_state` wrote into `model` (and `optimizer`, built for
    it), on any world size, node shape or bank capacity: each rank keeps its main instances'
    rows. Call on every rank between steps (no collective). Raises ValueError, before anything
    is loaded, when `state` is not such a dict or does not name the same modules and
    parameters."""
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise ValueError("load_training_state: not a dict from gather_training_state")
    stores = _stores(model)
    if set(stores) != set(state["experts"]):
        raise ValueError(f"load_training_state: the model's expert stores "
                         f"{sorted(stores)} are not the saved ones {sorted(state['experts'])}")
    expected = set(_outside_stores(list(model.state_dict()), stores))
    if expected != set(state["model"]):
        raise ValueError(
            f"load_training_state: the model's other state "
            f"(missing: {sorted(expected - set(state['model']))}, unexpected: "
            f"{sorted(set(state['model']) - expected)}) does not match the saved one")
    params = dict(model.named_parameters())
    unknown = sorted(set(state["optimizer"]) - set(params))
    if unknown:
        raise ValueError(f"load_training_state: optimizer state for parameters the model lacks: "
                         f"{unknown}")
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    inside = set(missing) - expected  # the stores' own keys, loaded below
    if set(missing) - inside or unexpected:
        raise ValueError(f"load_training_state: missing {sorted(set(missing) - inside)}, "
                         f"unexpected {sorted(unexpected)}")
    for name, store in stores.items():
        _load_store(store, state["experts"][name], optimizer, f"expert store '{name}'")
    if optimizer is not None:
        for name, param_state in state["optimizer"].items():
            optimizer.state[params[name]] = {
                k: (v.clone() if torch.is_tensor(v) else v) for k, v in param_state.items()}
