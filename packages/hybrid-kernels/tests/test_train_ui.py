"""Progress reporting: the event protocol, RecordingUI, LogUI, RichUI, silence."""

import io
import sys

import pytest
from helpers import osc_dataset, quiet, train

import hybrid_kernels as hk


@pytest.fixture(scope="module")
def clean(oscillator):
    return osc_dataset(oscillator)


@pytest.fixture(scope="module")
def recorded(oscillator, clean):
    ui = hk.RecordingUI()
    history, _ = train(oscillator, clean, quiet(steps=(4, 3), lr=(0.05, 0.01)), ui=ui)
    return ui, history


def test_one_step_event_per_step_with_global_indices(recorded):
    ui, history = recorded
    steps = ui.of("on_step_end")
    assert [s["step"] for s in steps] == list(range(7))
    assert [s["phase_idx"] for s in steps] == [0] * 4 + [1] * 3
    assert [s["loss"] for s in steps] == list(history)


def test_compile_events_come_before_the_first_step(recorded):
    ui, _ = recorded
    names = [n for n, _ in ui.events]
    assert names.count("on_compile_start") == names.count("on_compile_done") == 1
    labels = [e["label"] for e in ui.of("on_compile_progress")]
    # one bucket, no penalty: the bucket's solve is compiled inside the one step program
    assert labels == ["bucket_step N=3 T=10 + update"]
    assert names.index("on_compile_done") < names.index("on_step_end")


def test_run_and_phase_brackets(recorded):
    ui, history = recorded
    names = [n for n, _ in ui.events]
    assert names[0] == "on_run_start" and names[-1] == "on_run_end"
    assert ui.of("on_run_start") == [{"total_steps": 7, "num_phases": 2}]
    assert [e["phase_idx"] for e in ui.of("on_phase_start")] == [0, 1]
    assert [e["phase_idx"] for e in ui.of("on_phase_end")] == [0, 1]
    assert ui.of("on_phase_start")[1]["lr"] == 0.01
    assert [e["start_step"] for e in ui.of("on_phase_start")] == [0, 4]
    assert ui.of("on_run_end")[0]["final_loss"] == history.best_loss


def test_not_verbose_is_silent(oscillator, clean, capsys):
    train(oscillator, clean, quiet(steps=(3,)))
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_verbose_off_a_terminal_prints_plain_log_lines(oscillator, clean, capsys):
    config = hk.OptaxTrainingConfig(steps=(12,), lr=(0.05,), verbose=True)
    train(oscillator, clean, config)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("phase 0 step")]
    assert [line.split()[3] for line in lines] == ["10/12", "12/12"]  # every 10 and phase end
    assert "steps/s" in lines[0] and "ETA" in lines[0] and "loss=" in lines[0]
    assert "compiled 1/1 bucket_step N=3 T=10 + update" in out


def test_log_ui_writes_every_k_steps_to_its_stream(oscillator, clean):
    stream = io.StringIO()
    train(oscillator, clean, quiet(steps=(6,)), ui=hk.LogUI(every=2, stream=stream))
    steps = [
        line.split()[3]
        for line in stream.getvalue().splitlines()
        if line.startswith("phase 0 step")
    ]
    assert steps == ["2/6", "4/6", "6/6"]


def test_log_ui_ends_a_run_stopped_by_an_error_without_saying_done(oscillator, clean):
    stream = io.StringIO()

    def boom(step, predictors, opt_state):
        raise RuntimeError("hook failed")

    with pytest.raises(RuntimeError, match="hook failed"):
        train(oscillator, clean, quiet(steps=(3,)), ui=hk.LogUI(stream=stream), hooks=boom)
    lines = stream.getvalue().splitlines()
    assert lines[-2:] == ["training stopped by RuntimeError after 1 step", "stopped: no final loss"]
    assert "done" not in stream.getvalue()


def test_rich_ui_ends_a_run_stopped_by_an_error_without_saying_done():
    from rich.console import Console

    buffer = io.StringIO()
    ui = hk.RichUI(console=Console(file=buffer, force_terminal=True, width=160))
    ui.on_run_start(total_steps=3, num_phases=1)
    ui.on_run_end(final_loss=float("nan"))
    assert "stopped: no final loss" in buffer.getvalue() and "done" not in buffer.getvalue()


