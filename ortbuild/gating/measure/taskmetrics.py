"""The task metrics of the `eval` gate: what is kept of each batch's output (per sample: a predicted class, an
error, or the output row for a custom metric; never the whole outputs of a built-in metric) and the score of what
was kept. A custom metric is a function imported by "package.module:function" from the project's folder or the
environment, called as function(predictions, labels) -> float.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortbuild.errors import ConfigError, first_line

Score = Callable[[np.ndarray, np.ndarray], float]


@dataclass(frozen=True)
class Metric:
    name: str                        # accuracy, f1, mae, or the custom metric's import path
    higher_is_better: bool
    custom: Score | None = None

    def keep(self, out: np.ndarray, labels: np.ndarray, output: str) -> np.ndarray:
        """What is kept of a batch's output (first axis: its samples) for `labels` (the batch's)."""
        if self.custom is not None:
            return out
        if self.name == "mae":
            flat_out, flat_lab = out.reshape(len(out), -1), labels.reshape(len(labels), -1)
            if flat_out.shape != flat_lab.shape:
                raise ValueError(f"mae compares output '{output}' of {flat_out.shape[1]} value(s) per sample with "
                                 f"labels of {flat_lab.shape[1]}: give labels of the output's shape per sample")
            errors: np.ndarray = np.abs(flat_out.astype(np.float64) - flat_lab).mean(axis=1)
            return errors
        return classes(out, output)

    def score(self, kept: np.ndarray, labels: np.ndarray) -> float:
        if self.custom is not None:
            return self.custom(kept, labels)
        if self.name == "mae":
            return float(kept.mean())
        if self.name == "f1":
            return macro_f1(kept, labels)
        return float(np.mean(kept == labels))


def classes(out: np.ndarray, output: str) -> np.ndarray:
    """The predicted class of each sample: the arg-max over the last axis, or an integer output's own value where
    it holds one value per sample (a classifier's label output)."""
    if out.ndim == 1 and out.dtype.kind in "biu":
        return out.astype(np.int64)
    if out.ndim != 2:
        raise ValueError(f"output '{output}' has shape {list(out.shape)}: a class per sample needs scores of shape "
                         "[samples, classes] (or integer labels [samples]); choose another output with "
                         "`output = \"NAME\"`, or a custom metric")
    return np.asarray(out.argmax(axis=-1), dtype=np.int64)


def macro_f1(pred: np.ndarray, labels: np.ndarray) -> float:
    """Macro F1: the mean over the classes found in the labels or the predictions of 2 tp / (2 tp + fp + fn)
    (scikit-learn's f1_score(average="macro"); binary tasks are averaged over both classes)."""
    pred, labels = pred.astype(np.int64), labels.astype(np.int64)
    found = np.union1d(pred, labels)
    k = len(found)
    pi, li = np.searchsorted(found, pred), np.searchsorted(found, labels)
    confusion = np.bincount(li * k + pi, minlength=k * k).reshape(k, k)
    tp = np.diag(confusion).astype(np.float64)
    fp, fn = confusion.sum(axis=0) - tp, confusion.sum(axis=1) - tp
    return float(np.mean(2 * tp / (2 * tp + fp + fn)))


def class_labels(labels: np.ndarray, config: str, where: str) -> np.ndarray:
    """Labels as class indices (accuracy, f1): integers, or floats holding integral values."""
    if labels.ndim != 1:
        raise ConfigError(config, f"{where}.labels", f"holds labels of shape {list(labels.shape)}",
                          "accuracy and f1 take one class index per sample: an array of shape [samples]")
    if labels.dtype.kind == "f" and not np.all(np.mod(labels, 1) == 0):
        raise ConfigError(config, f"{where}.labels", "holds non-integral values, not class indices",
                          "accuracy and f1 take class indices; for regression use metric = \"mae\"")
    return np.asarray(labels, dtype=np.int64)


def resolve(metric: str, root: Path, config: str, where: str) -> Metric:
    """The Metric `metric` names (`where`: models.NAME.eval); a custom one is imported with the project's folder
    on sys.path first (a ConfigError naming the key where it cannot be imported or is not callable)."""
    if metric in ("accuracy", "f1"):
        return Metric(metric, True)
    if metric == "mae":
        return Metric(metric, False)
    module_name, _, attr = metric.partition(":")
    key = f"{where}.metric"
    hint = ("a custom metric is \"package.module:function\", a module in the folder of targets.toml or installed, "
            "whose function(predictions, labels) returns a float")
    added = str(root) not in sys.path
    if added:
        sys.path.insert(0, str(root))
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # its import runs the user's code: any error is theirs to see, named
        raise ConfigError(config, key, f"cannot import '{module_name}': {type(e).__name__}: {first_line(e)}",
                          hint) from None
    finally:
        if added:
            sys.path.remove(str(root))
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError(config, key, f"module '{module_name}' ({getattr(module, '__file__', '?')}) has no "
                                       f"'{attr}'", hint)
    if not callable(fn):
        raise ConfigError(config, key, f"'{metric}' is a {type(fn).__name__}, not a function", hint)
    lower = getattr(fn, "higher_is_better", True) is False

    def call(predictions: np.ndarray, labels: np.ndarray) -> float:
        try:
            value = fn(predictions, labels)
        except Exception as e:
            raise ConfigError(config, key, f"'{metric}' raised {type(e).__name__}: {first_line(e)}", hint) from None
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ConfigError(config, key, f"'{metric}' returned {type(value).__name__}, not a number",
                              hint) from None
        if not math.isfinite(out):
            raise ConfigError(config, key, f"'{metric}' returned {out}", "a metric is a finite number")
        return out

    return Metric(metric, not lower, call)
