"""The accelerator check behind ``nox -s gpu``: GPU probe, the steps, one JSON report.

    python .ci/gpu_report.py check            # stdlib only: is an NVIDIA GPU there? (exit 2 if not)
    python .ci/gpu_report.py check --jax      # does the installed jax see it?
    python .ci/gpu_report.py run --out gpu-report [--quick]
    python .ci/gpu_report.py run --out gpu-report --lease

``run`` (inside the nox venv, with ``jax[cuda12]`` and both packages installed) runs, in order:
the ``gpu``-marked tests of both packages, the integration suite, the scaled-up demo, a CPU
against GPU agreement check of the kernels in both sensitivity modes, and the kernel benchmark
on the GPU with ``--sensitivities forward reverse auto``.

``run --lease`` is the short plan for a lent machine with about 15 minutes and no package
index, whose Python already has jax with its CUDA plugin, diffrax, equinox, optax and pytest:
both packages run from source (``PYTHONPATH``), and the steps, most telling first, are the CPU
against GPU agreement, the sensitivity tests and the gpu-marked end-to-end problem, the small
benchmarks, then the bank's numerical tests on the GPU; each has a time limit so that a slow
one cannot starve the rest (about 8 minutes in all).

Every step runs even when an earlier one fails; each one's command, exit status, time and
output tail go into ``gpu-report/report.json``, with the device, the agreement numbers, the
benchmark rows and the mode ``"auto"`` chose per model. The exit status is non-zero when any
step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = 2  # exit status of a failed probe, distinct from a failed step (1)
PYTEST_NO_TESTS = 5
TAIL = 4000  # characters of each step's output kept in the report
# What the agreement and benchmark steps write into the report folder; the report reads them.
AGREEMENT, BENCHMARK = "agreement.json", "benchmark.json"
TIMED_OUT = 124  # a step's exit status when it ran past its limit, as `timeout(1)` reports it


def probe_nvidia() -> list[str]:
    """The GPUs `nvidia-smi -L` lists (empty when it is missing, fails or lists none)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]


def probe_jax() -> list[str]:
    """The GPU devices the installed jax sees (empty when none)."""
    import jax

    try:
        return [str(d) for d in jax.devices("gpu")]
    except RuntimeError:
        return []


def check(*, with_jax: bool) -> int:
    """Exit status 0 when a GPU is there, else `NO_GPU` with a message saying what is missing."""
    gpus = probe_nvidia()
    if not gpus:
        print(
            "nox -s gpu needs an NVIDIA GPU: `nvidia-smi -L` is missing or lists no GPU on this "
            "machine. Run it on a CUDA machine (the CUDA CI job does); on a CPU use "
            "`nox -s tests integration bench` instead.",
            file=sys.stderr,
        )
        return NO_GPU
    if with_jax:
        devices = probe_jax()
        if not devices:
            print(
                f"nox -s gpu: nvidia-smi lists {gpus} but jax sees no GPU "
                "(jax.devices('gpu') is empty): check that jax[cuda12] installed and that "
                "JAX_PLATFORMS does not exclude cuda.",
                file=sys.stderr,
            )
            return NO_GPU
        print(f"GPU: {gpus}; jax devices: {devices}")
    else:
        print(f"GPU: {gpus}")
    return 0


def run_step(
    name: str,
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    limit: float | None = None,
) -> dict[str, Any]:
    """Run one step, at most `limit` seconds, echo its output and return its record."""
    print(f"\n=== gpu: {name}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            capture_output=True,
            text=True,
            timeout=limit,
        )
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        # What the killed step had written still goes into the report (bytes, whatever `text`).
        returncode = TIMED_OUT
        stdout, stderr = (_text(e.stdout), _text(e.stderr) + f"\ngpu: killed after {limit} s")
    seconds = time.perf_counter() - start
    sys.stdout.write(stdout)
    sys.stderr.write(stderr)
    sys.stdout.flush()
    output = stdout + stderr
    # pytest's 5 is "no tests collected": a package without gpu-marked tests has nothing to run.
    nothing = returncode == PYTEST_NO_TESTS and cmd[1:3] == ["-m", "pytest"]
    return {
        "name": name,
        "command": cmd,
        "returncode": returncode,
        "passed": returncode == 0 or nothing,
        "no_tests_collected": nothing,
        "timed_out": returncode == TIMED_OUT,
        "seconds": round(seconds, 2),
        "output_tail": output[-TAIL:],
    }


