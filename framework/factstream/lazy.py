"""Names a package offers without importing them up front (PEP 562): ``factstream.caches`` and
``factstream.idgen`` keep their ``__init__`` cheap to import and still answer ``from factstream.idgen
import MultiWriterIdGenerator``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for ``table`` (name -> the submodule defining it):
    a name is imported from its submodule at first use and kept in the package's namespace."""
    namespace = vars(importlib.import_module(package))

    def getattr_(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value  # the next access does not come here
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *table})

    return getattr_, dir_
