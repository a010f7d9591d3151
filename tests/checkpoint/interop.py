#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The Python side of the interoperability test (interop.c is the dtl side): `write PATH` saves the tensors
# below with the safetensors package, `check PATH` loads a file that dtl wrote and compares every tensor and
# the metadata. Both sides compute the same values from the same rule.
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

SPECS = [  # name, numpy dtype, shape (the order gives each tensor its index k)
    ("f32", np.float32, (3, 4)),
    ("f64", np.float64, (2, 3, 2)),
    ("f16", np.float16, (5,)),
    ("i8", np.int8, (4, 3)),
    ("u8", np.uint8, (7,)),
    ("i32", np.int32, (2, 2)),
    ("i64", np.int64, (3, 1)),
    ("empty", np.float32, (0, 3)),
    ("scalar", np.float64, ()),
    ("layers.0.w", np.float32, (6, 5)),
]


def values(k, dtype, shape):
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(n, dtype=np.int64)
    v = (i * 7 + k * 13) % 251 if dtype == np.uint8 else (i * 7 + k * 13) % 201 - 100
    return v.astype(dtype).reshape(shape)


def write(path):
    tensors = {name: values(k, dt, shape) for k, (name, dt, shape) in enumerate(SPECS)}
    tensors["mask"] = np.array([True, False, True])
    save_file(tensors, path, metadata={"format": "np", "writer": "python"})


def check(path):
    got = load_file(path)
    assert set(got) == {s[0] for s in SPECS}, sorted(got)
    for k, (name, dt, shape) in enumerate(SPECS):
        a = got[name]
        assert a.dtype == dt and a.shape == shape, (name, a.dtype, a.shape)
        assert np.array_equal(a, values(k, dt, shape)), name
    with safe_open(path, framework="np") as f:
        assert f.metadata() == {"format": "dtl", "writer": "dtl"}, f.metadata()
    print("python read %d tensors written by dtl: ok" % len(got))


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
