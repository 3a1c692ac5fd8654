"""Exceptions raised by opselect.

Where torch raises a RuntimeError for the same mistake, ours also derive from RuntimeError, so code
written against torch's behaviour keeps working, while the message names the argument at fault.
"""


class OpselectError(Exception):
    """Base class of every error opselect raises on purpose."""


class BackendError(OpselectError, ValueError):
    """An unknown backend name, or a forced backend that cannot take the call."""


class InvalidArgument(OpselectError, ValueError, RuntimeError):
    """A bad value for an argument (torch raises RuntimeError for most of these)."""


class UnsupportedDType(OpselectError, TypeError, RuntimeError):
    """A dtype the op does not accept (torch raises RuntimeError for these)."""


class NotImplementedDType(UnsupportedDType, NotImplementedError):
    """A dtype torch has no kernel of the op for (torch raises NotImplementedError: softmax of
    integers, isin of uint16 and float8, ...)."""


class TorchOnlyCall(OpselectError, NotImplementedError):
    """A call only torch's own op takes: a dtype opselect's kernels do not (quantized, uint16-64,
    float8, ...). ops.* catch it and hand the call to torch untouched, which answers it or raises
    its own error; it escapes only from code that prepares calls itself (warm, the CLI)."""


class DimError(OpselectError, IndexError):
    """A dim out of range for the input's rank (torch raises IndexError)."""


class ArgumentTypeError(OpselectError, TypeError):
    """An argument of the wrong Python type (torch raises TypeError)."""


class CacheWarning(UserWarning):
    """The tune cache could not be read or written; opselect carried on without it."""


class UsageError(OpselectError, ValueError):
    """A command-line mistake (a missing or malformed file, a bad flag value): the CLI prints one
    line naming the argument and exits 2."""


class CacheError(OpselectError, RuntimeError):
    """The tune cache could not do what a command asked (import into a cache that cannot be
    written, an export file that cannot be created): the CLI prints one line and exits 1. Calls
    of the ops never see it: on their path a broken cache is a warning and a fallback."""


class InconsistentChoices(OpselectError, AssertionError):
    """Ranks chose differently for the same call key (opselect.distributed.assert_consistent)."""


# Outcomes of one operation on the tune cache's sqlite file, raised and caught inside tune_cache/
# (a caller of the ops never sees them: each ends in a retry, a warning or a fallback).
class CacheBusy(Exception):
    """Another connection holds a lock we need, or the deadline passed: try again later."""


class CacheReadOnly(Exception):
    """The file cannot be written (permissions, a read-only mount)."""


class CacheUnusable(Exception):
    """Not a database, corrupt, or not ours: give up on the file for this process."""


class UntrustedPath(OpselectError):
    """A tune cache path or file that another user could have planted or can change (see
    tune_cache/trust.py): `path` is refused because of `reason`; `shareable` says whether
    OPSELECT_CACHE_TRUST_SHARED=1 would accept it (a loose owner or mode, not a link or a special
    file). The cache turns it into one warning; calls never see it."""

    def __init__(self, path, reason: str, *, shareable: bool):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason, self.shareable = path, reason, shareable


class NumberRefused(OpselectError, ValueError):
    """A number in untrusted JSON past the bounds Python converts (tune_cache/bounded_json.py)."""
