"""tools: what a reader runs on a run directory, any run, after train.py wrote it.

    python -m tools.plot_runs runs/addition_s0            # its plots.png: the lesson's four panels
    python -m tools.plot_runs runs/grpo runs/fade         # several runs in one figure (compare.png)

    plot_runs.py   metrics.jsonl into panels and a summary table (and the series the study's
                   pages draw from: experiments/pages.py reads plot_runs.series_from_rows)

Beside the engine (machinery/, which writes a run; of it these import only the checks at
the door, machinery/checks.py) and outside the study (experiments/, which reads many runs to
test the papers' claims and imports this): a run of your own needs nothing of the study.
"""
