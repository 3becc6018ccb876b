"""Ray actors: thin shells that hold state and locks and call engine/ and storage/."""

from actors.runtime import ray_env  # noqa: F401  (Ray's environment, before anything imports ray)
