"""Smoke test of examples/population_pk.py: reads its shipped NONMEM-style CSV, trains both
models a few steps, predicts the held-out subjects and writes the plots and the IPRED table;
and its bank, over enough steps to grow, grows and fits better than without its hook.

Compiling the models dominates (about 45 s each on a 2-core CPU), hence `slow`.
"""

from __future__ import annotations

import numpy as np
import pytest

import confluent_bank as cb

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

import population_pk  # examples/ is on sys.path, see conftest.py


@pytest.mark.slow
def test_population_pk_example_runs_end_to_end_on_its_shipped_data(tmp_path):
    result = population_pk.main(steps=2, out=tmp_path, verbose=False)
    table = result["table"]
    assert set(table.model) == {"MLP", "bank"}
    assert set(table.ID) == {str(i) for i in population_pk.HELD_OUT}
    assert {"IPRED", "IRES"} <= set(table.columns)
    for name in ("population_pk_elimination.png", "population_pk_fit.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert (tmp_path / "population_pk_heldout.csv").exists()


def test_the_shipped_table_has_dv_zero_dose_rows_boluses_and_joined_infusions():
    pd = pytest.importorskip("pandas")
    table = pd.read_csv(population_pk.HERE / "population_pk.csv")
    doses = table[table.EVID == 1]
    assert (doses.DV == 0).all()
    assert (doses.RATE == 0).any() and (doses.RATE > 0).any()
    assert table.ID.nunique() == population_pk.N_SUBJECTS
    experiments = population_pk.read(table)
    assert [e.channels["C"].ts.size for e in experiments] == [len(population_pk.SAMPLES)] * 12


@pytest.mark.slow
def test_the_examples_bank_grows_where_it_helps_and_fits_better_than_without(monkeypatch):
    # 120 steps: training first plateaus, and the hook first births, at step 100.
    train, _ = population_pk.load()
    build = population_pk.growing_hook
    built = []

    def recorded(*args):
        built.append(build(*args))
        return built[-1]

    monkeypatch.setattr(population_pk, "growing_hook", recorded)
    grown, grown_loss = population_pk.fit(population_pk.bank_elimination(), train, 120, 0.02)
    monkeypatch.setattr(population_pk, "growing_hook", lambda *args: None)
    fixed, fixed_loss = population_pk.fit(population_pk.bank_elimination(), train, 120, 0.02)

    births = [e for e in built[0].events if e.kind == "zero_output_birth" and e.accepted]
    assert births and all(e.score > 0 for e in births)
    assert int(np.sum(np.asarray(grown.active))) > int(np.sum(np.asarray(fixed.active))) == 2
    assert isinstance(grown, cb.ConfluentPackBank)
    assert grown.max_pairs == 0  # grown by births and moment merges: no pair code compiled
    assert grown_loss < 0.5 * fixed_loss
