"""compare_page.py: what `python -m experiments.compare` found: one number per run, the study's verdict on the pairs, the page and its plot.

experiments/compare.py runs the two arms from the same seeds; this file reads what they
left and answers the question the command was asked, with the study's own machinery:

  the metric    one number per run, from its metrics.jsonl, by experiments/quantities.py
                (the functions the sweeps' table rows use): final_pass@1, mean_pass@1,
                entropy_last10, or any logged key as final/KEY or mean/KEY;
  the pairs     seed s gives a pair (run of a, run of b): both ran with --seed s, so they
                drew the same training prompts, held-out set and sampling streams, and
                d_s = x_b(s) - x_a(s) is the arm's effect plus what the arms' differing
                updates did to the chance that followed. What the seed shares cancels in d;
                on the study's countdown runs it was 59-72% of the variance of final pass@1;
  the verdict   claims.judge on one declared Claim, exactly as a sweep's page judges a
                finding: the exact sign-flip test of mean(d) = 0 (two-sided, or one-sided
                against the direction declared before the runs), its floor (the smallest
                p n pairs can give), the effect it would detect 80% of the time at the SD
                of the d it saw (exact_tests.power_ratio), and with --margin m the
                equivalence test (TOST within +-m, a Claim of direction 0). Pairs whose
                runs ran on different float paths (pages.cpu_model: CPU model plus torch's
                kernels) are left out and counted, as the study does;
  the page      OUT/compare.md and OUT/compare.png beside the runs: per pair both values
                and d, the mean of d +- its paired SE, p, the 80%-power effect, TOST, the
                verdict in the study's words, the curves of both arms per seed with the
                metric marked, the machine and the load while the runs ran.

One claim, so no family to correct for: the difference test and the equivalence test
answer different questions (is there a difference? is it smaller than m?) and are judged
each as a family of one, which is how a sweep declares two families.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import dataclass
from typing import Callable

import numpy as np

from experiments import claims, pages, quantities
from tools.plot_runs import series_from_rows

ROW = "metric"          # the one row of the values claims.judge reads: {(ROW, arm): {pair key: number}}
ARMS = ("a", "b")
DIRECTIONS = ("two-sided", "b>a", "a>b")
ALPHA = claims.ALPHA
TAIL = 10               # entropy_last10: the last TAIL steps


# ---------------------------------------------------------------------------------------
# 1. The question: a metric (one number per run), a direction, a margin
# ---------------------------------------------------------------------------------------

@dataclass
class Metric:
    """One number per run, computed from its metrics.jsonl's training steps (step 0 left out)."""

    name: str
    """As given to --metric: final_pass@1, mean_pass@1, entropy_last10, final/KEY, mean/KEY."""
    key: str
    """The metrics.jsonl key it reads (and the plot draws)."""
    kind: str
    """"final" (the value at the last step that logged it), "mean" (over the steps that did) or "tail"."""
    text: str
    """What it is, in words (the page's and the plan's)."""

    @property
    def fn(self) -> Callable[[dict], float]:
        """The run's series -> its number (quantities.py; NaN when the run never logged the key)."""
        return {"final": quantities.final, "mean": quantities.mean_of,
                "tail": lambda key: quantities.tail_mean(key, TAIL)}[self.kind](self.key)

    @property
    def needs_eval(self) -> bool:
        return self.key.startswith("eval/")


NAMED = {"final_pass@1": ("eval/pass@1", "final", "held-out pass@1 at the last step"),
         "mean_pass@1": ("eval/pass@1", "mean", "held-out pass@1 averaged over the run's evaluations after step 0 "
                                                "(how fast and how high: the area under the curve per evaluation)"),
         "entropy_last10": ("entropy", "tail", f"token entropy of the sampled responses (nats), averaged over the "
                                               f"last {TAIL} steps")}


