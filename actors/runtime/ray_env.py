"""Environment for the embedded local Ray, set before `ray` is first imported.

Ray reads some of these when it is imported, not when `ray.init` runs, so every module that
imports Ray for the engine imports this first (`actors/__init__.py` does), and `start_ray`
refuses to start a local Ray when `ray` came first (it would bind to the host's address).

The embedded instance is closed twice over: its servers bind to 127.0.0.1 only
(`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0` keeps Ray from replacing the loopback node address with
the host's), and Ray's token authentication is on (`RAY_AUTH_MODE=token`; `start_ray` gives it a
token file of its own, mode 0600), so that neither another host nor another local user can
call into it. When joining a cluster (`OPENBOT_RAY_ADDRESS` or `RAY_ADDRESS` set) nothing is
changed: a real cluster keeps its own addresses and auth (README "Running on a cluster"). In
Ray's own worker processes `ray` is already imported and their environment came from the
driver, so nothing is changed there either.
"""

from __future__ import annotations

import os
import sys

# Ray's documented switch for multi-node clusters on Windows and macOS (set to 1 there to allow
# them). Off, Ray keeps a node's address on loopback instead of looking up the host's, on Linux
# too (docs/design.md §14). Ray reads it once, when `ray` is imported.
CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

# Ray's setting for its workers' niceness (Ray's job manager sets it to 0 for the jobs it runs).
WORKER_NICENESS = "RAY_worker_niceness"

JOINING = bool(os.environ.get("OPENBOT_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS"))
EMBEDDED = not JOINING and "ray" not in sys.modules

if EMBEDDED:
    os.environ[CLUSTER_SWITCH] = "0"
    os.environ["RAY_AUTH_MODE"] = "token"  # never `disabled`, whatever the caller's shell says
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray starts its workers at nice 15, so that a driver keeps the CPU from its tasks. Here the
    # workers are the shards, the database of the gateway in front of them: niced, any other
    # busy process on the machine starves every write. They run at the server's own priority.
    os.environ.setdefault(WORKER_NICENESS, "0")

# The switch as Ray read (or, not imported yet, will read) it: taken now, since a later change of
# the environment does not reach an imported Ray. Ray counts it on only as "true" or "1", and on
# when it is unset (Linux).
_SWITCH_AT_IMPORT = os.environ.get(CLUSTER_SWITCH)


def loopback_only() -> bool:
    """Whether a local Ray started by this process listens on loopback only and requires its
    token: the cluster switch was off when `ray` was imported, and token auth is on. False when
    `ray` was imported before this module with the host's defaults (it would bind beyond
    loopback). Public values only; no `ray._private` constant is read."""
    switch = _SWITCH_AT_IMPORT
    switch_off = switch is not None and switch.lower() not in ("true", "1")
    return switch_off and os.environ.get("RAY_AUTH_MODE") == "token"


TOKEN_FILE = "ray.token"  # beside master.key and admin.token in the data directory


def use_token_file(path: str | os.PathLike[str]) -> str:
    """Make `path` the embedded Ray's auth token (created once, 64 hex characters, mode 0600)
    for this process and the Ray processes it starts; returns the path. Never the shared
    `~/.ray/auth_token`: each data directory (and each test session) has a token of its own."""
    import secrets

    from engine.errors import InvalidInput

    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.chmod(path, 0o600)  # ours: whatever loosened it, only the owner reads it
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    with open(path) as f:
        if len(f.read().strip()) < 32:
            raise InvalidInput(
                f"{path} does not hold a Ray auth token (remove it to make one)",
                code="bad_ray_token",
            )
    os.environ["RAY_AUTH_TOKEN_PATH"] = path
    os.environ.pop("RAY_AUTH_TOKEN", None)  # would win over the file
    return path
