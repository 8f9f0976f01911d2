"""`rich_metrics_table`: compute_metrics as a Rich table."""

import math

import pytest
from rich.console import Console

import hybrid_kernels as hk


def render(table):
    console = Console(width=100, record=True, color_system=None)
    console.print(table)
    return console.export_text()


METRICS = {
    "y": hk.ChannelMetrics("y", 12, 0.25, 0.5, 0.4, 0.9),
    "z": hk.ChannelMetrics("z", 0, math.nan, math.nan, math.nan, math.nan),
}


def test_rich_metrics_table_has_one_row_per_channel_with_every_statistic():
    table = hk.rich_metrics_table(METRICS)
    assert table.row_count == 2
    assert [c.header for c in table.columns] == ["channel", "n", "MSE", "RMSE", "MAE", "R²"]
    line = next(line for line in render(table).splitlines() if line.strip("│ ").startswith("y"))
    assert all(cell in line for cell in ("12", "0.25", "0.5", "0.4", "0.9"))


def test_rich_metrics_table_shows_nan_as_a_dash():
    line = next(
        line for line in render(hk.rich_metrics_table(METRICS)).splitlines() if "│ z" in line
    )
    assert line.count("-") == 4 and "nan" not in line


def test_rich_metrics_table_has_the_given_title():
    assert hk.rich_metrics_table(METRICS, title="fit").title == "fit"


def test_rich_metrics_table_rejects_values_that_are_not_channel_metrics():
    with pytest.raises(TypeError, match=r"metrics\['y'\] must be a ChannelMetrics"):
        hk.rich_metrics_table({"y": {"mse": 1.0}})
