"""The forecasters' trees evaluated as arrays (forecasting._trees) give scikit-learn's
predictions exactly, missing values included, and fall back where they cannot."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.ensemble import HistGradientBoostingRegressor

from pdscale.forecasting._trees import compile_trees


def _fitted(seed: int, quantile: float) -> tuple[HistGradientBoostingRegressor, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(3000, 6))
    X[rng.random(X.shape) < 0.03] = np.nan  # missing values seen in training
    y = np.nan_to_num(X[:, 0]) * 2 + np.nan_to_num(X[:, 1]) ** 2 + rng.normal(size=len(X))
    model = HistGradientBoostingRegressor(loss="quantile", quantile=quantile, max_iter=60,
                                          max_leaf_nodes=15, min_samples_leaf=40,
                                          random_state=0).fit(X, y)
    return model, X


@pytest.mark.parametrize(("seed", "quantile"), [(0, 0.5), (1, 0.9), (2, 0.1)])
def test_compiled_trees_predict_exactly_what_scikit_learn_does(seed: int,
                                                               quantile: float) -> None:
    model, X = _fitted(seed, quantile)
    compiled = compile_trees(model, X)
    assert compiled is not None
    rng = np.random.default_rng(seed + 10)
    rows = rng.normal(scale=3.0, size=(500, 6))
    rows[rng.random(rows.shape) < 0.1] = np.nan  # NaN where training had none too
    rows[0] = np.nan
    assert np.array_equal(compiled.predict(rows), model.predict(rows))
    assert np.array_equal(compiled.predict(rows[:1]), model.predict(rows[:1]))


def test_a_model_whose_trees_cannot_be_read_is_not_compiled() -> None:
    model, X = _fitted(0, 0.5)
    model._predictors = [[object()]]  # another scikit-learn's storage: no node records
    assert compile_trees(model, X) is None
