"""Both packages as packages: version, one public surface, independence from each other.

One parametrised test per property, run over both packages, so the two never drift apart.
"""

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

# package -> (its sibling, its deliberate public sub-namespaces)
PACKAGES = {
    "confluent_bank": ("hybrid_kernels", {"optax"}),
    "hybrid_kernels": ("confluent_bank", set()),
}
OPTIONAL = ("optax", "_row_warmup", "plotting")  # modules that need an optional extra


@pytest.fixture(params=sorted(PACKAGES))
def package(request):
    return importlib.import_module(request.param)


def _dir(package) -> Path:
    return Path(package.__file__).parent


def _modules(package) -> list[str]:
    names = []
    for path in sorted(_dir(package).rglob("*.py")):
        rel = path.relative_to(_dir(package).parent).with_suffix("")
        names.append(".".join(rel.parts).removesuffix(".__init__"))
    return names


def test_version_comes_from_about_and_is_semver(package):
    about = importlib.import_module(f"{package.__name__}.__about__")
    assert package.__version__ == about.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", about.__version__)


def test_every_public_name_is_exported_once_and_importable(package):
    assert len(set(package.__all__)) == len(package.__all__), "duplicate names in __all__"
    missing = [name for name in package.__all__ if not hasattr(package, name)]
    assert missing == []


def test_every_public_callable_and_class_has_a_docstring(package):
    undocumented = [
        name
        for name in package.__all__
        if (inspect.isclass(obj := getattr(package, name)) or inspect.isfunction(obj))
        and not inspect.getdoc(obj)
    ]
    assert undocumented == []


def test_implementation_modules_are_private(package):
    _, namespaces = PACKAGES[package.__name__]
    public = [
        name
        for name in _modules(package)
        if name != package.__name__
        and not name.endswith(".__about__")
        and name.split(".")[1] not in namespaces
        and not any(part.startswith("_") for part in name.split(".")[1:])
    ]
    assert public == []


def test_private_modules_list_no_name_the_root_does_not_export(package):
    _, namespaces = PACKAGES[package.__name__]
    stray = {}
    for name in _modules(package):
        if name == package.__name__ or name.split(".")[-1] in OPTIONAL:
            continue
        if len(name.split(".")) > 1 and name.split(".")[1] in namespaces:
            continue  # a deliberate sub-namespace has its own public list
        extra = set(getattr(importlib.import_module(name), "__all__", ())) - set(package.__all__)
        if extra:
            stray[name] = sorted(extra)
    assert stray == {}


def test_package_ships_py_typed_marker(package):
    assert (_dir(package) / "py.typed").is_file()


def test_importing_a_package_never_imports_its_sibling(package):
    sibling, _ = PACKAGES[package.__name__]
    code = f"import sys, {package.__name__}; sys.exit(int('{sibling}' in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_no_module_source_imports_the_sibling_package(package):
    sibling, _ = PACKAGES[package.__name__]
    offenders = [
        str(p.relative_to(_dir(package)))
        for p in _dir(package).rglob("*.py")
        if re.search(rf"^\s*(from|import)\s+{sibling}\b", p.read_text(), re.MULTILINE)
    ]
    assert offenders == []


def test_every_module_imports_cleanly(package):
    for name in _modules(package):
        if name.split(".")[-1] not in OPTIONAL:
            importlib.import_module(name)
