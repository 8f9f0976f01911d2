"""The package itself: version, public surface, independence from its sibling."""

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import hybrid_kernels
from hybrid_kernels.__about__ import __version__ as about_version

PACKAGE_DIR = Path(hybrid_kernels.__file__).parent
SIBLING = "confluent_bank"


def test_version_comes_from_about_and_is_semver():
    assert hybrid_kernels.__version__ == about_version
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", about_version)


def test_every_public_name_is_importable_from_the_root():
    assert len(set(hybrid_kernels.__all__)) == len(hybrid_kernels.__all__), (
        "duplicate names in __all__"
    )
    for name in hybrid_kernels.__all__:
        assert hasattr(hybrid_kernels, name), f"{name} is in __all__ but not importable"


def test_every_public_callable_and_class_has_a_docstring():
    undocumented = [
        name
        for name in hybrid_kernels.__all__
        if (
            inspect.isclass(getattr(hybrid_kernels, name))
            or inspect.isfunction(getattr(hybrid_kernels, name))
        )
        and not inspect.getdoc(getattr(hybrid_kernels, name))
    ]
    assert undocumented == []


def test_package_ships_py_typed_marker():
    assert (PACKAGE_DIR / "py.typed").is_file()


def test_importing_the_package_never_imports_its_sibling():
    code = f"import sys, hybrid_kernels; sys.exit(int('{SIBLING}' in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_no_module_source_mentions_the_sibling_package():
    offenders = [
        str(p.relative_to(PACKAGE_DIR))
        for p in PACKAGE_DIR.rglob("*.py")
        if re.search(rf"^\s*(from|import)\s+{SIBLING}\b", p.read_text(), re.MULTILINE)
    ]
    assert offenders == []


def test_submodules_import_cleanly():
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        if name.endswith("optax") or name.endswith("plotting"):
            continue  # optional extras, imported only by users who installed them
        importlib.import_module(name)
