"""The controller: capacity model, decision policy, reconcile loop, actuators, HTTP API.

Empty until the controller issue lands; nothing here pretends to work yet.
"""

__all__: list[str] = []
