"""The comparison rules on constructed data, including cases that must fail."""

from __future__ import annotations

import numpy as np

from ortbuild.gating.measure import compare

FP32 = {"rtol": 1e-4, "atol": 1e-5, "mismatch_fraction": 0.0}


def _golden() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(8, 10)).astype(np.float32)


def test_fp32_within_tolerance_passes_and_reports_statistics() -> None:
    e = _golden()
    r = compare.compare("logits", "test_data_set_0", e, e * np.float32(1 + 2e-5), FP32)
    assert r.passed
    assert {c.metric for c in r.checks} == {"nonfinite", "elementwise"}
    assert 0 < r.stats["max_abs"] < 1e-4 and r.stats["p99_rel"] < 3e-5


def test_one_corrupted_value_fails_with_the_worst_element_and_the_passing_tolerance() -> None:
    e = _golden()
    a = e.copy()
    a[3, 7] += 0.25
    r = compare.compare("logits", "test_data_set_0", e, a, FP32)
    assert not r.passed and [c.metric for c in r.failed_checks] == ["elementwise"]
    assert r.stats["mismatches"] == 1 and r.stats["mismatch_fraction"] == 1 / 80
    assert r.stats["worst"]["index"] == [3, 7]
    assert r.stats["worst"]["actual"] - r.stats["worst"]["expected"] == np.float32(a[3, 7]) - e[3, 7]
    need = r.stats["passing_tolerance"]["atol"]
    assert compare.compare("logits", "d", e, a, {**FP32, "atol": need + 1e-9}).passed  # it really would pass
    assert not compare.compare("logits", "d", e, a, {**FP32, "atol": need * 0.99}).passed
    text = "\n".join(compare.describe_failure(r))
    assert "worst element at [3, 7]" in text and "1 of 80 elements" in text and "smallest tolerance" in text


def test_mismatch_fraction_allows_a_few_elements() -> None:
    e = _golden()
    a = e.copy()
    a[0, :2] += 1.0  # 2 of 80 = 2.5%
    assert not compare.compare("mask", "d", e, a, {**FP32, "mismatch_fraction": 0.02}).passed
    assert compare.compare("mask", "d", e, a, {**FP32, "mismatch_fraction": 0.03}).passed


def test_quantization_noise_fails_elementwise_but_passes_task_metrics() -> None:
    e = _golden()
    a = e + np.random.default_rng(1).normal(scale=0.02, size=e.shape).astype(np.float32)
    assert not compare.compare("logits", "d", e, a, FP32).passed
    r = compare.compare("logits", "d", e, a, {"cosine": 0.99, "top1": 0.99})
    assert r.passed and r.stats["cosine"] > 0.99 and r.stats["top1_agreement"] == 1.0


def test_cosine_and_top1_fail_when_the_output_is_wrong() -> None:
    e = _golden()
    a = np.random.default_rng(2).normal(size=e.shape).astype(np.float32)  # unrelated values
    r = compare.compare("logits", "d", e, a, {"cosine": 0.99, "top1": 0.99, "top5": 0.99})
    assert {c.metric for c in r.failed_checks} == {"cosine", "top1", "top5"}


def test_nan_where_a_number_was_expected_fails() -> None:
    e = _golden()
    a = e.copy()
    a[1, 1] = np.nan
    r = compare.compare("logits", "d", e, a, {"cosine": 0.5})
    assert [c.metric for c in r.failed_checks] == ["nonfinite"]
    same = e.copy()
    same[1, 1] = np.inf
    assert compare.compare("logits", "d", same, same.copy(), FP32).passed  # Inf where Inf was expected


def test_shape_dtype_and_integer_outputs_are_exact() -> None:
    labels = np.array([0, 1, 1, 0], dtype=np.int64)
    assert compare.compare("label", "d", labels, labels.copy(), {}).passed
    r = compare.compare("label", "d", labels, np.array([0, 1, 0, 0], dtype=np.int64), FP32)
    assert [c.metric for c in r.failed_checks] == ["exact"] and r.stats["worst"]["index"] == [2]
    assert [c.metric for c in compare.compare("label", "d", labels, labels[:3], {}).failed_checks] == ["shape"]
    r = compare.compare("label", "d", labels, labels.astype(np.float32), {})
    assert [c.metric for c in r.failed_checks] == ["dtype"]
    words = np.array(["cat", "dog"], dtype=object)
    assert not compare.compare("word", "d", words, np.array(["cat", "cow"], dtype=object), {}).passed
    assert compare.compare("flag", "d", np.array([True]), np.array([True]), {}).passed


def test_sequence_of_maps_matches_keys_exactly_and_values_by_the_float_rule() -> None:
    e = [{0: 0.25, 1: 0.75}, {0: 0.5, 1: 0.5}]
    assert compare.compare("output_probability", "d", e, [{0: 0.25, 1: 0.7500001}, {0: 0.5, 1: 0.5}], FP32).passed
    r = compare.compare("output_probability", "d", e, [{0: 0.25, 2: 0.75}, {0: 0.5, 1: 0.5}], FP32)
    assert [c.metric for c in r.failed_checks] == ["structure"]
    r = compare.compare("output_probability", "d", e, [{0: 0.35, 1: 0.65}, {0: 0.5, 1: 0.5}], FP32)
    assert [c.metric for c in r.failed_checks] == ["elementwise"]
    assert not compare.compare("m", "d", e, e[:1], FP32).passed  # a shorter sequence


def test_an_ignored_output_is_not_compared() -> None:
    r = compare.compare("noise", "d", np.zeros(3), np.ones(3), {**FP32, "ignore": True})
    assert r.ignored and r.passed and not r.checks


def test_as_json_holds_every_field_in_order_and_shares_nothing() -> None:
    """OutputResult.as_json is written out (typed): it says what dataclasses.asdict would, plus `passed`, in the
    fields' order, and a change to the result later does not change the document."""
    import dataclasses

    e = _golden()
    a = e.copy()
    a[0, 1] += 1.0
    r = compare.compare("logits", "test_data_set_0", e, a, {**FP32, "cosine": 0.99, "top1": 0.9})
    doc = r.as_json()
    assert doc == {**dataclasses.asdict(r), "passed": False}
    assert list(doc) == [f.name for f in dataclasses.fields(r)] + ["passed"]
    assert list(doc["checks"][0]) == [f.name for f in dataclasses.fields(compare.Check)]
    r.stats["worst"]["index"].append(99)
    r.rule["atol"] = 1.0
    assert doc["stats"]["worst"]["index"] == [0, 1] and doc["rule"]["atol"] == FP32["atol"]
