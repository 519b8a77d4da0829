"""One error family for everything gpu-workbench refuses to do.

Every message names the file or the cause *and* the fix. The CLI prints ``str(err)`` on one line and
exits with code 2 for any :class:`WorkbenchError`; panels show it in their error area.
"""

from __future__ import annotations

__all__ = [
    "WorkbenchError",
    "BadArgument",
    "BadArtifact",
    "UnsafePickle",
    "MissingDependency",
    "NoDevice",
    "NoNVML",
]


class WorkbenchError(Exception):
    """Base class: a problem the user can fix, with a message that says how."""


class BadArgument(WorkbenchError, ValueError):
    """A caller's argument that cannot be used (an unknown option, a value out of range, the wrong
    kind of object). About a *file*, :class:`BadArtifact` is raised instead. A ``ValueError`` too, so
    ``except ValueError`` keeps working where plain ``ValueError`` used to be raised."""


class BadArtifact(WorkbenchError, ValueError):
    """A trace, snapshot or sample file that is missing, truncated, corrupt or of an unknown format."""

    def __init__(self, path, problem: str, fix: str | None = None):
        self.path = str(path)
        self.problem = problem
        self.fix = fix
        msg = f"{self.path}: {problem}"
        if fix:
            msg += f". {fix}"
        super().__init__(msg)


class UnsafePickle(BadArtifact):
    """A pickle that asks to build something other than the plain types a memory snapshot holds.

    Raised *before* anything in the file runs.
    """


class MissingDependency(WorkbenchError, ImportError):
    """An optional package is not installed; the message carries the pip command."""

    def __init__(self, package: str, purpose: str, extra: str | None = None):
        self.package = package
        self.purpose = purpose
        install = f"pip install 'gpu-workbench[{extra}]'" if extra else f"pip install {package}"
        super().__init__(f"{package} is needed {purpose} but is not installed; install it with: {install}")


class NoDevice(WorkbenchError, RuntimeError):
    """Live capture asked for a CUDA device and none is present."""


class NoNVML(WorkbenchError, RuntimeError):
    """The NVIDIA driver's NVML library could not be opened (no GPU, no driver, or a container without it)."""
