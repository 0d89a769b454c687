from __future__ import annotations

import copy

import numpy as np
import pytest
from sklearn.utils.estimator_checks import parametrize_with_checks

from pdscale.forecasting import (
    AutoForecaster,
    ExponentialSmoothing,
    LastValue,
    QuantileGBForecaster,
    SeasonalNaive,
    SeriesError,
    backtest,
    regularize,
)

RES = 600.0  # 10-minute steps keep the synthetic days short
DAY_STEPS = 144


def daily_series(days: int, *, seed: int = 0, noise: float = 0.05,
                 day_to_day: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """A daily cycle with multiplicative noise; ``day_to_day`` varies each day's level."""
    rng = np.random.default_rng(seed)
    n = days * DAY_STEPS
    t = np.arange(n) * RES
    phase = 2 * np.pi * (t % 86400) / 86400
    level = np.repeat(1 + day_to_day * rng.uniform(-1, 1, days), DAY_STEPS)
    base = 100 * level * (1 + 0.5 * np.sin(phase - np.pi / 2))
    return t, base * (1 + noise * rng.standard_normal(n))


# Checks that feed random rows as X: a forecaster reads X[:, 0] as observation times and
# rejects times that go back (bad input), so these checks cannot apply. Every other check of
# scikit-learn's suite runs and passes.
_RANDOM_X_CHECKS = (
    "check_fit_score_takes_y", "check_estimators_overwrite_params",
    "check_dont_overwrite_parameters", "check_estimators_fit_returns_self",
    "check_readonly_memmap_input", "check_n_features_in_after_fitting",
    "check_positive_only_tag_during_fit", "check_estimators_dtypes", "check_dtype_object",
    "check_pipeline_consistency", "check_estimators_pickle", "check_f_contiguous_array_estimator",
    "check_regressors_train", "check_regressor_data_not_an_array",
    "check_regressors_no_decision_function", "check_supervised_y_2d", "check_regressors_int",
    "check_methods_sample_order_invariance", "check_methods_subset_invariance",
    "check_fit2d_1feature", "check_dict_unchanged", "check_fit_idempotent",
    "check_fit_check_is_fitted", "check_n_features_in", "check_fit2d_predict1d",
    "check_estimators_nan_inf",
)


def _expected_failures(estimator: object) -> dict[str, str]:
    reason = ("forecasters read X[:, 0] as monotonic observation times; the check feeds random "
              "rows, which they reject as bad input")
    return dict.fromkeys(_RANDOM_X_CHECKS, reason)


ESTIMATORS = [LastValue(resolution_s=1.0), SeasonalNaive(period_s=5.0, resolution_s=1.0),
              ExponentialSmoothing(resolution_s=1.0)]


@parametrize_with_checks(ESTIMATORS, expected_failed_checks=_expected_failures)
def test_sklearn_contract(estimator: object, check: object) -> None:
    check(estimator)  # type: ignore[operator]


@pytest.mark.parametrize("cls", [LastValue, SeasonalNaive, ExponentialSmoothing,
                                 QuantileGBForecaster, AutoForecaster])
def test_contract_basics(cls: type) -> None:
    """What the contract means here: stored params only, fit returns self, fitted state ends
    in an underscore, predict before fit is a clear error."""
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError

    est = cls(resolution_s=RES)
    assert clone(est).get_params() == est.get_params()
    with pytest.raises(NotFittedError):
        est.predict(np.array([[0.0]]))
    t, y = daily_series(12)
    assert est.fit(t[:, None], y) is est
    assert hasattr(est, "series_") and hasattr(est, "fit_time_s_")


def test_quantiles_never_cross_and_have_the_right_shape() -> None:
    t, y = daily_series(12)
    model = QuantileGBForecaster(resolution_s=RES, quantiles=(0.1, 0.5, 0.9),
                                 horizons_s=(600, 1800, 3600)).fit(t[:, None], y)
    future = t[-1] + np.array([600, 1200, 1800, 3600])[:, None]
    q = model.predict_quantiles(future)
    assert q.shape == (4, 3)
    assert np.all(np.diff(q, axis=1) >= 0)
    assert model.predict(future).shape == (4,)


def test_random_state_makes_fits_deterministic() -> None:
    t, y = daily_series(12)
    future = t[-1] + np.array([[600.0], [1800.0]])
    a = QuantileGBForecaster(resolution_s=RES, random_state=3, max_train_rows=2000)
    b = QuantileGBForecaster(resolution_s=RES, random_state=3, max_train_rows=2000)
    assert np.array_equal(a.fit(t[:, None], y).predict_quantiles(future),
                          b.fit(t[:, None], y).predict_quantiles(future))


def test_gaps_and_nans_are_handled() -> None:
    t, y = daily_series(12)
    y = y.copy()
    y[500:503] = np.nan  # short gap: filled
    y[900:960] = np.nan  # long gap: stays missing
    keep = np.ones(len(t), dtype=bool)
    keep[1200:1210] = False  # missing windows: no rows at all
    model = QuantileGBForecaster(resolution_s=RES).fit(t[keep, None], y[keep])
    assert model.series_.filled >= 3 and model.series_.missing > 0
    out = model.predict_quantiles(t[-1] + np.array([[600.0], [3600.0]]))
    assert np.all(np.isfinite(out))


def test_update_moves_the_origin_without_refitting() -> None:
    t, y = daily_series(12)
    model = LastValue(resolution_s=RES).fit(t[:-5, None], y[:-5])
    model.update(t[-5:, None], y[-5:])
    assert model.t_last_ == t[-1]
    assert model.predict(np.array([[t[-1] + RES]]))[0] == pytest.approx(
        y[-1] + model._residual_quantiles(1)[0])
    with pytest.raises(SeriesError, match="after the last one"):
        model.update(t[:3, None], y[:3])


def test_main_model_beats_the_baselines_on_a_daily_cycle() -> None:
    """A daily cycle whose level changes from day to day, with noise: yesterday's value is off
    by the day's change, the last value misses the cycle's trend; the boosted model, which sees
    yesterday's shape and today's level, is far better than either naive forecast."""
    t, y = daily_series(14, seed=1, noise=0.03, day_to_day=0.25)
    series = regularize(t, y, resolution_s=RES)
    models = {"last": LastValue(resolution_s=RES),
              "seasonal": SeasonalNaive(resolution_s=RES),
              "gb": QuantileGBForecaster(resolution_s=RES, horizons_s=(1800, 3600, 7200))}
    result = backtest(series, models, horizons_s=(3600, 7200), train_steps=10 * DAY_STEPS,
                      season_steps=DAY_STEPS)
    for h in ("60m", "120m"):
        gb = result.scores["gb"][h]["mae"]
        assert gb < 0.7 * result.scores["last"][h]["mae"]
        assert gb < 0.7 * result.scores["seasonal"][h]["mae"]


def test_upper_quantile_is_as_sharp_as_the_last_value_where_the_noise_ignores_the_level(
        ) -> None:
    """Quiet and busy half-days (80 and 400 requests/s) with noise of the same size in both:
    the size of a change does not follow the level, as on ServeGen m-large. Changes measured
    in units of the last hour's level were five times larger in a quiet stretch than in a busy
    one, and the 0.9 quantile came out 4-12 % less sharp than the last value plus its own
    errors' quantiles; in units of the week's mean size it is sharper than that at both
    horizons."""
    rng = np.random.default_rng(0)
    n = 14 * DAY_STEPS
    t = np.arange(n) * RES
    level = np.repeat(rng.choice([80.0, 400.0], n // 72 + 1), 72)[:n]
    series = regularize(t, level + 20 * rng.standard_normal(n), resolution_s=RES)
    models = {"gb": QuantileGBForecaster(resolution_s=RES, horizons_s=(600, 1800)),
              "last": LastValue(resolution_s=RES)}
    result = backtest(series, models, horizons_s=(600, 1800), train_steps=10 * DAY_STEPS,
                      season_steps=DAY_STEPS)
    for j, steps in enumerate((1, 3)):
        actual = series.values[result.origins + steps]

        def pinball(name: str, j: int = j, actual: np.ndarray = actual) -> float:
            diff = actual - result.forecasts[name][:, j, -1]
            return float(np.nanmean(np.maximum(0.9 * diff, -0.1 * diff)))

        assert pinball("gb") < pinball("last")


def test_upper_quantile_is_roughly_calibrated() -> None:
    t, y = daily_series(14, seed=2, noise=0.1)
    series = regularize(t, y, resolution_s=RES)
    result = backtest(series, {"gb": QuantileGBForecaster(resolution_s=RES,
                                                          horizons_s=(600, 1800))},
                      horizons_s=(600, 1800), train_steps=10 * DAY_STEPS,
                      season_steps=DAY_STEPS)
    for h in ("10m", "30m"):
        assert 0.75 < result.scores["gb"][h]["coverage_q90"] < 0.99


def test_conformal_calibration_keeps_coverage_when_the_noise_grows() -> None:
    # Quiet for 8 days, then four times noisier: a quantile fitted mostly on the quiet days
    # under-covers; calibrated on the most recent (noisy) share of training, it holds.
    t, quiet = daily_series(14, seed=3, noise=0.03)
    _, loud = daily_series(14, seed=4, noise=0.12)
    y = np.where(t < 8 * 86400, quiet, loud)
    series = regularize(t, y, resolution_s=RES)
    models = {"raw": QuantileGBForecaster(resolution_s=RES, horizons_s=(600,), calibration=0.0),
              "cqr": QuantileGBForecaster(resolution_s=RES, horizons_s=(600,))}
    result = backtest(series, models, horizons_s=(600,), train_steps=10 * DAY_STEPS,
                      season_steps=DAY_STEPS)
    raw = result.scores["raw"]["10m"]["coverage_q90"]
    cqr = result.scores["cqr"]["10m"]["coverage_q90"]
    assert raw < 0.85  # outside the target band [0.85, 0.95]
    assert abs(cqr - 0.9) < abs(raw - 0.9) and 0.82 < cqr < 0.97
    assert models["cqr"].calibrated_ and not models["raw"].calibrated_


def test_rolling_recalibration_restores_coverage_after_the_fit() -> None:
    # The noise grows a day after the fit ends: the fit's calibration cannot see it, so the
    # fixed quantile under-covers for the rest of the series; recalibrated on the last day's
    # errors, the 0.9 quantile covers about 90 % again once that day has passed.
    t, quiet = daily_series(16, seed=3, noise=0.03)
    _, loud = daily_series(16, seed=4, noise=0.12)
    y = np.where(t < 11 * 86400, quiet, loud)
    series = regularize(t, y, resolution_s=RES)
    models = {"fixed": QuantileGBForecaster(resolution_s=RES, horizons_s=(600,),
                                            recalibration_s=0),
              "rolling": QuantileGBForecaster(resolution_s=RES, horizons_s=(600,))}
    result = backtest(series, models, horizons_s=(600,), train_steps=10 * DAY_STEPS,
                      season_steps=DAY_STEPS)
    later = result.origins >= 12 * DAY_STEPS  # a day after the change
    actual = series.values[result.origins[later] + 1]
    coverage = {name: float(np.mean(actual <= result.forecasts[name][later, 0, -1]))
                for name in models}
    assert coverage["fixed"] < 0.8
    assert 0.85 <= coverage["rolling"] <= 0.95


def test_rolling_recalibration_reads_no_future_value() -> None:
    t, y = daily_series(12, seed=5, noise=0.1)
    model = QuantileGBForecaster(resolution_s=RES, horizons_s=(600, 1800)).fit(
        t[:10 * DAY_STEPS, None], y[:10 * DAY_STEPS])
    values = regularize(t, y, resolution_s=RES).values
    origin = np.array([11 * DAY_STEPS])
    horizons = np.array([1, 3])
    seen = model._predict_origins(values[:origin[0] + 1], origin, horizons)
    changed = values.copy()
    changed[origin[0] + 1:] *= 5  # what happens after the origin
    assert np.array_equal(model._predict_origins(changed, origin, horizons), seen)
    off = copy.deepcopy(model)
    off.recalibration_s = 0
    assert not np.array_equal(off._predict_origins(values, origin, horizons), seen)


def stepped_series(days: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A daily cycle whose level steps every half day, with noise and rare spikes."""
    rng = np.random.default_rng(seed)
    t, y = daily_series(days, seed=seed, noise=0.08)
    n = len(t)
    y = y * np.repeat(rng.uniform(0.7, 1.4, 2 * days + 1), n // (2 * days) + 1)[:n]
    spikes = rng.random(n) < 0.003
    y[spikes] *= rng.uniform(2, 4, spikes.sum())
    return t, y


def with_outages(t: np.ndarray, y: np.ndarray, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A metrics outage a day (absent rows, 30 minutes to 4 hours) whose edge windows are
    partial (1-10 % of the rate), and a stretch a day that reads zero."""
    rng = np.random.default_rng(seed)
    y = y.copy()
    keep = np.ones(len(t), dtype=bool)
    for day in range(len(t) // DAY_STEPS):
        length = int(rng.integers(3, 25))
        start = day * DAY_STEPS + int(rng.integers(1, DAY_STEPS - length - 1))
        keep[start:start + length] = False
        y[start - 1] *= rng.uniform(0.01, 0.1)
        y[start + length] *= rng.uniform(0.01, 0.1)
        zeros = day * DAY_STEPS + int(rng.integers(0, DAY_STEPS - 12))
        if keep[zeros:zeros + 12].all():
            y[zeros:zeros + int(rng.integers(2, 12))] = 0.0
    return t[keep], y[keep]


def test_no_quantile_jump_after_gaps_zero_stretches_and_partial_windows() -> None:
    # Relative to the last value, a partial window at an outage's edge (a few % of the rate)
    # turned every lag into a ratio of 10-100 and the targets after it into ratios of 20-30;
    # rows that looked like it in any feature then took the 0.9 quantile learned there: 13 to
    # 81 times the day's median on these series. Additive on the last value, in units of a
    # scale that cannot approach zero, it stays under 3 times the larger of the day's median
    # and the last value (a spike).
    for seed in (11, 21):
        t, y = stepped_series(14, seed=seed)
        t, y = with_outages(t, y, seed=seed + 1)
        train = t < 10 * 86400
        model = QuantileGBForecaster(resolution_s=RES, horizons_s=(600, 1800, 3600))
        model.fit(t[train, None], y[train])
        values = regularize(t, y, resolution_s=RES).values
        origins = np.arange(int(train.sum()), len(values) - 3)
        upper = model._predict_origins(values, origins, np.array([1, 3]))[:, :, -1]
        assert np.all(np.isfinite(upper))
        day_median = np.array([np.nanmedian(values[o - DAY_STEPS:o + 1]) for o in origins])
        last = model._base(values, origins)[0]
        assert np.max(upper.max(axis=1) / np.fmax(day_median, last)) < 3


def test_short_history_still_forecasts() -> None:
    # Eight minutes of a bursty per-minute rate: the trees cannot be fitted yet, so the short-
    # history model forecasts (the last value or the level, and the conformal quantiles of
    # the changes seen so far), and its upper quantile covers what it has seen.
    rng = np.random.default_rng(5)
    t = np.arange(8) * 60.0
    y = rng.gamma(1.5, 2.0, len(t))
    model = QuantileGBForecaster(resolution_s=60.0, horizons_s=(60, 300, 600))
    model.fit(t[:, None], y)
    assert model.mode_ == "short-history" and not model.models_
    out = model.predict_quantiles(t[-1] + np.array([[60.0], [600.0], [1800.0]]))
    assert np.all(np.isfinite(out)) and np.all(out[:, 1] >= out[:, 0])
    assert np.all(out[:, 1] <= 2 * y.max())
    long_t, long_y = daily_series(2)
    assert QuantileGBForecaster(resolution_s=RES).fit(long_t[:, None], long_y).mode_ == "trees"
    assert QuantileGBForecaster(resolution_s=RES, short_history_s=3 * 86400).fit(
        long_t[:, None], long_y).mode_ == "short-history"


def test_backtest_refits_on_a_growing_history() -> None:
    # A refit at every origin: short-history fits first, boosted trees once the history
    # allows (each a boosted fit, the test's cost).
    t, y = daily_series(1)
    series = regularize(t[:36], y[:36], resolution_s=RES)
    model = QuantileGBForecaster(resolution_s=RES)
    result = backtest(series, {"gb": model}, horizons_s=(600, 1800), train_steps=5,
                      season_steps=1, refit_every=1)
    assert result.forecasts["gb"].shape == (36 - 3 - 4, 2, 2)
    assert model.mode_ == "trees"
    assert np.all(np.isfinite(result.forecasts["gb"]))
    with pytest.raises(ValueError, match="'refit_every' parameter"):
        backtest(series, {"gb": LastValue(resolution_s=RES)}, horizons_s=(600,),
                 train_steps=5, season_steps=1, refit_every=0)


def test_auto_falls_back_with_a_reason() -> None:
    t, y = daily_series(1)
    auto = AutoForecaster(resolution_s=RES).fit(t[:40, None], y[:40])
    assert "no seasonal-naive" in auto.choice_reason_
    assert "too short for the boosted model" in auto.choice_reason_
    flat = AutoForecaster(resolution_s=RES).fit(t[:100, None], np.full(100, 7.0))
    assert "constant series" in flat.choice_reason_
    assert flat.predict(np.array([[t[99] + RES]]))[0] == pytest.approx(7.0)
    full_t, full_y = daily_series(14)
    chosen = AutoForecaster(resolution_s=RES).fit(full_t[:, None], full_y)
    assert "chose " in chosen.choice_reason_ and chosen.scores_


def test_bad_input_is_refused_clearly() -> None:
    t, y = daily_series(3)
    with pytest.raises(SeriesError, match="not monotonic"):
        LastValue(resolution_s=RES).fit(t[::-1, None], y)
    model = LastValue(resolution_s=RES).fit(t[:, None], y)
    with pytest.raises(ValueError, match="shorter than the resolution"):
        model.predict(np.array([[t[-1] + RES / 4]]))
    with pytest.raises(SeriesError, match="more than one period"):
        SeasonalNaive(resolution_s=RES).fit(t[:50, None], y[:50])
    with pytest.raises(SeriesError, match="at least 2 observed steps"):
        QuantileGBForecaster(resolution_s=RES).fit(t[:10, None], np.full(10, np.nan))
    with pytest.raises(ValueError, match="'quantiles' parameter"):
        LastValue(quantiles=(0.5, 1.5)).fit(t[:, None], y)
    with pytest.raises(SeriesError, match="shorter than the resolution"):
        backtest(regularize(t, y, resolution_s=RES), {"l": LastValue(resolution_s=RES)},
                 horizons_s=(60,), train_steps=200, season_steps=DAY_STEPS)


def test_online_updates_between_scheduled_refits() -> None:
    from pdscale.forecasting import OnlineForecaster

    t, y = daily_series(3)
    online = OnlineForecaster(QuantileGBForecaster(resolution_s=RES, horizons_s=(600, 1800)),
                              refit_every_s=3600)
    for a, b in zip(t[:300], y[:300], strict=True):
        online.observe(a, b)
    assert online.refit_due(t[299])
    first = online.refit(t[299])
    assert not online.refit_due(t[299] + 600) and online.refit_due(t[299] + 3600)
    for a, b in zip(t[300:310], y[300:310], strict=True):
        online.observe(a, b)
    assert online.fitted is first and first.t_last_ == t[309]  # updated, not refitted
    out = online.forecast(np.array([600.0, 1800.0]))
    assert out.shape == (2, 2) and online.fit_seconds > 0 and online.predict_seconds > 0
    with pytest.raises(SeriesError, match="forward in time"):
        online.observe(t[0], 1.0)


def test_online_fast_paths_match_update_and_predict_quantiles() -> None:
    """The online loop appends and forecasts without sklearn's input validation; what it gets
    is what update() and predict_quantiles() give, gaps and missing values included."""
    from pdscale.forecasting import OnlineForecaster

    t, y = daily_series(3)
    y = y.copy()
    y[320] = np.nan
    online = OnlineForecaster(QuantileGBForecaster(resolution_s=RES, horizons_s=(600, 1800)),
                              refit_every_s=1e9)
    for a, b in zip(t[:300], y[:300], strict=True):
        online.observe(a, b)
    reference = copy.deepcopy(online.refit(t[299]))
    steps = [i for i in range(300, 340) if i not in (310, 311)]  # a gap of two steps
    for i in steps:
        online.observe(t[i], y[i])
        reference.update(np.array([[t[i]]]), np.array([y[i]]))
    fitted = online.fitted
    assert fitted is not None
    np.testing.assert_array_equal(fitted.values_, reference.values_)
    assert fitted.t_last_ == reference.t_last_
    horizons = np.array([600.0, 1200.0, 1800.0])
    np.testing.assert_array_equal(online.forecast(horizons),
                                  reference.predict_quantiles(reference.t_last_ +
                                                              horizons[:, None]))
    with pytest.raises(ValueError, match="at least one resolution step"):
        online.forecast(np.array([0.0]))


def test_recalibration_predicts_each_past_origin_once_a_fit() -> None:
    """A forecast recalibrates on the errors of a day of past origins; what the fitted model
    said there cannot change as points arrive, so each is predicted once a fit, and the
    forecasts equal those computed afresh."""
    from pdscale.controller._forecast import default_forecaster

    n = 3 * 1440
    t = np.arange(n) * 60.0
    rng = np.random.default_rng(0)
    y = 1e5 * (1 + 0.5 * np.sin(2 * np.pi * t / 86400)) * rng.gamma(20, 1 / 20, n)
    fc = default_forecaster(0.97, 21600.0)
    for ti, yi in zip(t[:-30], y[:-30], strict=True):
        fc.observe(ti, yi)
    fc.refit(t[-31])
    model = fc.fitted
    assert model is not None
    horizons = np.array([60.0, 300.0])
    calls: list[int] = []
    relative = model._relative

    def counted(values, origins, hz):  # type: ignore[no-untyped-def]
        calls.append(len(origins))
        return relative(values, origins, hz)

    model._relative = counted  # type: ignore[method-assign]
    for ti, yi in zip(t[-30:], y[-30:], strict=True):
        fc.observe(ti, yi)
        cached = fc.forecast(horizons)
        model.past_rows_.clear()
        assert np.array_equal(cached, fc.forecast(horizons))
    assert model.past_rows_
    # Cleared every minute above, so each forecast after a clear recomputed the past; the
    # forecast with the store filled predicted its own origin and at most a new past one.
    fc.forecast(horizons)
    before = len(calls)
    fc.forecast(horizons)
    assert calls[before:] == [1]
