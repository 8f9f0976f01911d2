"""Training after a commit: the run with transitions keeps pace with the same run without.

A commit that does not change the function must not disturb the steps that follow it, so the
standard run (pair, birth, cluster) is compared step by step with its control, the same run
with no commits.
"""

import numpy as np

FINAL_RATIO = 1.2  # the run with commits ends within this factor of the control's final loss
SPIKE_RATIO = 2.0  # no step after a commit exceeds this factor of the control's loss


def _accepted_steps(run):
    return sorted(e.step for e in run.hook.events if e.accepted)


def test_control_is_the_same_run_until_the_first_commit(standard_run, control_run):
    first = _accepted_steps(standard_run)[0]
    assert list(standard_run.history)[:first] == list(control_run)[:first]


def test_run_with_commits_ends_within_1_2x_of_the_control(standard_run, control_run):
    final, control = standard_run.history[-1], control_run[-1]
    assert final <= FINAL_RATIO * control, f"final loss {final:.3e}, control {control:.3e}"


def test_no_step_after_a_commit_exceeds_twice_the_control(standard_run, control_run):
    # Every step from each commit up to the next one (or the end), not only the commit's own.
    losses, control = np.asarray(standard_run.history), np.asarray(control_run)
    starts = _accepted_steps(standard_run)
    kinds = {e.step: e.kind for e in standard_run.hook.events if e.accepted}
    worst = []
    for start, end in zip(starts, [*starts[1:], len(losses)], strict=True):
        ratios = losses[start:end] / control[start:end]
        at = start + int(np.argmax(ratios))
        worst.append((kinds[start], start, at, float(ratios.max())))
    over = [w for w in worst if w[3] > SPIKE_RATIO]
    assert not over, "(kind, commit step, worst step, loss / control): " + repr(over)
