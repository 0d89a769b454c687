"""The P/D cluster simulator: trace loaders, instance profiles, event and fluid modes.

Empty until the simulator issue lands; nothing here pretends to work yet.
"""

__all__: list[str] = []
