"""The restricted unpickler for CUDA allocator snapshots: plain containers only, nothing callable.

A snapshot (``torch.cuda.memory._snapshot()`` pickled) is someone else's pickle: a plain
:func:`pickle.load` would run whatever the file asks for. :class:`SnapshotUnpickler` admits only the
plain containers a snapshot is made of and refuses every other global *before* anything from the file
is called, raising :class:`~workbench.errors.UnsafePickle`. Real snapshots (torch 2.x, checked on the
shipped H200 files) contain no globals at all; ``collections.OrderedDict``, ``set`` and ``frozenset``
are admitted because older pickling code and protocols 0-3 spell plain containers that way.
"""

from __future__ import annotations

import os
import pickle

from workbench.errors import UnsafePickle

__all__ = ["SnapshotUnpickler"]

# (module, name) pairs a snapshot pickle may name. Calling any of them cannot run code from the file.
_ALLOWED_GLOBALS = frozenset(
    {
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("__builtin__", "set"),  # protocol 0-2 pickles written by Python 2
        ("__builtin__", "frozenset"),
    }
)

_FIX_UNSAFE = (
    "Nothing from the file was executed. A CUDA allocator snapshot holds only dicts, lists, strings and "
    "numbers; load this file only if you trust its author, and then with pickle directly"
)


class SnapshotUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that builds only plain containers.

    Every global the pickle names (opcodes GLOBAL, STACK_GLOBAL, INST, OBJ, EXT1/2/4 all go through
    :meth:`find_class`) is refused unless it is in a tiny allow-list of container types, and
    persistent ids are refused, so no callable from the file is ever reached.
    """

    def __init__(self, file, path: str | os.PathLike = "<bytes>"):
        super().__init__(file)
        self._path = str(path)

    def find_class(self, module: str, name: str):  # noqa: D102 - documented on the class
        if (module, name) in _ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafePickle(
            self._path,
            f"refused to load: the pickle asks for the global {module}.{name}, which an allocator "
            "snapshot never contains",
            _FIX_UNSAFE,
        )

    def persistent_load(self, pid):  # noqa: D102
        raise UnsafePickle(
            self._path,
            "refused to load: the pickle uses a persistent id, which an allocator snapshot never contains",
            _FIX_UNSAFE,
        )
