"""A fitted ``HistGradientBoostingRegressor`` evaluated as arrays: every tree walked at once.

Design. The forecasters predict a handful of rows at a time (one origin's horizons), where
scikit-learn's ``predict`` costs about 8 µs a tree in per-tree call overhead: 1 ms for 120
trees, most of a forecast refresh. :class:`CompiledTrees` flattens the trees' nodes into
arrays once after the fit and walks all trees level by level with a few vectorised steps per
level (at most the trees' depth), summing leaf values in the order scikit-learn does, from
the baseline. It reads the fitted model's node records (``_predictors``, each
``TreePredictor.nodes``), which are not public API; :func:`compile_trees` therefore checks
the compiled predictions against ``predict`` on sample rows and returns None, leaving the
model's own ``predict`` in use, when they differ or the records are not there (a
scikit-learn that stores its trees otherwise). Numerical features only (the forecasters use
no categorical ones); a NaN goes where the split sent missing values in training.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CompiledTrees", "compile_trees"]

FloatArray = npt.NDArray[np.float64]


class CompiledTrees:
    """The trees of one single-output regressor as flat node arrays."""

    def __init__(self, model: Any) -> None:
        trees = [predictors[0].nodes for predictors in model._predictors]
        if not trees or any(len(p) != 1 for p in model._predictors):
            raise ValueError("one tree an iteration expected (a single-output regressor)")
        if any(t["is_categorical"].any() for t in trees):
            raise ValueError("categorical splits are not compiled")
        sizes = [len(t) for t in trees]
        offsets = np.cumsum([0, *sizes[:-1]]).astype(np.int64)
        nodes = np.concatenate(trees)
        shift = np.repeat(offsets, sizes)
        self.roots = offsets
        self.feature = nodes["feature_idx"].astype(np.int64)
        self.threshold = nodes["num_threshold"].astype(np.float64)
        self.missing_left = nodes["missing_go_to_left"].astype(bool)
        self.left = nodes["left"].astype(np.int64) + shift
        self.right = nodes["right"].astype(np.int64) + shift
        self.leaf = nodes["is_leaf"].astype(bool)
        self.value = nodes["value"].astype(np.float64)
        self.depth = int(nodes["depth"].max())
        self.baseline = float(np.asarray(model._baseline_prediction).ravel()[0])

    def predict(self, X: FloatArray) -> FloatArray:
        """The regressor's predictions for the rows of ``X``."""
        X = np.asarray(X, dtype=np.float64)
        n = len(X)
        rows = np.arange(n)[:, None]
        at = np.broadcast_to(self.roots, (n, len(self.roots))).copy()
        for _ in range(self.depth):
            inner = ~self.leaf[at]
            if not inner.any():
                break
            x = X[rows, self.feature[at]]
            left = np.where(np.isnan(x), self.missing_left[at], x <= self.threshold[at])
            at = np.where(inner, np.where(left, self.left[at], self.right[at]), at)
        # Row 0 the baseline, then each tree's leaf, summed one tree after another as
        # scikit-learn adds them (a running sum: a reduction may pair them up, and round
        # differently).
        values = np.empty((len(self.roots) + 1, n))
        values[0] = self.baseline
        values[1:] = self.value[at].T
        out: FloatArray = np.cumsum(values, axis=0)[-1]
        return out


def compile_trees(model: Any, sample: FloatArray) -> CompiledTrees | None:
    """``model`` compiled, or None where its trees cannot be read or the compiled form does not
    reproduce ``model.predict`` on ``sample`` (rows as the model is given them)."""
    try:
        compiled = CompiledTrees(model)
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        return None
    rows = np.asarray(sample, dtype=np.float64)[:256]
    if len(rows) and not np.allclose(compiled.predict(rows), model.predict(rows),
                                     rtol=1e-12, atol=1e-12):
        return None
    return compiled
