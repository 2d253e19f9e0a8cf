"""summaries.py: what the sweeps say together: the study's page (claims.md) and the README's summary.

    python -m experiments.sweep report      # writes both, after every sweep's page (experiments/pages.py)

A sweep's page (pages.write_page) is one sweep on one task, with its runs, checks and
findings. This file reads the results of every page at once and writes the two places
where a reader meets them side by side:

- claims.md, beside the sweeps' pages (experiments/results/): one line per sweep (its
  verdict counts per task and its checks), then every claim on one line, its verdict per
  task, linked to the page that measured it; the papers' findings first, then our own
  questions (claims of no paper, marked OURS in the designs), then the implementation
  checks, one line per sweep.
- the README's summary, between the markers TABLES_BEGIN and TABLES_END: one line per
  task, the papers' findings' verdicts and the checks summed over its sweeps, and a link
  to claims.md.

A sweep that is not fully run, or whose data predates recorded flags, shows why it has no
verdict ("k of n runs", "earlier design", "not run") instead of one: a partial sweep's
verdicts are not the test its claims were declared with. Nothing here computes a
statistic: the verdicts come from experiments/claims.py through each page's results.
"""

from __future__ import annotations

import os

from experiments.designs import OURS, TASKS, runs_on
from experiments.registry import SWEEPS


TABLES_BEGIN, TABLES_END = "<!-- claims:begin -->", "<!-- claims:end -->"
VERDICT_ORDER = ("agrees", "opposite", "no difference detected", "no equivalence shown", "no non-inferiority shown",
                 "not testable")
"""The README's summary counts the verdicts in this order (experiments/claims.py's verdicts)."""
CLAIMS_PAGE = "claims.md"
"""The study's page, beside the sweeps' pages: every sweep and every claim, one line each (written by report)."""
TASK_LABELS = {"countdown": "the 342k-parameter character model on Countdown",
               "addition": "the character model on addition with written-out carries",
               "smollm2": "SmolLM2-135M-Instruct on chat-worded addition"}
"""How the summaries name a task: the model it trains matters as much as the task."""


def verdict_cells(results: dict) -> dict:
    """{(task, sweep): ...} what the tables show of one sweep on one task.

    "status": why no verdict is shown ("not run", "k of n runs": a sweep not fully run,
    "earlier design": data without recorded flags), or None when the verdicts count;
    "verdicts": {claim text: verdict}; "checks": {result: how many}.
    """
    cells = {}
    for task in TASKS:
        for name in SWEEPS:
            res = results.get((task, name))
            if not runs_on(task, name):
                cells[task, name] = {"status": "not declared", "verdicts": {}, "ours": {}, "checks": {}}
                continue
            if res is None:
                cells[task, name] = {"status": "not run", "verdicts": {}, "ours": {}, "checks": {}}
                continue
            status = ("earlier design" if not res["recorded"] else
                      f"{res['done']} of {res['planned']} runs" if res["done"] < res["planned"] else None)
            cells[task, name] = {"status": status,
                                 "verdicts": {v["claim"].text: v["verdict"] for v in res["verdicts"]
                                              if v["claim"].paper != OURS},
                                 "ours": {v["claim"].text: v["verdict"] for v in res["verdicts"]
                                          if v["claim"].paper == OURS},
                                 "checks": {r: n for r in ("pass", "FAIL", "not measured", "met", "NOT MET")
                                            if (n := sum(c["result"] == r for c in res["checks"] if not held(c)))},
                                 "held": {r: n for r in ("met", "NOT MET", "not measured")
                                          if (n := sum(c["result"] == r for c in res["checks"] if held(c)))}}
    return cells


def _shown(verdict: str) -> str:
    """A verdict as a table shows it: agrees and opposite in bold (they are the news)."""
    return f"**{verdict}**" if verdict in ("agrees", "opposite") else verdict


def held(check_record: dict) -> bool:
    """Whether a check record is a held-fixed check's (held_fixed.run_held), not an identity's or a precondition's."""
    return check_record["check"].kind == "held fixed"