def parse_metric(name: str) -> Metric:
    """--metric NAME as a Metric; ValueError (one line) naming what is accepted.

    final/KEY and mean/KEY take any metrics.jsonl key (docs/metrics.md): final/eval/pass@4,
    mean/grad_norm, and with --final_eval, final/final/pass@1 (train.py's own final/ keys).
    Whether a run logs KEY is known only once one has: compare.py checks it then.
    """
    if name in NAMED:
        return Metric(name, *NAMED[name])
    kind, _, key = name.partition("/")
    if kind in ("final", "mean") and key:
        text = f"{key} at the last step that logged it" if kind == "final" else f"{key} averaged over the steps that logged it"
        return Metric(name, key, kind, text)
    raise ValueError(f"--metric {name!r}: expected {', '.join(NAMED)}, final/KEY or mean/KEY with KEY a "
                     "metrics.jsonl key (docs/metrics.md), e.g. final/eval/pass@4 or mean/entropy")


@dataclass
class Question:
    """What the command asks of the pairs, declared before the runs."""

    metric: Metric
    direction: str = "two-sided"
    """"two-sided" (is b different from a?), "b>a" or "a>b" (one-sided: the direction you expect)."""
    margin: float = 0.0
    """> 0: also test whether b - a lies within +-margin (TOST)."""

    @property
    def sided(self) -> str:
        return "two" if self.direction == "two-sided" else "one"

    def record(self) -> dict:
        """The question as data (compare.json; each invocation's record says what it asked)."""
        return {"metric": self.metric.name, "direction": self.direction, "margin": self.margin}

    def difference_claim(self) -> claims.Claim:
        """The Claim claims.judge tests: b - a on the metric, +1 (or -1 for a>b), one- or two-sided.

        Two-sided, the predicted sign is +1 only so that judge's words can be read: "agrees"
        is b above a, "opposite" b below a (reading() says it in words).
        """
        sign = -1 if self.direction == "a>b" else +1
        return claims.Claim("compare", f"b vs a on {self.metric.name}", "declared on the command line", ROW, "b", "a",
                            sign, sided=self.sided, family="difference")

    def equivalence_claim(self) -> claims.Claim:
        """TOST within +-margin: b - a is inside the margin (direction 0)."""
        return claims.Claim("compare", f"b within +-{self.margin:g} of a on {self.metric.name}",
                            "declared on the command line", ROW, "b", "a", 0, margin=self.margin, family="equivalence")


def floor(n: int, sided: str) -> float:
    """The smallest p an exact sign-flip test can give with n pairs: 2 / 2^n two-sided (the
    observed sign pattern and its mirror), 1 / 2^n one-sided and for TOST. 5 pairs: 0.0625
    two-sided, so no verdict at 0.05 is possible whatever the runs show."""
    return (2 if sided == "two" else 1) / 2 ** n


def fewest_pairs(sided: str) -> int:
    """The fewest pairs whose floor is below ALPHA: 6 two-sided (0.031), 5 one-sided (0.031)."""
    n = 1
    while floor(n, sided) >= ALPHA:
        n += 1
    return n


# ---------------------------------------------------------------------------------------
# 2. The runs on disk and their numbers
# ---------------------------------------------------------------------------------------

def run_dir(out: str, arm: str, seed: int) -> str:
    """OUT/ARM/seed_S: where train.py writes one run of the comparison."""
    return os.path.join(out, arm, f"seed_{seed}")


def read_rows(d: str) -> list[dict]:
    """Every line of a run's metrics.jsonl (step 0, the start's evaluation, included); [] if none."""
    try:
        with open(os.path.join(d, "metrics.jsonl")) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return []


def run_record(d: str) -> dict:
    """What the pairing needs of a run: {"machine": the machine (machines.json, written at each
    start), "start": pages.start_record (its start.json: weights' sha256, float path)}.

    A run started (or resumed) on more than one machine gets all of them, joined by " + ":
    its CPU key then matches no single machine's, so its pair is left out."""
    starts = pages.read_json(os.path.join(d, "machines.json")) or []
    machines = list(dict.fromkeys(s.get("machine") for s in starts if s.get("machine")))
    models = list(dict.fromkeys((m.split(", ") + ["?"])[1] for m in machines))
    machine = machines[0] if len(models) == 1 else (f"nproc ?, {' + '.join(models)}, ?" if models else None)
    return {"machine": machine, "start": pages.start_record(d)}