def _text(captured: bytes | str | None) -> str:
    if isinstance(captured, bytes):
        return captured.decode(errors="replace")
    return captured or ""


def auto_choices(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """What `"auto"` chose per benchmark model, from the benchmark's JSON rows."""
    return {
        r["model"]: r["modes"]
        for r in rows
        if r.get("workload") == "sensitivity" and r.get("variant") == "ours auto"
    }


def build_report(
    steps: list[dict[str, Any]],
    *,
    device: dict[str, Any],
    agreement: Any = None,
    benchmark: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The report: pass/fail overall, the device, each step, agreement and benchmark numbers."""
    benchmark = benchmark or []
    return {
        "passed": all(s["passed"] for s in steps),
        "created_unix": int(time.time()),
        "device": device,
        "steps": steps,
        "cpu_gpu_agreement": agreement,
        "benchmark": benchmark,
        "auto_chose": auto_choices(benchmark),
    }


def write_report(report: dict[str, Any], out: Path) -> Path:
    """Write `report` as `out/report.json` (atomically: a reader never sees half a file)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


Step = tuple[str, list[str], dict[str, str], float | None]  # name, command, env, limit in s


def _agreement_step(out: Path, env: dict[str, str], limit: float | None) -> Step:
    command = [sys.executable, __file__, "agree", "--json", str(out / AGREEMENT)]
    return ("CPU against GPU agreement", command, env, limit)


def full_plan(out: Path, *, quick: bool) -> list[Step]:
    """``nox -s gpu``'s steps, inside a venv where both packages are installed."""
    py = sys.executable
    gpu = {"HYBRID_REQUIRE_GPU": "1"}
    packages = ROOT / "packages"
    bench = [py, "benchmarks/kernels.py", "--parts", "sensitivity"]
    bench += ["--json", str(out / BENCHMARK), "--sensitivities", "forward", "reverse"]
    bench += ["auto", *(["--quick"] if quick else [])]
    scale = "2" if quick else "8"
    return [
        (
            "gpu tests, confluent-bank",
            [py, "-m", "pytest", str(packages / "confluent-bank" / "tests"), "-m", "gpu"],
            gpu,
            None,
        ),
        (
            "gpu tests, hybrid-kernels",
            [py, "-m", "pytest", str(packages / "hybrid-kernels" / "tests"), "-m", "gpu"],
            gpu,
            None,
        ),
        ("integration suite", [py, "-m", "pytest", "tests-integration"], gpu, None),
        (
            f"demo, scale {scale}",
            [py, "examples/demo.py", "--scale", scale, "--out", str(out / "demo-output")],
            {},
            None,
        ),
        _agreement_step(out, {}, None),
        ("kernel benchmark, both modes", bench, {}, None),
    ]


def lease_plan(out: Path) -> list[Step]:
    """The short plan for a lent machine (module docstring): sources on ``PYTHONPATH``, no
    installs, each step under a limit sized from CPU timings (about 8 minutes in all)."""
    py = sys.executable
    source = os.pathsep.join(
        [str(ROOT / "packages" / p / "src") for p in ("confluent-bank", "hybrid-kernels")]
        + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    )
    env = {"PYTHONPATH": source, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    gpu = {**env, "HYBRID_REQUIRE_GPU": "1"}
    pytest = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"]
    hk_tests = ROOT / "packages" / "hybrid-kernels" / "tests"
    cb_tests = ROOT / "packages" / "confluent-bank" / "tests"
    numeric = ["activations", "forward_pair_branch", "forward_series", "moments"]
    numeric += ["infinite_input", "float32", "vectorised"]
    return [
        _agreement_step(out, env, 100),
        ("sensitivity tests", [*pytest, str(hk_tests / "test_sensitivity.py")], gpu, 120),
        ("gpu end-to-end problem", [*pytest, "tests-integration/test_gpu.py"], gpu, 150),
        (
            "small-problem benchmark",
            [py, "benchmarks/small_problem.py", "--quick", "--runs", "1"],
            env,
            90,
        ),
        ("bank-in-ODE benchmark", [py, "benchmarks/bank_in_ode.py", "--quick"], env, 90),
        (
            "bank numerical tests",
            [*pytest, *(str(cb_tests / f"test_{n}.py") for n in numeric)],
            gpu,
            120,
        ),
    ]


def run(out: Path, *, quick: bool = False, lease: bool = False) -> int:
    out.mkdir(parents=True, exist_ok=True)
    # A report reads only what this run's steps wrote, never an earlier run's numbers.
    for name in (AGREEMENT, BENCHMARK):
        (out / name).unlink(missing_ok=True)
    plan = lease_plan(out) if lease else full_plan(out, quick=quick)
    steps = [run_step(name, cmd, env=env, limit=limit) for name, cmd, env, limit in plan]
    device = {"nvidia_smi": probe_nvidia(), "python": platform.python_version()}
    try:
        import jax

        device.update(jax=jax.__version__, jax_devices=[str(d) for d in jax.devices()])
    except Exception as e:  # the report must still be written
        device["jax_error"] = repr(e)
    report = build_report(
        steps,
        device=device,
        agreement=_read_json(out / AGREEMENT),
        benchmark=_read_json(out / BENCHMARK),
    )
    path = write_report(report, out)
    print(f"\ngpu: report written to {path}; {'passed' if report['passed'] else 'FAILED'}")
    for s in steps:
        late = ", killed at its limit" if s["timed_out"] else ""
        print(f"  {'ok  ' if s['passed'] else 'FAIL'} {s['name']} ({s['seconds']:.0f} s{late})")
    return 0 if report["passed"] else 1


def agree(json_path: Path) -> int:
    """Loss and gradient of one bucket on the CPU and the GPU, forward and reverse, float32."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import jax
    import jax.numpy as jnp
    import kernels as B
    import numpy as np
    from jax.flatten_util import ravel_pytree

    import hybrid_kernels as hk

    results = []
    for model in ("logistic", "lotka_volterra"):
        data = B.dataset_for(model, [40] * 16, "padded", 1)
        _, predictors, simulate = B.MODELS[model]()
        for mode in ("forward", "reverse"):
            solver = B.solver_config("recursive", sensitivity=mode)
            step = hk.build_bucket_step(simulate, B.first_component, solver, hk.masked_mse, True)
            values = {}
            for platform_name in ("cpu", "gpu"):
                device = jax.devices(platform_name)[0]
                put = lambda x, device=device: jax.device_put(x, device)  # noqa: E731
                bp = jax.tree.map(put, data.bucket_payloads[0])
                loss, grads = step(jax.tree.map(put, predictors), bp, jnp.asarray(1.0))
                values[platform_name] = (float(loss), np.asarray(ravel_pytree(grads)[0]))
            (lc, gc), (lg, gg) = values["cpu"], values["gpu"]
            results.append(
                {
                    "model": model,
                    "sensitivity": mode,
                    "loss_cpu": lc,
                    "loss_gpu": lg,
                    "loss_rel_diff": abs(lg - lc) / max(abs(lc), 1e-30),
                    "grad_rel_diff": float(
                        np.linalg.norm(gg - gc) / max(np.linalg.norm(gc), 1e-30)
                    ),
                }
            )
            print(json.dumps(results[-1]))
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    worst = max(r["grad_rel_diff"] for r in results)
    return 0 if worst < 1e-3 else 1  # float32 solves on two backends


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_check = sub.add_parser("check", help="fail at once unless a GPU is there")
    p_check.add_argument("--jax", action="store_true", help="also require jax to see it")
    p_run = sub.add_parser("run", help="run every step and write the report")
    p_run.add_argument("--out", type=Path, default=ROOT / "gpu-report")
    p_run.add_argument("--quick", action="store_true", help="smaller demo and benchmark")
    p_run.add_argument(
        "--lease",
        action="store_true",
        help="the ~8-minute plan for a lent machine: sources on PYTHONPATH, nothing installed",
    )
    p_agree = sub.add_parser("agree", help="CPU against GPU loss and gradients")
    p_agree.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "check":
        return check(with_jax=args.jax)
    if args.command == "agree":
        return agree(args.json)
    status = check(with_jax=True)
    return status if status else run(args.out, quick=args.quick, lease=args.lease)


if __name__ == "__main__":
    sys.exit(main())
