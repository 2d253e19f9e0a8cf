"""registry.py: every sweep by name, and the budget of each on each task.

The sweeps themselves: experiments/designs_cancellation.py (the two cancellation papers)
and experiments/designs_fade.py (FADE); what a sweep is and what it costs:
experiments/designs.py. experiments/sweep.py runs them, experiments/pages.py reports them
(experiments/summaries.py: all of them together), in this order.
"""

from __future__ import annotations

from experiments.designs import TASKS, estimate_minutes, runs_on, settings
from experiments.designs_cancellation import batching, credit, dfpo, dose, recentred, specificity
from experiments.designs_fade import advantages, fade, tradeoff
from experiments.designs_masked import masked
from experiments.designs_pretrained import edge

SWEEPS = {"batching": batching, "advantages": advantages, "fade": fade, "dfpo": dfpo, "credit": credit,
          "tradeoff": tradeoff, "specificity": specificity, "dose": dose, "recentred": recentred, "masked": masked,
          "edge": edge}


def declared(tasks=None) -> list[tuple[str, str]]:
    """Every (task, sweep name) that TASKS declares, tasks in TASKS' order (or `tasks`'), sweeps
    in SWEEPS': the order of the budget, the plan and the pages."""
    return [(task, name) for task in (TASKS if tasks is None else tasks) for name in SWEEPS if runs_on(task, name)]


def wall_minutes(task: str, name: str, jobs: int = 2) -> float:
    """The estimated wall minutes of a whole sweep on a task: its planned runs (arms x warm-up
    seeds x RL seeds) x minutes per run (designs.estimate_minutes) / `jobs` runs at a time."""
    sweep = SWEEPS[name](task)
    return len(sweep.arms) * len(sweep.warmup_seeds) * len(sweep.seeds) * estimate_minutes(task, name) / jobs


def budget_table(jobs: int = 2) -> str:
    """Every sweep's estimate on each task: runs, minutes per run, wall minutes with `jobs`
    runs at a time, its parts and the wall minutes of each (what `plan` prints first)."""
    lines = ["    sweep       task       arms  runs  steps  min/run  wall min  parts  min/part"]
    for task, name in declared():
        sweep, s = SWEEPS[name](task), settings(task, name)
        arms, runs = len(sweep.arms), len(sweep.arms) * len(sweep.warmup_seeds) * len(sweep.seeds)
        wall = wall_minutes(task, name, jobs)
        lines.append(f"    {name:<11} {task:<10} {arms:>4} {runs:>5} {s['steps']:>6} "
                     f"{estimate_minutes(task, name):>8.1f} {wall:>9.0f} {s['parts']:>6} {wall / s['parts']:>9.0f}")
    return "\n".join(lines)