def finished(d: str) -> bool:
    return os.path.isfile(os.path.join(d, "done.json"))


def collect(out: str, seeds: list[int], metric: Metric) -> dict:
    """The finished runs' numbers: {"values": {(ROW, arm): {(0, seed): x}}, "cpus": {(arm, (0, seed)):
    CPU key}, "series": {(arm, seed): the run's series, step 0 included}, "records": {(arm, seed):
    run_record}}. The metric reads the training steps only (step 0, the shared start, left out)."""
    values, cpus, series, records = {(ROW, a): {} for a in ARMS}, {}, {}, {}
    for arm in ARMS:
        for seed in seeds:
            d = run_dir(out, arm, seed)
            if not finished(d):
                continue
            rows = read_rows(d)
            values[ROW, arm][0, seed] = metric.fn(series_from_rows([r for r in rows if r["step"] != 0]))
            series[arm, seed] = series_from_rows(rows)
            records[arm, seed] = run_record(d)
            cpus[arm, (0, seed)] = pages.cpu_model(records[arm, seed])
    return {"values": values, "cpus": cpus, "series": series, "records": records}


# ---------------------------------------------------------------------------------------
# 3. The verdict: the study's claims.judge on the pairs
# ---------------------------------------------------------------------------------------

def judge_pairs(a: dict, b: dict, question: Question, cpus: dict | None = None) -> dict:
    """{"difference": claims.judge's record, "equivalence": its TOST record or None}.

    a, b: {pair key: number} (any keys: (0, seed) here, (warm-up seed, seed) in a sweep's
    data); cpus: {(arm, key): CPU key} (pairs across CPU keys left out). Each claim is
    judged alone (a family of one: p_holm = p). The record's n, effect (mean of b - a), se
    (sd / sqrt(n)), p, floor and power80 are the study's, computed by the study's code.
    """
    values = {(ROW, "a"): a, (ROW, "b"): b}
    out = {"difference": claims.judge([question.difference_claim()], values, {}, cpus=cpus)[0], "equivalence": None}
    if question.margin:
        out["equivalence"] = claims.judge([question.equivalence_claim()], values, {}, cpus=cpus)[0]
    return out


def reading(rec: dict, question: Question) -> str:
    """The verdict in the study's words, then what it means for b and a.

    Below the floor (too few pairs for any p < ALPHA) there is no verdict, only numbers.
    """
    if rec["verdict"] == "not testable":
        return f"**not testable** ({rec['detail']})"
    if rec["floor"] >= ALPHA:
        return (f"**no verdict possible**: with {rec['n']} pairs the smallest p this test can give is "
                f"{rec['floor']:.4g}, not below {ALPHA} (it needs {fewest_pairs(rec['claim'].sided)} pairs); "
                "the numbers above are all there is")
    verdict = rec["verdict"]
    if rec["claim"].direction == 0:
        means = {"agrees": f"b - a is within ±{question.margin:g} (equivalent within the margin)",
                 "no equivalence shown": f"b - a is not shown to be within ±{question.margin:g}"}
    else:
        higher, lower = "b is higher than a", "b is lower than a"
        declared = question.direction != "two-sided"
        means = {"agrees": (lower if question.direction == "a>b" else higher) + (", as declared" if declared else ""),
                 "opposite": lower, "no difference detected": "these pairs do not tell b from a"}
    return f"**{verdict}**: {means.get(verdict, verdict)} ({rec['detail']})"


