"""With several JAX processes the default display is process 0's alone."""

import io
import sys

import jax

import hybrid_kernels as hk


def test_default_ui_is_silent_on_processes_other_than_0(monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert isinstance(hk.default_ui(True), hk.SilentUI)


def test_default_ui_still_shows_progress_on_process_0(monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 0)
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert isinstance(hk.default_ui(True), hk.LogUI)
