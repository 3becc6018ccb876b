"""Environment for the embedded local Ray, set before `ray` is first imported.

Ray reads these when it is imported, not when `ray.init` runs, so every module that imports
Ray for the engine imports this first. With them the local instance listens on 127.0.0.1 only
and needs no auth token (STACK-NOTES). When joining a cluster (`OPENBOT_RAY_ADDRESS` or
`RAY_ADDRESS` set) nothing is changed: a real cluster keeps its own addresses and auth.
"""

from __future__ import annotations

import os

JOINING = bool(os.environ.get("OPENBOT_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS"))

if not JOINING:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