def progress_line(out: str, seeds: list[int], question: Question) -> str:
    """One line for the terminal as pairs finish: the pairs so far, mean d +- SE, p, the 80%-power effect."""
    got = collect(out, seeds, question.metric)
    a, b = got["values"][ROW, "a"], got["values"][ROW, "b"]
    keys = sorted(set(a) & set(b))
    if not keys:
        return "no pair finished yet"
    rec = judge_pairs(a, b, question, got["cpus"])["difference"]
    text = f"{len(keys)} pair{'s' if len(keys) > 1 else ''} finished"
    if rec["verdict"] == "not testable":
        return f"{text}: {rec['detail']}"
    power = (f"80%-power effect at this SD {_fmt(rec['power80'])}" if math.isfinite(rec["power80"]) else
             f"no effect detectable yet (the test needs {fewest_pairs(question.sided)} pairs)")
    return (f"{text}: b - a = {_fmt(rec['effect'])} ± {_fmt(rec['se'])} (paired SE), p {rec['p']:.4g} "
            f"({'two' if question.sided == 'two' else 'one'}-sided, floor {rec['floor']:.4g}); {power}")


# ---------------------------------------------------------------------------------------
# 4. The page and the plot
# ---------------------------------------------------------------------------------------

def write_page(out: str, seeds: list[int], question: Question, meta: dict) -> dict:
    """OUT/compare.md, OUT/compare.png and OUT/compare.json from the finished runs; returns the judged records.

    meta: {"command", "a", "b", "shared" (flag lists), "steps", "invocations" (the records of
    compare.py's invocations on this OUT: when, how long, the load)}.
    """
    got = collect(out, seeds, question.metric)
    a, b = got["values"][ROW, "a"], got["values"][ROW, "b"]
    judged = judge_pairs(a, b, question, got["cpus"])
    diff, equiv = judged["difference"], judged["equivalence"]
    pairs = [s for s in seeds if (0, s) in a and (0, s) in b]
    counted = [s for s in pairs if s not in _across(got, pairs)]      # what the test reads
    lines = [f"# Does b help? `{_flags(meta['b'])}` (b) vs `{_flags(meta['a'])}` (a)", "",
             f"- Command: `{meta['command']}`",
             f"- Arms: **a** `{_flags(meta['a'])}`; **b** `{_flags(meta['b'])}`; both: "
             + (f"`{_flags(meta['shared'])}` (an arm's flags come last: they win)" if meta["shared"] else
                "no shared flags"),
             f"- Each run: `python train.py --out_dir {os.path.join(out, 'ARM', 'seed_S')} --seed S --steps "
             f"{meta['steps']} --threads 1 SHARED ARM`, one torch thread, `--jobs` at a time",
             f"- Runs: {len(got['series'])} of {2 * len(seeds)} finished (2 arms x seeds {_seeds(seeds)}); "
             f"pairs: {len(pairs)}" + ("" if len(pairs) == len(seeds) else "; INCOMPLETE")
             + ("" if counted == pairs else f"; in the test: {len(counted)}"),
             f"- Metric: `{question.metric.name}`, {question.metric.text} (key `{question.metric.key}`); "
             "per seed d = b - a",
             f"- Test ({declared_text(question, meta.get('invocations', []))}): {_test_text(question)}",
             "- " + machine_text(got, pairs),
             "- " + time_text(out, got, meta.get("invocations", [])),
             "- Starting weights (sha256, start.json): " + _starts(got), ""]
    lines += ["## Verdict", "", summary_line(diff, question), "", "Difference: " + reading(diff, question), ""]
    if equiv is not None:
        lines += [f"Equivalence (TOST within ±{question.margin:g}, p {_p(equiv)}): " + reading(equiv, question), ""]
    lines += ["## Pairs", "", f"| seed | a | b | b - a |" + (" CPUs |" if _mixed(got, pairs) else ""),
              "|---|---|---|---|" + ("---|" if _mixed(got, pairs) else "")]
    for s in seeds:
        x, y = a.get((0, s), math.nan), b.get((0, s), math.nan)
        cpu = ""
        if _mixed(got, pairs):
            cpu = f" {got['cpus'].get(('a', (0, s)), '-')} / {got['cpus'].get(('b', (0, s)), '-')} |"
        lines.append(f"| {s} | {_fmt(x)} | {_fmt(y)} | {_fmt(y - x)} |{cpu}")
    if counted:
        lines.append(f"| mean ± SE{'' if counted == pairs else ' (the pairs in the test)'} | "
                     f"{pages.cell([a[0, s] for s in counted]).split(' [')[0]} | "
                     f"{pages.cell([b[0, s] for s in counted]).split(' [')[0]} | "
                     f"{_fmt(diff['effect'])} ± {_fmt(diff['se'])} |" + (" |" if _mixed(got, pairs) else ""))
    lines += ["", "SE: the standard deviation (ddof = 1) over the pairs / sqrt(n). The paired SE of b - a is what "
              "the test sees: below sqrt(SE_a^2 + SE_b^2) when a seed's two runs move together (what they share "
              "cancels), above it when they part.",
              "", "## How to read it", "", HOW_TO_READ, "",
              f"![curves of both arms per seed]({os.path.basename(png_path(out))})", ""]
    text = "\n".join(lines)
    with open(page_path(out) + ".tmp", "w") as f:
        f.write(text)
    os.replace(page_path(out) + ".tmp", page_path(out))
    plot(out, seeds, question, got, diff, f"a: {_flags(meta['a'])}; b: {_flags(meta['b'])}")
    data = {"question": {**question.record(), "key": question.metric.key},
            "pairs": [{"seed": s, "a": a.get((0, s)), "b": b.get((0, s))} for s in seeds],
            "difference": _record(diff), "equivalence": _record(equiv) if equiv else None}
    with open(os.path.join(out, "compare.json.tmp"), "w") as f:
        json.dump(data, f, indent=1, default=lambda x: None)
    os.replace(os.path.join(out, "compare.json.tmp"), os.path.join(out, "compare.json"))
    return judged


