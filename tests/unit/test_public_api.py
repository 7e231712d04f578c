"""Every public module states its public names in ``__all__``; ``core`` states its public subset."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil

import pytest

import airflow_provider_shardyfusion as pkg


def public_modules() -> list[str]:
    """Every module of the package whose own name has no leading underscore (subpackages' ``__init__``
    only hold a docstring and are left out; the package's and core's are in)."""
    names = [pkg.__name__, f"{pkg.__name__}.core"]
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if not info.ispkg and not info.name.rsplit(".", 1)[1].startswith("_"):
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", public_modules())
def test_each_public_module_lists_what_it_defines_in_all(name):
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list) and exported, f"{name}: no __all__"
    assert len(set(exported)) == len(exported), f"{name}: a name appears twice in __all__"
    missing = [n for n in exported if not hasattr(module, n) and importlib.util.find_spec(f"{name}.{n}") is None]
    assert not missing, f"{name}: __all__ names what the module does not have: {missing}"
    assert not [n for n in exported if n.startswith("_") and n != "__version__"], name
    defined = [n for n, obj in vars(module).items()
               if not n.startswith("_") and (inspect.isclass(obj) or inspect.isfunction(obj))
               and getattr(obj, "__module__", None) == name]
    unlisted = sorted(set(defined) - set(exported))
    assert not unlisted, f"{name}: public classes/functions missing from __all__ (or make them private): {unlisted}"


def test_core_states_its_public_subset():
    """``core.__all__`` names the rooms holding the public modules; its docstring names each module."""
    import re

    core = importlib.import_module(f"{pkg.__name__}.core")
    subset = (core.__doc__ or "").partition("The public subset")[2]
    public = re.findall(r"^\* ``core\.([\w.]+)``: ", subset, flags=re.M)
    assert sorted(public) == ["errors", "model.config", "model.encoding", "read.async_reader", "read.reader"], public
    for sub in public:
        importlib.import_module(f"{core.__name__}.{sub}")
    assert sorted(core.__all__) == sorted({sub.split(".")[0] for sub in public})
