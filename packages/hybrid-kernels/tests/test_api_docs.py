"""The API page documents exactly the public surface, each name once."""

import re
from pathlib import Path

import hybrid_kernels as hk

API_PAGE = Path(__file__).resolve().parents[3] / "docs" / "hybrid-kernels" / "api.md"


def test_every_public_name_is_documented_once_on_the_api_page():
    documented = re.findall(r"^::: hybrid_kernels\.(\w+)$", API_PAGE.read_text(), re.MULTILINE)
    assert sorted(documented) == sorted(n for n in hk.__all__ if n != "__version__")