HOW_TO_READ = (
    "Each seed is a pair: both runs of a seed draw their training prompts, held-out set and samples from the same "
    "seeded streams, so they see the same batches until their weights differ enough to change a sampled token; "
    "b - a is the arms' difference and what it did to the chance that followed. "
    "p is exact: the share of the 2^n ways of flipping the signs of the n differences whose mean is at least as far "
    "from 0 as the one observed (experiments/exact_tests.py); it cannot go below its floor (2/2^n two-sided, "
    "1/2^n one-sided). The 80%-power effect is the true mean difference this many pairs, at the spread of "
    "differences seen, would detect 4 times in 5: \"no difference detected\" says nothing about effects smaller "
    "than it. Verdicts in the study's words (experiments/claims.py), computed by its code.")


def summary_line(rec: dict, question: Question) -> str:
    """'b - a = +0.012 ± 0.008 over 6 pairs; p 0.22 (two-sided, exact; floor 0.031); 80%-power effect 0.03.'"""
    if rec["verdict"] == "not testable":
        return f"Not testable: {rec['detail']}."
    power = (f"80%-power effect {_fmt(rec['power80'])}" if math.isfinite(rec["power80"])
             else f"no effect is detectable at 80% power with {rec['n']} pairs")
    return (f"b - a = {_signed(rec['effect'])} ± {_fmt(rec['se'])} (mean ± paired SE over {rec['n']} pairs); "
            f"exact sign-flip p {rec['p']:.4g} ({question.sided}-sided; the smallest p {rec['n']} pairs can give: "
            f"{rec['floor']:.4g}); {power}.")


