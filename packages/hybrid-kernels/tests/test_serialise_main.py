"""Predictors whose class was defined in a script (`__main__`) load from a module (issue 23).

The file records the class as `__main__.Name`; a template from a module that defines the same
class matches it by name, with a warning that names both. Nothing prints a mangled name.
"""

import re
import subprocess
import sys
import textwrap

import equinox as eqx
import jax.numpy as jnp
import numpy as np
import pytest

import hybrid_kernels._serialise as serialise
from hybrid_kernels import load_predictors

CLASS = """
import equinox as eqx
import jax.numpy as jnp


class {name}(eqx.Module):
    w: jnp.ndarray
    width: int = eqx.field(static=True, default=3)
"""

SCRIPT = """
import sys
import numpy as np
import hybrid_kernels as hk
{cls}
hk.save_predictors(sys.argv[1], {{"h": MLPh(np.arange(3.0, dtype=np.float32))}})
"""


@pytest.fixture(scope="module")
def saved_from_a_script(tmp_path_factory):
    folder = tmp_path_factory.mktemp("script")
    script = folder / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(cls=CLASS.format(name="MLPh"))))
    path = folder / "h.eqx"
    subprocess.run([sys.executable, str(script), str(path)], check=True, cwd=folder)
    (folder / "mymodel_i23.py").write_text(CLASS.format(name="MLPh") + CLASS.format(name="Other"))
    sys.path.insert(0, str(folder))
    import mymodel_i23

    yield path, mymodel_i23
    sys.path.remove(str(folder))


def test_a_class_saved_from_main_loads_from_a_module_with_a_warning(saved_from_a_script):
    path, mymodel = saved_from_a_script
    template = {"h": mymodel.MLPh(jnp.zeros(3, jnp.float32))}
    with pytest.warns(UserWarning, match=r"holds __main__\.MLPh at .*has mymodel_i23\.MLPh"):
        loaded = load_predictors(path, template)
    np.testing.assert_array_equal(loaded["h"].w, [0.0, 1.0, 2.0])


def test_the_script_class_warning_never_prints_a_mangled_name(saved_from_a_script):
    path, mymodel = saved_from_a_script
    with pytest.warns(UserWarning) as record:
        load_predictors(path, {"h": mymodel.MLPh(jnp.zeros(3, jnp.float32))})
    assert not re.search(r"(?<!_)main__", str(record[0].message))


def test_a_different_class_name_from_main_is_refused_naming_what_was_saved(saved_from_a_script):
    path, mymodel = saved_from_a_script
    with pytest.raises(ValueError, match=r"holds __main__\.MLPh .*class named MLPh"):
        load_predictors(path, {"h": mymodel.Other(jnp.zeros(3, jnp.float32))})


def test_a_script_class_with_other_static_fields_is_still_refused(saved_from_a_script):
    path, mymodel = saved_from_a_script
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="width is 4 in the template"):
        load_predictors(path, {"h": mymodel.MLPh(jnp.zeros(3, jnp.float32), width=4)})


def test_class_paths_keep_dunder_module_names():
    class Local(eqx.Module):
        pass

    Local.__module__ = "__main__"
    assert serialise._class_path(Local).startswith("__main__.")


def test_files_written_with_the_old_mangled_name_read_as_main():
    assert serialise._saved_class("main__.MLPh") == "__main__.MLPh"
    assert serialise._saved_class("hybrid_kernels.bounded.X") == "hybrid_kernels.bounded.X"
