"""Load forecasting at the pre-warm horizon (scikit-learn estimator contract).

Empty until the forecasting issue lands; nothing here pretends to work yet.
"""

__all__: list[str] = []
