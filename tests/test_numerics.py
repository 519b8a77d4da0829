"""workbench.analysis.numerics: relative errors, the error table, unit roundoff."""

import math

import numpy as np
import pytest

from workbench.analysis.experiment import compare_step
from workbench.analysis.numerics import (UNIT_ROUNDOFF, bitwise_equal, error_table, max_abs_diff, max_rel_err,
                                         norm_rel_err, unit_roundoff)


def test_max_rel_err_is_scaled_by_the_reference_maximum_not_elementwise():
    ref = np.array([1e-12, 2.0, -4.0])
    x = ref + np.array([1e-6, 0.0, 0.0])    # huge elementwise relative error at the tiny element
    assert max_rel_err(x, ref) == pytest.approx(1e-6 / 4.0)
    assert norm_rel_err(x, ref) == pytest.approx(1e-6 / math.sqrt(1e-24 + 4 + 16))


def test_max_rel_err_matches_the_harness_numerical_check():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((8, 5))
    x = ref + 1e-3 * rng.standard_normal((8, 5))
    out = compare_step({"loss": 1.0, "outputs": x}, {"loss": 1.0, "outputs": ref})
    assert out["output_max_rel_err"] == pytest.approx(max_rel_err(x, ref), rel=1e-12)


def test_zero_reference_and_nan_and_shapes():
    z = np.zeros(3)
    assert max_rel_err(z, z) == 0.0 and norm_rel_err(z, z) == 0.0
    assert max_rel_err(np.ones(3), z) == math.inf
    assert math.isnan(max_rel_err(np.array([np.nan, 1.0]), np.array([1.0, 1.0])))
    assert math.isnan(max_rel_err(np.array([]), np.array([])))
    with pytest.raises(ValueError):
        max_rel_err(np.ones(3), np.ones(4))


def test_rounding_to_float32_stays_within_its_unit_roundoff():
    ref = np.random.default_rng(1).standard_normal(10_000)
    x = ref.astype(np.float32)
    assert 0 < max_rel_err(x, ref) <= UNIT_ROUNDOFF["fp32"]
    assert max_rel_err(x, ref) > UNIT_ROUNDOFF["fp64"]


def test_bitwise_equal_and_max_abs_diff():
    a = np.array([1.0, 2.0], dtype=np.float32)
    assert bitwise_equal(a, a.copy())
    assert not bitwise_equal(a, a.astype(np.float64))           # same values, other dtype
    b = a.copy()
    b[1] = np.nextafter(b[1], np.float32(3))
    assert not bitwise_equal(a, b)
    assert max_abs_diff(b, a) == pytest.approx(2.0 * 2.0**-23)
    assert max_abs_diff(np.array([]), np.array([])) == 0.0


def test_error_table_rows_columns_and_worst():
    ref = {"a": np.array([1.0, 2.0]), "b": np.array([10.0, -10.0])}
    cands = {"good": {"a": np.array([1.0, 2.0 + 1e-6]), "b": np.array([10.0, -10.0])},
             "bad": {"a": np.array([0.0, 0.0])}}
    t = error_table(cands, ref)
    assert list(t.columns) == ["good", "bad"] and list(t.index) == ["a", "b", "(worst)"]
    assert t.loc["a", "good"] == pytest.approx(5e-7) and t.loc["b", "good"] == 0.0
    assert t.loc["a", "bad"] == 1.0 and math.isnan(t.loc["b", "bad"])
    assert t.loc["(worst)", "good"] == pytest.approx(5e-7) and t.loc["(worst)", "bad"] == 1.0
    n = error_table(cands, ref, metric="norm_rel")
    assert n.loc["a", "good"] == pytest.approx(1e-6 / math.sqrt(5))
    with pytest.raises(ValueError):
        error_table(cands, ref, metric="elementwise")


def test_unit_roundoff_spellings_and_order():
    assert unit_roundoff("bfloat16") == 2.0**-8 == unit_roundoff("bf16")
    assert unit_roundoff("float32") == 2.0**-24
    assert UNIT_ROUNDOFF["fp64"] < UNIT_ROUNDOFF["fp32"] < UNIT_ROUNDOFF["tf32"] < UNIT_ROUNDOFF["bf16"]
    with pytest.raises(ValueError):
        unit_roundoff("int8")
