#!/usr/bin/env python3
"""Writes the safetensors fixtures of tests/unit/test_safetensors_python.cpp with Hugging Face's own
safetensors package (pip install safetensors numpy). Run from this directory; the outputs are committed,
so the tests need no Python. The C++ test recomputes every value from the same formulas."""
import json
import os

import numpy as np
from safetensors import TensorSpec, serialize_file
from safetensors.numpy import save_file


def bf16_bits(values):
    """float32 -> bfloat16 bits, round to nearest even (numpy has no bfloat16)."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def save_with_bf16(path, arrays, bf16, metadata):
    """save_file, plus tensors given as bfloat16 bit patterns (name -> (shape, uint16 array))."""
    keep = []
    specs = {}
    for name, a in arrays.items():
        a = np.require(a, requirements="C")  # ascontiguousarray would turn a scalar into shape (1,)
        keep.append(a)
        specs[name] = TensorSpec(dtype=a.dtype.name, shape=a.shape, data_ptr=a.ctypes.data, data_len=a.nbytes)
    for name, (shape, bits) in bf16.items():
        bits = np.ascontiguousarray(bits, dtype=np.uint16)
        keep.append(bits)
        specs[name] = TensorSpec(dtype="bfloat16", shape=shape, data_ptr=bits.ctypes.data, data_len=bits.nbytes)
    serialize_file(specs, path, metadata=metadata)


save_with_bf16(
    "python_all_dtypes.safetensors",
    {
        "weights.f32": (np.arange(6, dtype=np.float32) * 0.5 - 1.25).reshape(2, 3),
        "weights.f16": np.array([1.0, -2.5, 65504.0, 2.0**-24], dtype=np.float16),
        "weights.f64": np.array([0.1, -1e300], dtype=np.float64),
        "ids.i64": np.array([-1, 2**40, 7], dtype=np.int64),
        "ids.i32": np.array([-5, 123456], dtype=np.int32),
        "ids.i16": np.array([-300, 300], dtype=np.int16),
        "ids.i8": np.array([-128, 127], dtype=np.int8),
        "ids.u8": np.array([0, 128, 255], dtype=np.uint8),
        "mask.bool": np.array([True, False, True]),
        "scalar": np.array(3.25, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    },
    {"weights.bf16": ((3,), bf16_bits([1.5, -3.0, 1e-3]))},
    metadata={"format": "pt", "writer": "python safetensors"},
)

# A model in two shards with the index transformers' save_pretrained writes.
os.makedirs("sharded", exist_ok=True)
w0 = (np.arange(16, dtype=np.float32) / 8.0).reshape(4, 4)
w1 = (np.arange(16, dtype=np.float32) * -0.25).reshape(4, 4)
head = (np.arange(8, dtype=np.float16) - 4).reshape(2, 4)
b0 = bf16_bits([0.5, 1.0, 2.0, 4.0])
save_with_bf16("sharded/model-00001-of-00002.safetensors", {"layer.0.w": w0}, {"layer.0.b": ((4,), b0)},
               metadata={"format": "pt"})
save_file({"layer.1.w": w1, "head": head}, "sharded/model-00002-of-00002.safetensors", metadata={"format": "pt"})
index = {
    "metadata": {"total_size": w0.nbytes + b0.nbytes + w1.nbytes + head.nbytes},
    "weight_map": {
        "layer.0.w": "model-00001-of-00002.safetensors",
        "layer.0.b": "model-00001-of-00002.safetensors",
        "layer.1.w": "model-00002-of-00002.safetensors",
        "head": "model-00002-of-00002.safetensors",
    },
}
with open("sharded/model.safetensors.index.json", "w") as f:
    json.dump(index, f, indent=2, sort_keys=True)
    f.write("\n")