def declared_text(question: Question, invocations: list[dict]) -> str:
    """Whether the question was declared before the runs: asked by the invocation that first ran
    any (its record), or asked of runs made to answer another (a re-reading, as the study marks
    a claim restated after its data: a direction chosen after seeing the numbers is no test)."""
    first = next((inv for inv in invocations if inv.get("ran")), None)
    if first is None or first.get("question") in (None, question.record()):
        return "declared before the runs"
    q = first["question"]
    return (f"*asked after the runs*, which were made to answer {q['metric']}, {q['direction']}"
            + (f", margin {q['margin']:g}" if q.get("margin") else "") + ": a re-reading, not a test declared before its data")


def machine_text(got: dict, pairs: list[int]) -> str:
    """The machine(s) and float path(s) the runs ran on, and whether both runs of each pair ran on one."""
    names = sorted({(r["machine"] or "not recorded") + (f", {(r['start'] or {}).get('float_path')} kernels"
                                                         if (r["start"] or {}).get("float_path") else "")
                    for r in got["records"].values()})
    across = _across(got, pairs)
    both = (f"both runs of each of the {len(pairs)} pairs ran on one CPU model and float path" if not across else
            f"{'pair' if len(across) == 1 else 'pairs'} {_seeds(across)} ran across CPU models or float paths and "
            f"{'is' if len(across) == 1 else 'are'} left out of the test, as the "
            "study leaves them out (another CPU rounds float sums differently)")
    return f"Machine: {'; '.join(names) or 'not recorded'}; {both}"


def time_text(out: str, got: dict, invocations: list[dict]) -> str:
    """Process-minutes of the runs (done.json), and each invocation's wall time and load."""
    seconds = [(pages.read_json(os.path.join(run_dir(out, arm, seed), "done.json")) or {}).get("seconds")
               for arm, seed in got["series"]]
    seconds = [s for s in seconds if s]
    text = (f"Run time: {sum(seconds) / 60:.1f} process-minutes over {len(seconds)} runs (train.py start to exit)"
            if seconds else "Run time: not recorded")
    for inv in invocations:
        if inv.get("ran"):
            load = inv.get("load") or {}
            cpu = f" ({inv['cpu_s'] / 60:.1f} CPU-minutes)" if inv.get("cpu_s") else ""
            text += (f"; {inv['started']}: {inv['ran']} run{'s' if inv['ran'] > 1 else ''} in "
                     f"{inv['wall_s'] / 60:.1f} min wall{cpu}, {inv['jobs']} at a "
                     f"time, load average (1 min) {load.get('mean', math.nan):.1f} (min {load.get('min', math.nan):.1f},"
                     f" max {load.get('max', math.nan):.1f}, these runs included) on {inv.get('cores', '?')} cores")
    return text


