"""The models package's one error: a model (or the node serving it) did not answer usably."""

from __future__ import annotations

from engine.errors import Unavailable


class ModelError(Unavailable):
    code = "model_error"
