"""`nox -s gpu`'s helper (.ci/gpu_report.py): it fails at once off a GPU, and its report."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "gpu_report.py"
FAKE_SMI = "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0)'\n"


def load(path: Path = SCRIPT):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(args, path_dir, **env):
    # PATH holds only `path_dir`: whether `nvidia-smi` is there is up to the test.
    full_env = {**os.environ, "PATH": str(path_dir), **env}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=full_env
    )


@pytest.fixture
def fake_gpu(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    return tmp_path


def test_check_fails_at_once_with_a_clear_message_off_a_gpu(tmp_path):
    out = run_script(["check"], tmp_path)
    assert out.returncode == 2
    assert "nox -s gpu needs an NVIDIA GPU" in out.stderr


def test_run_fails_before_running_any_step_off_a_gpu(tmp_path):
    out = run_script(["run", "--out", str(tmp_path / "report")], tmp_path)
    assert out.returncode == 2
    assert "needs an NVIDIA GPU" in out.stderr
    assert not (tmp_path / "report").exists()


def test_check_passes_when_nvidia_smi_lists_a_gpu(fake_gpu):
    out = run_script(["check"], fake_gpu)
    assert out.returncode == 0, out.stderr
    assert "NVIDIA H200" in out.stdout


def test_check_fails_when_jax_sees_no_gpu(fake_gpu):
    out = run_script(["check", "--jax"], fake_gpu, JAX_PLATFORMS="cpu")
    assert out.returncode == 2
    assert "jax sees no GPU" in out.stderr


def step(name, passed):
    return {"name": name, "passed": passed, "returncode": 0 if passed else 1, "seconds": 1.0}


BENCH_ROWS = [
    {"model": "logistic", "workload": "sensitivity", "variant": "ours auto", "modes": ["forward"]},
    {"model": "logistic", "workload": "sensitivity", "variant": "floor recursive", "modes": []},
    {"model": "bank", "workload": "sensitivity", "variant": "ours auto", "modes": ["reverse"]},
]


def test_report_is_one_json_file_with_steps_device_and_what_auto_chose(tmp_path):
    gpu_report = load()
    report = gpu_report.build_report(
        [step("demo", True)],
        device={"nvidia_smi": ["GPU 0"]},
        agreement=[{"model": "logistic", "grad_rel_diff": 1e-6}],
        benchmark=BENCH_ROWS,
    )
    path = gpu_report.write_report(report, tmp_path / "gpu-report")
    assert path == tmp_path / "gpu-report" / "report.json"
    assert sorted(p.name for p in path.parent.iterdir()) == ["report.json"]
    loaded = json.loads(path.read_text())
    assert loaded["passed"] is True
    assert loaded["auto_chose"] == {"logistic": ["forward"], "bank": ["reverse"]}
    assert loaded["device"] == {"nvidia_smi": ["GPU 0"]}
    assert loaded["cpu_gpu_agreement"][0]["grad_rel_diff"] == 1e-6


def test_report_fails_when_any_step_fails():
    gpu_report = load()
    report = gpu_report.build_report(
        [step("tests", True), step("benchmark", False)], device={}, benchmark=None
    )
    assert report["passed"] is False
    assert report["auto_chose"] == {}


def test_a_test_step_that_collects_nothing_counts_as_passed(tmp_path):
    gpu_report = load()
    record = gpu_report.run_step("empty", [sys.executable, "-m", "pytest", str(tmp_path), "-q"])
    assert record["returncode"] == 5
    assert record["passed"] and record["no_tests_collected"]


def test_a_step_past_its_limit_is_killed_and_recorded_with_what_it_printed():
    gpu_report = load()
    code = "import time; print('started', flush=True); time.sleep(60)"
    record = gpu_report.run_step("hangs", [sys.executable, "-c", code], limit=2)
    assert record["returncode"] == gpu_report.TIMED_OUT and record["timed_out"]
    assert not record["passed"]
    assert "started" in record["output_tail"] and "killed after 2 s" in record["output_tail"]
    assert record["seconds"] < 30


def test_lease_plan_runs_from_source_and_fits_a_fifteen_minute_lease(tmp_path):
    gpu_report = load()
    plan = gpu_report.lease_plan(tmp_path)
    root = SCRIPT.parents[1]
    for name, cmd, env, limit in plan:
        assert limit is not None, f"{name} has no time limit"
        assert str(root / "packages" / "hybrid-kernels" / "src") in env["PYTHONPATH"]
        # Every file a step names exists, so a rename cannot waste a lease.
        for arg in cmd[1:]:
            if arg.endswith(".py"):
                assert (root / arg).is_file(), f"{name}: {arg} is missing"
    # Starting a machine takes minutes of the 15: the steps must leave room for it.
    assert sum(limit for *_, limit in plan) <= 12 * 60


def test_a_report_never_carries_an_earlier_runs_numbers(tmp_path, monkeypatch):
    gpu_report = load()
    (tmp_path / "benchmark.json").write_text(json.dumps(BENCH_ROWS))
    (tmp_path / "agreement.json").write_text("[]")
    code = "print('agreement ran')"
    monkeypatch.setattr(
        gpu_report, "lease_plan", lambda out: [("only", [sys.executable, "-c", code], {}, 60)]
    )
    assert gpu_report.run(tmp_path, lease=True) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["benchmark"] == [] and report["cpu_gpu_agreement"] is None
    assert [s["name"] for s in report["steps"]] == ["only"]


def test_integration_tests_run_under_a_pytest_without_xdist():
    # The lease plan runs tests-integration/test_gpu.py with whatever pytest the GPU image has.
    root = SCRIPT.parents[1]
    target = str(root / "tests-integration" / "test_path_rule.py")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", target],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


@pytest.fixture(scope="module")
def kernels_benchmark():
    return load(SCRIPT.parents[1] / "benchmarks" / "kernels.py")


def test_quick_benchmark_keeps_the_parts_and_models_it_is_given(kernels_benchmark):
    # `nox -s gpu -- --quick` passes --parts sensitivity with --quick: the quick defaults must
    # not replace it, or the GPU report would time the wrong measurements.
    args = kernels_benchmark.parse_args(["--quick", "--parts", "sensitivity", "--models", "bank"])
    assert (args.parts, args.models, args.n_experiments) == (["sensitivity"], ["bank"], 4)


def test_quick_benchmark_fills_in_its_small_problem_where_nothing_is_named(kernels_benchmark):
    quick, default = kernels_benchmark.parse_args(["--quick"]), kernels_benchmark.parse_args([])
    assert quick.parts == kernels_benchmark.QUICK["parts"]
    assert default.parts == list(kernels_benchmark.PARTS)