def plot(out: str, seeds: list[int], question: Question, got: dict, diff: dict, arms: str = "") -> str:
    """compare.png: per seed, the metric's curve of both arms with the metric marked; last, the
    differences b - a per seed with their mean ± paired SE.

    Marked: final_ (and final/KEY) a ring at the value read; mean_ (mean/KEY) a dashed line at
    the mean over the steps read; entropy_last10 the last TAIL steps shaded and their mean dashed.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = len(seeds) + 1
    cols = min(panels, 4)
    rows = math.ceil(panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.9 * rows), squeeze=False)
    key, metric = question.metric.key, question.metric
    for ax, seed in zip(axes.flat, seeds):
        for j, arm in enumerate(ARMS):
            s = got["series"].get((arm, seed))
            if s is None or key not in s:
                continue
            steps, vals = s[key]
            ax.plot(steps, vals, color=f"C{j}", lw=1.2, label=arm, marker="o" if metric.needs_eval else None, ms=2.5)
            train = {k: (st[st != 0], v[st != 0]) for k, (st, v) in s.items()}     # what the metric reads
            x = got["values"][ROW, arm].get((0, seed), math.nan)
            if not math.isfinite(x):
                continue
            if metric.kind == "final":
                ax.plot([train[key][0][-1]], [x], "o", ms=9, mfc="none", color=f"C{j}")
            elif metric.kind == "mean":
                ax.axhline(x, color=f"C{j}", ls="--", lw=0.9)
            else:
                tail = train[key][0][-TAIL:]
                ax.axvspan(tail[0], tail[-1], color="0.85", lw=0, zorder=0)
                ax.hlines(x, tail[0], tail[-1], color=f"C{j}", ls="--", lw=1.2)
        x_a, x_b = (got["values"][ROW, arm].get((0, seed), math.nan) for arm in ARMS)
        ax.set_title(f"seed {seed}: b - a = {_signed(x_b - x_a)}", fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    ax = axes.flat[len(seeds)]
    d = [(s, got["values"][ROW, "b"][0, s] - got["values"][ROW, "a"][0, s]) for s in seeds
         if (0, s) in got["values"][ROW, "a"] and (0, s) in got["values"][ROW, "b"]]
    if d:
        ax.plot([s for s, _ in d], [v for _, v in d], "o", color="k")
    ax.axhline(0, color="0.5", lw=0.8)
    if math.isfinite(diff["effect"]):
        ax.axhline(diff["effect"], color="C3", lw=1.2)
        if math.isfinite(diff["se"]):
            ax.axhspan(diff["effect"] - diff["se"], diff["effect"] + diff["se"], color="C3", alpha=0.15, lw=0)
    ax.set_title(f"b - a per seed; mean ± SE, p {_p(diff)}", fontsize=9)
    ax.set_xlabel("seed", fontsize=8)
    ax.set_xticks(seeds)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    for ax in list(axes.flat)[panels:]:
        ax.axis("off")
    fig.suptitle(f"{metric.name}: {metric.text}" + (f"   ({arms})" if arms else ""), fontsize=9, y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(png_path(out), dpi=90, metadata={"Software": None})
    plt.close(fig)
    return png_path(out)


def page_path(out: str) -> str:
    return os.path.join(out, "compare.md")


def png_path(out: str) -> str:
    return os.path.join(out, "compare.png")


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------

def _test_text(question: Question) -> str:
    side = ("two-sided (is b different from a?)" if question.direction == "two-sided" else
            f"one-sided, direction {question.direction} declared before the runs")
    text = f"exact sign-flip test of mean(b - a) = 0, {side}, at {ALPHA}"
    if question.margin:
        text += f"; equivalence within ±{question.margin:g} (TOST, two one-sided sign-flip tests)"
    return text


def _starts(got: dict) -> str:
    by_arm = {arm: sorted({((r["start"] or {}).get("sha256") or "not recorded")[:12]
                           for (a, _), r in got["records"].items() if a == arm}) for arm in ARMS}
    if by_arm["a"] == by_arm["b"]:
        return f"{' / '.join(by_arm['a']) or '-'} (both arms)"
    return "; ".join(f"{arm}: {' / '.join(h) or '-'}" for arm, h in by_arm.items())


def _across(got: dict, pairs: list[int]) -> list[int]:
    """The seeds whose two runs ran on different CPU keys (pages.cpu_model): left out of the test."""
    return [s for s in pairs if got["cpus"].get(("a", (0, s))) != got["cpus"].get(("b", (0, s)))]


def _mixed(got: dict, pairs: list[int]) -> bool:
    return bool(_across(got, pairs))


def _record(rec: dict) -> dict:
    return {k: rec[k] for k in ("n", "effect", "se", "p", "floor", "power80", "verdict", "detail")}


def _p(rec: dict) -> str:
    return "-" if math.isnan(rec["p"]) else claims.format_p(rec["p"], rec["floor"])


def _flags(flags: list[str], empty: str = "train.py's defaults") -> str:
    return shlex.join(flags) if flags else empty


def _seeds(seeds: list[int]) -> str:
    return ",".join(str(s) for s in seeds)


def _fmt(x: float) -> str:
    return pages.fmt(x)


def _signed(x: float) -> str:
    return "-" if not math.isfinite(x) else ("+" if x > 0 else "") + pages.fmt(x)
