"""pdscale: observability and forecast-driven autoscaling for P/D disaggregated LLM serving.

``pdscale.spec`` holds the user's spec, which every other package builds on; ``pdscale.cli``
is the command line.
"""

__all__: list[str] = []
