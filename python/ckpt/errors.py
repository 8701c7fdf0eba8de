"""ckpt's exceptions: one class per absl::StatusCode the C++ library returns.

Every error raised by the extension is a ``ckpt.Error`` whose message is the C++ status
message unchanged (it names the tensor, rank, host, file or caller). The subclasses also derive
from the closest built-in exception, so ``except TimeoutError`` or ``except KeyError`` style
handlers keep working. What the codes mean for retrying (docs/ARCHITECTURE.md):
``Unavailable``: retry the call; ``Aborted``: retry the job; ``FailedPrecondition`` /
``InvalidArgument``: do not retry; ``DataLoss``: the checkpoint is corrupt.
"""


class Error(Exception):
    """Base of every ckpt error; ``code`` is the absl::StatusCode name."""

    code = "UNKNOWN"

    def __init__(self, message="", key=None):
        super().__init__(message)
        self.message = message
        #: The state-dict key the error is about, where there is one (ckpt.torch).
        self.key = key


class Cancelled(Error):
    code = "CANCELLED"


class Unknown(Error):
    code = "UNKNOWN"


class InvalidArgument(Error, ValueError):
    code = "INVALID_ARGUMENT"


class DeadlineExceeded(Error, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class NotFound(Error, LookupError):
    code = "NOT_FOUND"


class AlreadyExists(Error, FileExistsError):
    code = "ALREADY_EXISTS"


class PermissionDenied(Error, PermissionError):
    code = "PERMISSION_DENIED"


class ResourceExhausted(Error, MemoryError):
    code = "RESOURCE_EXHAUSTED"


class FailedPrecondition(Error):
    code = "FAILED_PRECONDITION"


class Aborted(Error):
    code = "ABORTED"


class OutOfRange(Error, IndexError):
    code = "OUT_OF_RANGE"


class Unimplemented(Error, NotImplementedError):
    code = "UNIMPLEMENTED"


class Internal(Error):
    code = "INTERNAL"


class Unavailable(Error, ConnectionError):
    code = "UNAVAILABLE"


class DataLoss(Error):
    code = "DATA_LOSS"


class Unauthenticated(Error, PermissionError):
    code = "UNAUTHENTICATED"


#: absl::StatusCode value -> class (the extension raises through this table).
BY_CODE = {
    1: Cancelled,
    2: Unknown,
    3: InvalidArgument,
    4: DeadlineExceeded,
    5: NotFound,
    6: AlreadyExists,
    7: PermissionDenied,
    8: ResourceExhausted,
    9: FailedPrecondition,
    10: Aborted,
    11: OutOfRange,
    12: Unimplemented,
    13: Internal,
    14: Unavailable,
    15: DataLoss,
    16: Unauthenticated,
}

__all__ = [c.__name__ for c in BY_CODE.values()] + ["Error"]
