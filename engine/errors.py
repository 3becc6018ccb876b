"""The one exception tree of OpenBot Engine.

    OpenBotError                 root; every error the engine raises on purpose
    ├── InvalidInput             the request is malformed or breaks a rule (tag grammar, fields)
    ├── Unauthenticated          no credentials, or credentials nobody issued
    ├── Forbidden                the caller is known but may not do this
    ├── NotFound                 the thing named does not exist (or may not be known to the caller)
    ├── Conflict                 the request contradicts current state (stale version, not yours)
    ├── Unprocessable            well-formed but outside what the engine does (too many rounds)
    │   └── OutOfRange           a number outside its field's bounds; `details.field` names it
    ├── TooLarge                 a body or field over its limit
    ├── RateLimited              too many requests or over budget
    └── Unavailable              a dependency is down or overloaded; retrying later may work
        └── StorageError         the storage layer failed (converted from duckdb/cryptography)

Library errors are converted at the layer that calls the library (`raise … from e`). HTTP status
codes and websocket close codes are assigned only in gateway/.
"""

from __future__ import annotations


class OpenBotError(Exception):
    """Root of all deliberate errors. `code` is a stable machine-readable string."""

    code = "error"

    def __init__(
        self, message: str, *, code: str | None = None, details: dict | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        # Extra fields of the error body, e.g. a conflict's `currentRevision` (WA-2).
        self.details = details or {}
        if code is not None:
            self.code = code

    def __reduce__(self):  # keeps `code` and `details` across Ray's pickling of exceptions
        return (_rebuild, (type(self), self.message, self.code, self.details))


def _rebuild(
    cls: type[OpenBotError], message: str, code: str, details: dict | None = None
) -> OpenBotError:
    return cls(message, code=code, details=details)


class InvalidInput(OpenBotError):
    code = "invalid_input"


class Unauthenticated(OpenBotError):
    code = "unauthenticated"


class Forbidden(OpenBotError):
    code = "forbidden"


class NotFound(OpenBotError):
    code = "not_found"


class Conflict(OpenBotError):
    code = "conflict"


class Unprocessable(OpenBotError):
    code = "unprocessable"


class OutOfRange(Unprocessable):
    code = "out_of_range"

    @classmethod
    def of(cls, field: str, message: str) -> OutOfRange:
        return cls(f"{field}: {message}", details={"field": field})


class TooLarge(OpenBotError):
    code = "too_large"


class RateLimited(OpenBotError):
    code = "rate_limited"


class Unavailable(OpenBotError):
    code = "unavailable"


class StorageError(Unavailable):
    code = "storage_error"
