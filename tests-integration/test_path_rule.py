"""One rule for paths in both packages: the same mistake gives the same `ValueError` text.

Each package has its own path rule (neither imports the other); this holds them to one
wording through their public save and load functions, so a user who mixes the two packages
meets one rule: wrong kind, missing folder and missing file all name the argument and path.
"""

import equinox as eqx
import jax.numpy as jnp
import pytest

import confluent_bank as cb
import hybrid_kernels as hk


class _Rate(eqx.Module):
    k: jnp.ndarray


def _bank():
    return cb.init_confluent_bank([cb.RefinedPack(0, 0.0, 1.0)], max_packs=2, max_order=1)


SAVES = {
    "confluent_bank": lambda path: cb.save_checkpoint(path, _bank()),
    "hybrid_kernels": lambda path: hk.save_predictors(path, (_Rate(jnp.array(0.5)),)),
}
LOADS = {
    "confluent_bank": lambda path: cb.load_checkpoint(path),
    "hybrid_kernels": lambda path: hk.load_predictors(path, (_Rate(jnp.array(0.0)),)),
}


@pytest.mark.parametrize("package", sorted(SAVES))
def test_saving_onto_a_folder_names_the_path(package, tmp_path):
    with pytest.raises(ValueError) as info:
        SAVES[package](tmp_path)
    assert str(info.value) == f"path={str(tmp_path)!r} is a directory; expected a file"


@pytest.mark.parametrize("package", sorted(SAVES))
def test_saving_into_a_missing_folder_names_the_folder(package, tmp_path):
    target = tmp_path / "missing" / "out.file"
    with pytest.raises(ValueError) as info:
        SAVES[package](target)
    assert str(info.value) == (
        f"path={str(target)!r}: the folder {str(target.parent)!r} does not exist"
    )


@pytest.mark.parametrize("package", sorted(LOADS))
def test_loading_a_missing_file_names_the_path(package, tmp_path):
    target = tmp_path / "absent.file"
    with pytest.raises(ValueError) as info:
        LOADS[package](target)
    assert str(info.value) == f"path={str(target)!r} does not exist"


@pytest.mark.parametrize("package", sorted(LOADS))
def test_loading_a_folder_names_the_path(package, tmp_path):
    with pytest.raises(ValueError) as info:
        LOADS[package](tmp_path)
    assert str(info.value) == f"path={str(tmp_path)!r} is a directory; expected a file"
