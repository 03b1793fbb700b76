"""A package's re-exported names, imported on first use (PEP 562 module ``__getattr__``).

Why: the broker's processes are spawned interpreters, and a package ``__init__`` that imports its
heavy modules eagerly makes every import of one light module of the package pay for all of them
(the storage engine's numba kernels, pyarrow) — in processes that never run that code."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """``(__all__, __getattr__)`` for ``package``, whose name ``N`` is ``getattr(import_module(exports[N]), N)``."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return sorted(exports), __getattr__
