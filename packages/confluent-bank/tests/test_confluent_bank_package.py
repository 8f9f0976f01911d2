"""The package itself: version, public surface, independence from its sibling."""

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import confluent_bank
from confluent_bank.__about__ import __version__ as about_version

PACKAGE_DIR = Path(confluent_bank.__file__).parent
SIBLING = "hybrid_kernels"
API_PAGE = PACKAGE_DIR.parents[3] / "docs" / "confluent-bank" / "api.md"
PUBLIC_MODULES = {"__init__.py", "__about__.py", "optax.py"}


def test_version_comes_from_about_and_is_semver():
    assert confluent_bank.__version__ == about_version
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", about_version)


def test_every_public_name_is_importable_from_the_root():
    assert len(set(confluent_bank.__all__)) == len(confluent_bank.__all__), (
        "duplicate names in __all__"
    )
    for name in confluent_bank.__all__:
        assert hasattr(confluent_bank, name), f"{name} is in __all__ but not importable"


def test_implementation_modules_are_private():
    public = {p.name for p in PACKAGE_DIR.glob("*.py") if not p.name.startswith("_")}
    assert public | {"__init__.py", "__about__.py"} == PUBLIC_MODULES


def test_only_the_public_modules_define_all():
    # The root (and the optax sub-namespace) are the one list of public names.
    offenders = [
        p.name
        for p in PACKAGE_DIR.glob("*.py")
        if p.name not in PUBLIC_MODULES and re.search(r"^__all__\b", p.read_text(), re.M)
    ]
    assert offenders == []


def test_the_api_page_documents_every_public_name_once():
    if not API_PAGE.is_file():
        pytest.skip("the docs are not beside this installed copy")
    listed = re.findall(r"^::: confluent_bank\.(\w+)$", API_PAGE.read_text(), re.M)
    expected = sorted((set(confluent_bank.__all__) - {"__version__"}) | {"optax"})
    assert sorted(listed) == expected


def test_every_public_callable_and_class_has_a_docstring():
    undocumented = [
        name
        for name in confluent_bank.__all__
        if (
            inspect.isclass(getattr(confluent_bank, name))
            or inspect.isfunction(getattr(confluent_bank, name))
        )
        and not inspect.getdoc(getattr(confluent_bank, name))
    ]
    assert undocumented == []


def test_package_ships_py_typed_marker():
    assert (PACKAGE_DIR / "py.typed").is_file()


def test_importing_the_package_never_imports_its_sibling():
    code = f"import sys, confluent_bank; sys.exit(int('{SIBLING}' in sys.modules))"
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
        if name.endswith(("optax", "_row_warmup", "plotting")):
            continue  # optional extras, imported only by users who installed them
        importlib.import_module(name)
