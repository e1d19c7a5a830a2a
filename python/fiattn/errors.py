"""Exceptions of fiattn.

Every fi_status the C library returns is raised as a :class:`FiattnError` (or a subclass)
whose ``status`` is the numeric fi_status, ``status_name`` its fi_status_name() and
``detail`` the plan's fi_error_detail (request index, needed / limit numbers) when there is
one.  The subclass is chosen from the status *name*, so statuses appended to the C enum
later still map (to plain FiattnError when the name is new).

Errors found in Python before any C call (wrong device, dtype, shape, a non-contiguous
last dimension) are the builtin TypeError / ValueError, raised before any buffer is
touched.
"""


class FiattnError(RuntimeError):
    """A fi_status other than FI_OK.  Attributes: status (int), status_name (str),
    detail (fi_error_detail or None)."""

    def __init__(self, message, status=None, status_name=None, detail=None):
        super().__init__(message)
        self.status = status
        self.status_name = status_name
        self.detail = detail


class FiattnValueError(FiattnError, ValueError):
    """The batch or the arguments broke a rule of the C API (lengths, page indices,
    shapes, strides, alignment, caps)."""


class WorkspaceTooSmallError(FiattnValueError):
    """FI_ERR_WORKSPACE_TOO_SMALL: workspace_buffer holds fewer bytes than
    fi_workspace_size() of the caps (the message says how many are needed)."""


class FiattnNotImplementedError(FiattnError, NotImplementedError):
    """The combination is valid for the reference API but fiattn has no executor for it
    yet (a kind without a GPU family, a dtype a family does not instantiate)."""


# Names that are not a caller's mistake: the runtime, the device, the library.
_RUNTIME = {"FI_ERR_CUDA", "FI_ERR_NO_DEVICE", "FI_ERR_OUT_OF_MEMORY", "FI_ERR_PLAN_OVER_CAPS",
            "FI_ERR_STREAM_CAPTURING", "FI_ERR_NOT_PLANNED", "FI_ERR_HOST_PLAN",
            "FI_ERR_PLAN_ON_DEVICE"}
_NOT_IMPLEMENTED = {"FI_ERR_UNSUPPORTED_KIND"}


def error_for_status(status, name, message, detail=None):
    """The exception instance for fi_status `status` named `name`."""
    if name == "FI_ERR_WORKSPACE_TOO_SMALL":
        cls = WorkspaceTooSmallError
    elif name in _NOT_IMPLEMENTED:
        cls = FiattnNotImplementedError
    elif name in _RUNTIME or not name.startswith("FI_ERR_") or name == "FI_STATUS_UNKNOWN":
        cls = FiattnError
    else:
        cls = FiattnValueError
    return cls(message, status=status, status_name=name, detail=detail)
