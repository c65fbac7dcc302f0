"""Tests for fenwicks.bench.matmul: FLOP counts, the chain, result statistics, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fenwicks.bench import matmul

# ---------------------------------------------------------------------------- FLOPs


def _naive_matmul_counting(a: list[list[float]], b: list[list[float]]):
    """Textbook triple loop that counts every multiply and every add it performs."""
    n, ops = len(a), 0
    out = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            for k in range(n):
                out[i][j] += a[i][k] * b[k][j]
                ops += 2  # one multiply, one add
    return np.array(out), ops


def test_flop_count_matches_counted_operations():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    product, ops = _naive_matmul_counting(a.tolist(), b.tolist())
    np.testing.assert_allclose(product, a @ b)
    assert ops == 54  # 9 outputs x 3 multiply-adds x 2
    assert matmul.matmul_flop_count(3) == ops
    assert matmul.matmul_flop_count(3, repeats=4, replicas=2) == 8 * ops
    # 1024**3 = 1073741824; x 2 FLOPs x 10 repeats x 8 replicas
    assert matmul.matmul_flop_count(1024, repeats=10, replicas=8) == 171_798_691_840


def test_chain_performs_every_product():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((5, 5)).astype(np.float32)
    b = (rng.standard_normal((5, 5)) / 3).astype(np.float32)
    got = np.asarray(matmul.matmul_chain(a, b, 4))
    np.testing.assert_allclose(got, a @ np.linalg.matrix_power(b, 4), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(matmul.matmul_chain(a, b, 1)), a @ b, rtol=1e-5)


# ------------------------------------------------------------------------- results


def test_result_statistics_by_hand():
    result = matmul.MatmulResult("gpu", "gpu", "float32", 1000, 1, 1, flops=2 * 10**12,
                                 cold_seconds=8.0, seconds=(4.0, 1.0, 2.0), peak_tflops=4.0)
    assert result.tflops == pytest.approx(1.0)  # 2e12 FLOPs / median 2 s
    assert result.min_tflops == pytest.approx(0.5)  # slowest call, 4 s
    assert result.max_tflops == pytest.approx(2.0)  # fastest call, 1 s
    assert result.cold_tflops == pytest.approx(0.25)
    assert result.peak_fraction == pytest.approx(0.25)
    assert json.loads(json.dumps(result.as_dict()))["tflops"] == pytest.approx(1.0)


# ---------------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs,needle", [
    ({"n": 0}, "n=0"), ({"n": -5}, "n=-5"), ({"n": 2.5}, "n=2.5"), ({"n": True}, "n=True"),
    ({"dtype": "int8"}, "dtype='int8'"), ({"repeats": 0}, "repeats=0"),
    ({"trials": 0}, "trials=0"), ({"device": "npu"}, "device='npu'"),
])
def test_matmul_flops_rejects_bad_input(kwargs, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        matmul.matmul_flops(**kwargs)


def test_numpy_rejects_bad_input():
    with pytest.raises(ValueError, match="repeats=-1"):
        matmul.numpy_matmul_flops(n=8, repeats=-1)