def test_rich_ui_shows_phase_step_loss_rate_eta_and_compile_progress(oscillator, clean):
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=160)
    train(oscillator, clean, quiet(steps=(5,), lr=(0.05,)), ui=hk.RichUI(console=console))
    text = buffer.getvalue()
    for words in ("phase 1/1", "5/5", "loss", "penalty", "steps/s", "ETA", "compiling"):
        assert words in text, words
    assert "update" in text and "done" in text


def test_default_ui_picks_rich_on_a_terminal_and_log_lines_elsewhere(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert isinstance(hk.default_ui(False), hk.SilentUI)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert isinstance(hk.default_ui(True), hk.LogUI)
    monkeypatch.setattr(sys, "stdout", Tty())
    assert isinstance(hk.default_ui(True), hk.RichUI)


def test_explicit_ui_wins_over_verbose(oscillator, clean, capsys):
    ui = hk.RecordingUI()
    train(oscillator, clean, hk.OptaxTrainingConfig(steps=(2,), lr=(0.05,), verbose=True), ui=ui)
    assert capsys.readouterr().out == ""
    assert ui.count("on_step_end") == 2


def test_ui_without_the_event_methods_raises(oscillator, clean):
    class Half:
        def on_step_end(self, **kw):
            pass

    with pytest.raises(TypeError, match=r"lacks the TrainingUI methods.*on_run_start"):
        train(oscillator, clean, quiet(), ui=Half())


def test_custom_ui_subclass_overrides_only_what_it_needs(oscillator, clean):
    losses = []

    class Collect(hk.TrainingUI):
        def on_step_end(self, *, loss, **kw):
            losses.append(loss)

    history, _ = train(oscillator, clean, quiet(steps=(3,)), ui=Collect())
    assert losses == list(history)


def test_log_ui_rejects_a_bad_interval():
    with pytest.raises(ValueError, match="every must be at least 1"):
        hk.LogUI(every=0)


def test_each_block_of_steps_read_is_announced_before_its_step_events(oscillator, clean):
    ui = hk.RecordingUI()
    train(oscillator, clean, quiet(steps=(7,), log_every=3), ui=ui)
    names = [n for n, _ in ui.events if n in ("on_steps_read", "on_step_end")]
    blocks = ui.of("on_steps_read")
    assert [b["first_step"] for b in blocks] == [0] + [b["last_step"] + 1 for b in blocks[:-1]]
    assert blocks[-1]["last_step"] == 6
    # blocks of log_every (the last step of a phase reads whatever is left)
    assert len(blocks) > 1 and blocks[0]["last_step"] == 2
    expected = []
    for b in blocks:
        expected += ["on_steps_read"] + ["on_step_end"] * (b["last_step"] - b["first_step"] + 1)
    assert names == expected


def _rates(text: str) -> list[float]:
    return [float(line.split(" steps/s")[0].split()[-1]) for line in text.splitlines()]


@pytest.mark.parametrize("make_ui", ["log", "rich"])
def test_a_display_times_a_block_of_steps_by_its_read_not_by_its_events(make_ui, monkeypatch):
    # 50 steps that took 0.2 s reach the host in one read: their events come microseconds
    # apart, and a rate timed by them would read thousands of steps per second.
    import time

    now = [100.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    stream = io.StringIO()
    ui = hk.LogUI(every=10, stream=stream)
    if make_ui == "rich":
        ui = hk.RichUI()
    ui.on_run_start(total_steps=150, num_phases=1)
    ui.on_phase_start(phase_idx=0, phase_steps=150, lr=0.1, optimizer="adam", start_step=0)
    for first, at in ((0, 100.0), (50, 100.2)):
        now[0] = at
        ui.on_steps_read(first_step=first, last_step=first + 49)
        for step in range(first, first + 50):
            ui.on_step_end(step=step, phase_idx=0, loss=1.0, penalty=0.0)
    if make_ui == "rich":
        ui.on_run_end(final_loss=1.0)
        assert ui._clock.rate() == pytest.approx(50 / 0.2)
        assert ui._clock.eta() == pytest.approx(50 / 250)
        return
    rates = _rates(stream.getvalue().split("\n", 2)[2])  # after the run and phase lines
    assert rates == [0.0] * 5 + [pytest.approx(250.0)] * 5
    assert "ETA --:--" in stream.getvalue().splitlines()[2]