def _checks_text(checks: dict, held_counts: dict | None = None) -> str:
    """'3 pass, 1 **FAIL**' and, when a sweep has preconditions, '; preconditions: 1 met, 1 NOT MET',
    and held-fixed checks, '; held fixed: 1 met, 1 NOT MET'."""
    identity = ", ".join(f"{n} {'**FAIL**' if r == 'FAIL' else r}" for r, n in checks.items()
                         if r in ("pass", "FAIL", "not measured")) or "none measured"
    pre = ", ".join(f"{n} {r}" for r, n in checks.items() if r in ("met", "NOT MET"))
    kept = ", ".join(f"{n} {r}" for r, n in (held_counts or {}).items())
    return identity + (f"; preconditions: {pre}" if pre else "") + (f"; held fixed: {kept}" if kept else "")


def sweep_summary_table(results: dict, link=lambda task, name: f"sweep_{task}_{name}.md") -> list[str]:
    """One line per sweep: how many findings it declares, and per task how they came out
    (verdict counts; or "k of n runs", "earlier design", "not run", which give no verdict)
    and its implementation checks, linked to the sweep's page (`link(task, name)`)."""
    tasks, cells = list(TASKS), verdict_cells(results)

    def summary(task: str, name: str) -> str:
        c = cells[task, name]
        if c["status"] in ("not run", "not declared"):
            return "-" if c["status"] == "not declared" else "not run"
        def tally(verdicts: list[str]) -> str:
            return ", ".join(f"{verdicts.count(v)} {_shown(v)}" for v in VERDICT_ORDER if v in verdicts)
        papers, ours = tally(list(c["verdicts"].values())), tally(list(c["ours"].values()))
        findings = c["status"] or "; ".join(x for x in (papers, ours and f"ours: {ours}") if x) or "no findings"
        return f"[{findings}]({link(task, name)}); checks: {_checks_text(c['checks'], c['held'])}"

    lines = ["| sweep | findings (papers' + ours) | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    for name, make in SWEEPS.items():
        counts = {t: (sum(c.paper != OURS for c in make(t).claims), sum(c.paper == OURS for c in make(t).claims))
                  for t in tasks if runs_on(t, name)}
        text = lambda n: f"{n[0]}" + (f" + {n[1]}" if n[1] else "")
        findings = text(next(iter(counts.values()))) if len(set(counts.values())) == 1 else \
            " / ".join(text(counts[t]) if t in counts else "-" for t in tasks)
        lines.append(f"| {name} | {findings} | " + " | ".join(summary(t, name) for t in tasks) + " |")
    return lines


def write_readme_tables(readme: str, results: dict, claims_page: str) -> str:
    """Replace the README's text between the markers with a short summary: per task, how
    many of the papers' findings each verdict got and how the checks came out, and a link
    to the study's page (`claims_page`, written by write_claims_page), where every sweep and
    every claim has its line. Only sweeps fully run count (a partial sweep's verdicts are
    not the test its claims were declared with)."""
    cells = verdict_cells(results)
    link = os.path.relpath(claims_page, os.path.dirname(os.path.abspath(readme)))
    lines = [TABLES_BEGIN, "",
             f"What every sweep says, claim by claim, per task: [{link}]({link}).", "",
             "| task | sweeps fully run | the papers' findings | checks |", "|---|---|---|---|"]
    for task in TASKS:
        done = [n for n in SWEEPS if runs_on(task, n) and cells[task, n]["status"] is None]
        verdicts = [v for n in done for v in cells[task, n]["verdicts"].values()]
        counts = ", ".join(f"{verdicts.count(v)} {_shown(v)}" for v in VERDICT_ORDER if v in verdicts) or "-"
        checks = {}
        for n in done:
            for r, k in cells[task, n]["checks"].items():
                checks[r] = checks.get(r, 0) + k
        pending = [n for n in SWEEPS if runs_on(task, n) and cells[task, n]["status"] is not None]
        # a pilot (a sweep that declares neither claims nor checks, like smollm2's edge lr) is
        # not one of the study's sweeps: counted apart
        pilots = [n for n in done if not SWEEPS[n](task).claims and not SWEEPS[n](task).checks]
        lines.append(f"| {task}: {TASK_LABELS.get(task, task)} | {len(done) - len(pilots)}"
                     + (f" (+{len(pilots)} pilot{'s' if len(pilots) > 1 else ''})" if pilots else "")
                     + (f" ({len(pending)} pending)" if pending else "")
                     + f" | {counts} | {_checks_text(checks) if checks else '-'} |")
    lines += ["", TABLES_END]
    text = open(readme).read()
    if TABLES_BEGIN in text and TABLES_END in text:
        head, rest = text.split(TABLES_BEGIN, 1)
        _write(readme, head + "\n".join(lines) + rest.split(TABLES_END, 1)[1])
    return readme


def write_claims_page(path: str, results: dict) -> str:
    """experiments/results/claims.md: the findings, one line per claim and one verdict cell per task,
    each linked to its sweep's page; then the implementation checks, one line per sweep.

    A sweep not fully run shows "k of n runs"; data of an earlier design "earlier design";
    no data "not run": none of them is a verdict.
    """
    tasks, cells = list(TASKS), verdict_cells(results)
    lines = ["# The study: the papers' claims on real training", "",
             "Written by `python -m experiments.sweep report` from the committed per-run data "
             "(`sweep_TASK_NAME.jsonl.gz`, beside this page) and any finished runs; do not edit by hand. How the "
             "sweeps are designed and what we read in them: "
             "[docs/results.md](../../docs/results.md#the-papers-claims-on-real-training). Tasks: "
             + "; ".join(f"**{t}**, {TASK_LABELS.get(t, t)}" for t in tasks) + ".", "",
             "## Every sweep", "", "One line per sweep: its findings' verdicts per task, its implementation checks, "
             "its page.", "", *sweep_summary_table(results), "",
             "## Every claim", "",
             "**Findings** (claims that could have failed; each page quotes the sentence tested and gives the "
             "effect, its paired SE and p). Exact paired tests over (warm-up seed, RL seed) pairs, Holm's "
             "correction within each family the sweep declares.", "",
             "| sweep | claim | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    declared = {name: _declared(name) for name in SWEEPS}       # name -> {task: {text: claim}}

    def claim_row_cells(name: str, claim, kind: str) -> str:
        """The claim's cell per task ("verdicts" or "ours" of verdict_cells): its verdict,
        linked to the sweep's page; "-" where the task does not declare it. *re-read* per
        cell: the same sentence can be declared before its runs on one task (smollm2's credit)
        and restated after them on another."""
        row = []
        for task in tasks:
            c, page = cells[task, name], f"sweep_{task}_{name}.md"
            shown = c["status"] or _shown(c[kind].get(claim.text, "not run"))
            mine = declared[name].get(task, {}).get(claim.text)
            reread = " *re-read*" if mine is not None and mine.posthoc else ""
            row.append("-" if mine is None else
                       shown + reread if c["status"] == "not run" else f"[{shown}]({page}){reread}")
        return " | ".join(row)

    for name in SWEEPS:
        for claim in _claims_of(name):
            if claim.paper != OURS:
                lines.append(f"| {name} | {claim.text} | "
                             f"{claim_row_cells(name, claim, 'verdicts')} |")
    ours = [(name, claim) for name in SWEEPS for claim in _claims_of(name) if claim.paper == OURS]
    if ours:
        lines += ["", "**Our own questions** (claims of no paper: a mode or a measure this project added; "
                  "not counted with the papers' findings):", "",
                  "| sweep | claim | " + " | ".join(tasks) + " |", "|---|---|" + "---|" * len(tasks)]
        for name, claim in ours:
            lines.append(f"| {name} | {claim.text} | {claim_row_cells(name, claim, 'ours')} |")
    if any(c.posthoc for name in SWEEPS for claims in declared[name].values() for c in claims.values()):
        lines += ["", "*re-read*: a claim restated after its runs were public and read again on the same runs, "
                  "not a test declared before its data."]
    lines += ["", "**Implementation checks** (identities the code must satisfy, measured on every run; "
              "preconditions: what a finding needs of the training, met or not):", "",
              "| sweep | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for name in SWEEPS:
        row = []
        for task in tasks:
            c = cells[task, name]
            row.append("-" if c["status"] == "not declared" else "not run" if c["status"] == "not run"
                       else f"[{_checks_text(c['checks'])}](sweep_{task}_{name}.md)")
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    _write(path, "\n".join(lines) + "\n")
    return path


def _claims_of(name: str) -> list:
    """The sweep's claims on every task it is declared on, each text once, in TASKS' order
    (most sweeps declare the same claims on every task; the dose sweep's doses differ)."""
    claims = {}
    for task in TASKS:
        if runs_on(task, name):
            for claim in SWEEPS[name](task).claims:
                claims.setdefault(claim.text, claim)
    return list(claims.values())


def _declared(name: str) -> dict:
    """{task: {text: claim} of the claims the sweep declares on it}, for the tasks it runs on."""
    return {task: {c.text: c for c in SWEEPS[name](task).claims} for task in TASKS if runs_on(task, name)}


def _write(path: str, text: str) -> None:
    """Write a file atomically (a temporary file renamed into place)."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)



FINDINGS_BEGIN, FINDINGS_END = "<!-- findings:begin -->", "<!-- findings:end -->"


def write_findings_block(path: str, results: dict) -> str:
    """Replace the text between FINDINGS_BEGIN and FINDINGS_END of the study's prose
    (docs/results.md) with every finding's numbers, as experiments/claims.py judged them.

    Per finding: the claim as declared and its source sentence (numbered, listed once at
    the end), n, the effect ± its paired SE, the exact p, Holm's p and the family's size m
    under the families as declared and under one family per sweep, the effect detectable at
    80% power (the primary reading's), and the verdict under each reading (the sweep's
    primary one first: Sweep.holm). So what the prose may say of a finding is here, computed,
    and a sentence cannot quietly say more than its test (tests/study/test_cause_words.py
    holds the prose to it). A sweep not fully run gives its numbers and no verdict.
    """
    from experiments.claims import _fmt, format_p            # the pages' number formats
    quotes: dict[str, int] = {}
    lines = [FINDINGS_BEGIN, "",
             "Written by `python -m experiments.sweep report` from the committed data; do not edit by hand. "
             "Holm's p is given under both readings, the families as each design declared them and one family "
             "per sweep (m: the family's size); the verdict of the sweep's primary reading comes first. "
             "\"-\": not testable, or not run.", ""]
    for (task, name), res in results.items():
        if not res["verdicts"]:
            continue
        sweep = SWEEPS[name](task)
        one = sweep.holm == "sweep"
        status = ("earlier design: no verdict" if not res["recorded"] else
                  f"INCOMPLETE, {res['done']} of {res['planned']} runs: no verdict" if res["done"] < res["planned"]
                  else "primary reading: " + ("one family per sweep" if one else "the declared families"))
        lines += [f"**{task} / {name}** ([page](../experiments/results/sweep_{task}_{name}.md); {status})", "",
                  "| # | claim | source | n | effect ± SE | p | Holm p, declared (m) | Holm p, one family (m) | "
                  "80%-power effect | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
        for i, r in enumerate(res["verdicts"], 1):
            c = r["claim"]
            number = quotes.setdefault(c.quote, len(quotes) + 1)
            as_declared, as_one = ("_declared", "") if one else ("", "_sweep")      # the records' key suffixes
            decl_p, decl_m = r.get("p_holm" + as_declared, float("nan")), r.get("family" + as_declared, 0)
            one_p, one_m = r.get("p_holm" + as_one, float("nan")), r.get("family" + as_one, 0)
            show = lambda x: "-" if x != x else f"{x:.4f}"
            readings = (r["verdict"], r.get("verdict_declared" if one else "verdict_sweep", r["verdict"]))
            verdict = ("-" if status.startswith(("INCOMPLETE", "earlier")) else
                       f"**{readings[0]}**" + ("" if readings[1] == readings[0] else
                                               f"; {'declared families' if one else 'one family per sweep'}: "
                                               f"{readings[1]}"))
            effect = "-" if r["effect"] != r["effect"] else f"{_fmt(r['effect'])} ± {_fmt(r['se'])}"
            power = r.get("power80", float("nan"))
            lines.append(f"| {i} | {c.text}{' *re-read*' if c.posthoc else ''}{' (ours)' if c.paper == OURS else ''} "
                         f"| [{number}] | {r['n'] or '-'} | {effect} | "
                         f"{'-' if r['p'] != r['p'] else format_p(r['p'], r['floor'])} | "
                         f"{show(decl_p)} ({decl_m}) | {show(one_p)} ({one_m}) | "
                         f"{'-' if power != power else _fmt(power)} | {verdict} |")
        lines.append("")
    lines += ["Sources, verbatim:", "", *[f"{n}. \"{q}\"" for q, n in quotes.items()], "", FINDINGS_END]
    text = open(path).read()
    if FINDINGS_BEGIN in text and FINDINGS_END in text:
        head, rest = text.split(FINDINGS_BEGIN, 1)
        _write(path, head + "\n".join(lines) + rest.split(FINDINGS_END, 1)[1])
    return path
