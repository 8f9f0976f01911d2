"""Both packages installed side by side: they import together and stay independent."""

import subprocess
import sys

import confluent_bank
import hybrid_kernels


def test_both_packages_import_in_one_process():
    assert confluent_bank.__version__ and hybrid_kernels.__version__


def test_each_package_imports_without_loading_the_other():
    for mine, other in (("confluent_bank", "hybrid_kernels"), ("hybrid_kernels", "confluent_bank")):
        code = f"import sys, {mine}; sys.exit(int('{other}' in sys.modules))"
        assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0, mine
