"""The names ``factstream.idgen`` and ``factstream.caches`` document are importable from the package,
imported at first use: the packages stay cheap to import, and their stubs give the same names types."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ("factstream.idgen", "factstream.caches")


@pytest.mark.parametrize("name", PACKAGES)
def test_every_documented_name_is_the_defining_modules_object(name):
    package = importlib.import_module(name)
    assert len(package.__all__) >= 5
    for attribute, module in package._LAZY.items():
        assert getattr(package, attribute) is getattr(importlib.import_module(f"{name}.{module}"), attribute)
        assert attribute in dir(package)
    with pytest.raises(AttributeError, match=f"module '{name}' has no attribute 'Nope'"):
        package.Nope  # noqa: B018


def test_the_names_users_import_from_the_packages_work():
    from factstream.caches import LruCache
    from factstream.idgen import MultiWriterIdGenerator, WriterLeases

    assert MultiWriterIdGenerator.__module__ == "factstream.idgen.generator"
    assert WriterLeases.__module__ == "factstream.idgen.leases"
    assert LruCache.__module__ == "factstream.caches.lru"


@pytest.mark.parametrize("name", PACKAGES)
def test_the_stub_names_exactly_the_lazy_names_from_their_modules(name):
    package = importlib.import_module(name)
    stub = Path(package.__file__).with_suffix(".pyi")
    imported = {
        alias.name: node.module
        for node in ast.parse(stub.read_text()).body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == {attribute: f"{name}.{module}" for attribute, module in package._LAZY.items()}


def test_importing_the_packages_loads_nothing_that_import_factstream_does_not():
    code = (
        "import sys, factstream\n"
        "before = set(sys.modules)\n"
        "import factstream.idgen, factstream.caches\n"
        "print(sorted(set(sys.modules) - before), 'factstream.idgen.generator' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[] False"
