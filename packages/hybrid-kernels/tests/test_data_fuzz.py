"""Hypothesis fuzz of ChannelObs, make_experiment and make_dataset.

Each case starts from valid random data (one to three experiments, one or two channels whose
times may be float32 or float64, float32 or float64 storage) and applies zero or more labelled
corruptions, each naming the argument it breaks. A corrupted case must raise `ValueError` or
`TypeError` whose message names one of the corrupted arguments; a clean case must be accepted,
and every accepted dataset must hold exactly its observations, all finite, variances positive.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hybrid_kernels as hk

CHANNEL_ARGS = ("ts", "values", "variance")

# argument -> corruptions of a valid value; each returns the corrupted value.
BAD_ARRAY = {
    "nan": lambda a: _with(a, np.nan),
    "inf": lambda a: _with(a, -np.inf),
    "rank2": lambda a: np.asarray(a)[None, :],
    "ragged": lambda a: [list(a), [1.0]] if len(a) else [[1.0], []],
    "text": lambda a: ["x"] * len(a),
    "object": lambda a: np.array([object()] * max(len(a), 1), dtype=object),
    "none": lambda a: None,
}
BAD_TS = {**BAD_ARRAY, "repeat": lambda a: np.concatenate([a, a[:1]]) if len(a) else [0.0, 0.0]}
BAD_VALUES = {**BAD_ARRAY, "short": lambda a: np.asarray(a)[:-1] if len(a) > 1 else [1.0, 2.0]}
BAD_VARIANCE = {
    **BAD_ARRAY,
    "zero": lambda a: 0.0,
    "negative": lambda a: -1.0,
    "shape": lambda a: np.ones(len(a) + 1),
}
BAD_COVARIATE = {
    "nan": lambda v: np.nan,
    "inf": lambda v: np.inf,
    "rank2": lambda v: np.ones((2, 2)),
    "ragged": lambda v: [[1.0, 2.0], [3.0]],
    "text": lambda v: "x",
    "object": lambda v: object(),
    "none": lambda v: None,
}
BAD_Y0 = {
    "nan": lambda y: _with(y, np.nan),
    "inf": lambda y: _with(y, np.inf),
    "rank2": lambda y: y[None, :],
    "scalar": lambda y: y[0],
    "text": lambda y: np.array(["a"] * len(y)),
    "ragged": lambda y: [list(y), [1.0, 2.0]],
}
BAD_EXP_ID = {"none": lambda e: None, "int": lambda e: 7}
BAD_NAMES = {
    "none": lambda n: None,
    "str": lambda n: n[0],
    "missing": lambda n: [*n, "nope"],
    "repeat": lambda n: [*n, n[0]],
    "empty": lambda n: [],
    "int": lambda n: [*n, 3],
}
# Finite in float64, but inf (or 0 for a variance) once stored in float32.
OVERFLOW = {"ts": 1e300, "values": -1e300, "variance": 1e-300, "y0": 1e300, "covariate": 1e300}


def _with(a, x):
    a = np.array(a, dtype=float, copy=True).reshape(-1)
    if a.size == 0:
        return np.array([x])
    a[-1] = x
    return a


@st.composite
def cases(draw):
    n_exp = draw(st.integers(1, 3))
    n_ch = draw(st.integers(1, 2))
    n_cov = draw(st.integers(0, 2))
    size_y0 = draw(st.integers(1, 2))
    storage = draw(st.sampled_from(["float32", "float64"]))
    finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)
    exps = []
    for e in range(n_exp):
        channels = {}
        for c in range(n_ch):
            n = draw(st.integers(1, 5))
            ts = draw(st.lists(finite, min_size=n, max_size=n, unique=True))
            dt = draw(st.sampled_from([np.float32, np.float64]))
            if dt is np.float64 and draw(st.booleans()):
                # A time float32 cannot tell from ts[0]: distinct only at full precision.
                near = ts[0] + 1e-9 * max(abs(ts[0]), 1.0)
                if near not in ts:
                    ts, n = [*ts, near], n + 1
            values = draw(st.lists(finite, min_size=n, max_size=n))
            variance = draw(
                st.one_of(
                    st.floats(1e-3, 1e3), st.lists(st.floats(1e-3, 1e3), min_size=n, max_size=n)
                )
            )
            channels[f"ch{c}"] = dict(
                ts=np.asarray(ts, dt), values=np.asarray(values, dt), variance=variance
            )
        covariates = {f"k{k}": draw(finite) for k in range(n_cov)}
        y0 = np.asarray(draw(st.lists(finite, min_size=size_y0, max_size=size_y0)))
        exps.append(dict(channels=channels, covariates=covariates, y0=y0, exp_id=f"e{e}"))
    names = [f"ch{c}" for c in range(n_ch)]

    # Zero to two corruptions, each labelled with the words an error must use to name it.
    corrupted: list[tuple[str, ...]] = []
    touched: set[tuple[int, str]] = set()  # each target is corrupted at most once
    for _ in range(draw(st.integers(0, 2))):
        where = draw(st.sampled_from(["channel", "covariate", "y0", "exp_id", "names", "big"]))
        i = draw(st.integers(0, n_exp - 1))
        target = (-1, where) if where == "names" else (i, "exp_id" if where == "exp_id" else "")
        if target in touched:
            continue
        touched.add(target)
        e = exps[i]
        if where == "channel":
            ch = e["channels"][draw(st.sampled_from(sorted(e["channels"])))]
            arg = draw(st.sampled_from(CHANNEL_ARGS))
            table = {"ts": BAD_TS, "values": BAD_VALUES, "variance": BAD_VARIANCE}[arg]
            kind = draw(st.sampled_from(sorted(table)))
            valid = np.atleast_1d(np.asarray(ch[arg], dtype=float))
            if arg == "variance":  # one per value: a scalar's "shape" of 2 fits 2 values
                valid = np.broadcast_to(valid, np.shape(ch["values"])).copy()
            ch[arg] = table[kind](valid)
            corrupted.append((f"`{arg}`",) + (("`values`",) if arg == "ts" else ()))
        elif where == "covariate":
            if not e["covariates"]:
                continue
            key = draw(st.sampled_from(sorted(e["covariates"])))
            kind = draw(st.sampled_from(sorted(BAD_COVARIATE)))
            e["covariates"][key] = BAD_COVARIATE[kind](e["covariates"][key])
            corrupted.append((f"covariate {key!r}",))
        elif where == "y0":
            kind = draw(st.sampled_from(sorted(BAD_Y0)))
            e["y0"] = BAD_Y0[kind](e["y0"])
            corrupted.append(("y0",))
        elif where == "exp_id":
            e["exp_id"] = BAD_EXP_ID[draw(st.sampled_from(sorted(BAD_EXP_ID)))](e["exp_id"])
            corrupted.append(("`exp_id`",))
        elif where == "names":
            names = BAD_NAMES[draw(st.sampled_from(sorted(BAD_NAMES)))](names)
            corrupted.append(("`output_channel_names`", "channel"))
        elif storage == "float32":  # "big": finite in float64 only
            field = draw(st.sampled_from(sorted(OVERFLOW)))
            x = OVERFLOW[field]
            if field == "y0":
                e["y0"] = _with(e["y0"], x)
                corrupted.append(("`y0`",))
            elif field == "covariate":
                e["covariates"]["big"] = x
                for other in exps:  # every experiment needs the same covariate keys
                    other["covariates"].setdefault("big", 1.0)
                corrupted.append(("covariate 'big'",))
            else:
                ch = e["channels"][draw(st.sampled_from(sorted(e["channels"])))]
                n = np.asarray(ch["values"]).size
                if field == "ts":
                    ch["ts"] = np.concatenate([np.arange(n - 1, dtype=np.float64), [x]])
                elif field == "values":
                    ch["values"] = _with(ch["values"], x)
                else:
                    ch["variance"] = _with(np.ones(n), x)
                corrupted.append((f"`{field}`",))
    return exps, names, storage, corrupted


def build(exps, names, storage):
    experiments = []
    for e in exps:
        channels = {name: hk.ChannelObs(**kw) for name, kw in e["channels"].items()}
        # Start each solve at the first observed time: the fuzz is about values, not t0.
        firsts = [float(np.min(c.ts)) for c in channels.values() if c.ts.size]
        experiments.append(
            hk.make_experiment(
                covariates=e["covariates"],
                channels=channels,
                y0_fn=lambda c, ch, y0=e["y0"]: y0,
                exp_id=e["exp_id"],
                t0=min(firsts, default=0.0),
            )
        )
    return hk.make_dataset(experiments, output_channel_names=names, dtype=storage)


def accepted_problem(dataset, exps, names) -> str | None:
    """What is wrong with an accepted dataset: a lost observation, a non-finite value or a
    non-positive variance (None when it holds every observation, finite)."""
    expected = sum(np.asarray(e["channels"][n]["values"]).size for e in exps for n in names)
    stored = sum(int(bp.n_obs) for bp in dataset.bucket_payloads)
    if stored != expected:
        return f"lost data: {stored} observations stored of {expected}"
    for bp in dataset.bucket_payloads:
        for leaf in (bp.ts, bp.y_observed, bp.yvar, bp.y0, *bp.covariates.values()):
            if not np.all(np.isfinite(np.asarray(leaf))):
                return "non-finite value stored"
        if not np.all(np.asarray(bp.yvar)[np.asarray(bp.mask)] > 0):
            return "non-positive variance stored"
    return None


def classify(case) -> str:
    """'accepted', 'clean' (a named ValueError/TypeError), or what went wrong."""
    exps, names, storage, corrupted = case
    try:
        dataset = build(exps, names, storage)
    except (ValueError, TypeError) as e:
        if not corrupted:
            return f"refused a valid input: {e!r}"
        if any(label in str(e) for labels in corrupted for label in labels):
            return "clean"
        return f"unnamed: {e!r} for {corrupted}"
    except Exception as e:  # anything else is a finding
        return f"other: {type(e).__name__}: {e!r}"
    if corrupted:
        return f"silently accepted {corrupted}"
    return accepted_problem(dataset, exps, names) or "accepted"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(cases())
def test_every_input_is_accepted_whole_or_refused_naming_the_argument(case):
    outcome = classify(case)
    assert outcome in ("accepted", "clean"), outcome


@pytest.mark.parametrize("storage", ["float32", "float64"])
def test_the_fuzz_oracle_flags_a_silently_accepted_input(storage):
    # The oracle itself must be able to fail: a corruption label on valid data is "accepted".
    exps = [
        dict(
            channels={"ch0": dict(ts=[0.0], values=[1.0], variance=1.0)},
            covariates={},
            y0=np.ones(1),
            exp_id="e0",
        )
    ]
    assert classify((exps, ["ch0"], storage, [("`ts`",)])).startswith("silently accepted")
