"""Smoke test of examples/fed_batch.py: reads its shipped CSVs, trains both models a few steps,
predicts the held-out runs and writes the plot and the error table.

Compiling the two reactor models dominates (minutes on a shared 2-core CPU), hence `slow`.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")

import fed_batch  # examples/ is on sys.path, see conftest.py


@pytest.mark.slow
def test_fed_batch_example_runs_end_to_end_on_its_shipped_data(tmp_path):
    result = fed_batch.main(steps=2, out=tmp_path, verbose=False)
    errors = result["errors"]
    assert set(errors.model) == {"MLP", "confluent bank"}
    assert set(errors.experiment) == set(fed_batch.HELD_OUT)
    assert (tmp_path / "fed_batch_rate.png").stat().st_size > 0
    assert (tmp_path / "fed_batch_heldout.csv").exists()
    assert all(info["compile_s"] > 0 for info in result["infos"])


def test_the_shipped_table_has_missing_cells_replicates_and_feed_steps():
    pd = pytest.importorskip("pandas")
    obs = pd.read_csv(fed_batch.HERE / "fed_batch.csv")
    feeds = pd.read_csv(fed_batch.HERE / "fed_batch_feeds.csv")
    assert obs.value.isna().any()
    assert obs.duplicated(["experiment", "time", "variable"]).any()
    assert (feeds.groupby("experiment").size() > 1).all()
    assert obs.experiment.nunique() == fed_batch.N_EXPERIMENTS
