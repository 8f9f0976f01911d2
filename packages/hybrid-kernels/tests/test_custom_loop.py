"""The "Build your own loop" example: a hand-written loop over the kernels recovers omega."""

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "custom_loop.py"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "hybrid-kernels" / "custom-loop.md"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("custom_loop_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_custom_loop_recovers_omega_within_one_percent_in_at_most_300_steps(example):
    summary = example.main(n_experiments=4, n_steps=150, max_shapes=1, verbose=False)
    assert summary["steps"] <= 300
    assert summary["relative_error"] < 0.01, summary
    assert summary["final_loss"] < 2e-3  # noise variance is 4e-4: the fit reaches the noise


def test_docs_page_includes_the_example_file_itself():
    # The page pulls the example in with a snippet include, so the two cannot drift apart.
    page = DOCS.read_text()
    assert '--8<-- "examples/custom_loop.py"' in page
    assert EXAMPLE.is_file()
