"""Reading `cobalt simulate --dump` files with a plain safetensors parser (struct + json + numpy, no
cobalt code), for the scripts that recompute or re-analyse a run independently of the library
(tests/cpp/eval/recompute_metrics.py, scripts/cover_tie_effect.py)."""
import json
import struct

import numpy as np

DTYPES = {"I32": "<i4", "I64": "<i8"}


def read_safetensors(path):
    """(metadata dict, {name: read-only numpy array}) of a safetensors file of I32 / I64 tensors."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arr = np.frombuffer(data[base + begin:base + end], dtype=DTYPES[info["dtype"]])
        tensors[name] = arr.reshape(info["shape"])
    return meta, tensors


def file_name(policy):
    """The dump's file name for a policy (as src/eval/dump.cpp writes it)."""
    ok = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-")
    return "".join(c if c in ok else "_" for c in policy) + ".safetensors"
