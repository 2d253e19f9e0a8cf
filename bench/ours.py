"""ours.py: the benchmark's work, and our side of it: train.py run on the work and timed.

`python -m bench` (bench/__main__.py) compares our step with TRL's GRPOTrainer on identical
work (its header says what is compared and how); this file holds what both sides share and
ours:

  Work, work_rows    one step's work (train.py's flags of the same names) and the prompts
                     of every step, exactly as train.py draws them, replayed for TRL
  measure_ours       train.py on the work, each step timed from one sampling call to the
                     next, its split from train.py's own time/* metrics
  lower_bound        the minimum work of the same step, timed on its own rollouts
  ablation           each step replayed with and without the Llama decoder and shared prompts
  pool, med, mean    the measured steps of several runs as one, and their medians
  peak memory        reset_peak_rss / peak_rss_mb: the process's peak resident set size

It imports no other bench file: trl_trainer.py (TRL's side), smollm2.py (the real model)
and __main__.py (the command line and the report) import it.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import tempfile
import time
from dataclasses import dataclass

import torch

import tasks
import verify
from machinery import logprobs, rollout

N_PROMPTS, G_DEFAULT, MAX_NEW_DEFAULT = 32, 8, 48


# ---------------------------------------------------------------------------------------
# The work: the prompts of every step, exactly as train.py draws them
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Work:
    """One benchmark step's work, the same for both trainers (train.py's flags of the same names).

    The default is the embedded model's work (32 prompts x 8 rollouts, <= 48 new tokens,
    T = 1, lr 4e-4); smollm2.SMOLLM2 is the real model's.
    """

    model: str = "tiny"
    data: str = "addition"
    digits: int = 3
    prompts_per_step: int = N_PROMPTS
    group_size: int = G_DEFAULT
    max_new_tokens: int = MAX_NEW_DEFAULT
    temperature: float = 1.0
    lr: float = 4e-4
    chat_template: bool = False

    def flags(self) -> list[str]:
        """train.py's flags for this work (--digits only for the addition tasks, the ones that read it)."""
        return (["--model", self.model, "--data", self.data, "--prompts_per_step", str(self.prompts_per_step),
                 "--group_size", str(self.group_size), "--max_new_tokens", str(self.max_new_tokens),
                 "--temperature", str(self.temperature), "--lr", str(self.lr)]
                + (["--digits", str(self.digits)] if self.data.startswith("addition") else [])
                + (["--chat_template"] if self.chat_template else []))


def train_seconds(step: dict) -> float:
    """Seconds of one measured step's training: the advantages, the split and the update."""
    return sum(step["split"][stage] for stage in ("advantages", "split", "update"))


def work_rows(n_steps: int, seed: int, work: Work = Work()) -> list[list[dict]]:
    """[step][prompt] rows ({prompt, answer}): train.py's stream, replayed.

    train.py draws run.train_rows[run.py_rng.randrange(len(run.train_rows))] N times per
    step, with run.py_rng = random.Random(cfg.seed) and run.train_rows = tasks.load(
    cfg.data, "train", seed=cfg.seed, digits=cfg.digits). If train.py ever draws differently,
    the check in `compare` fails loudly rather than comparing different work.
    """
    rows, _ = tasks.load(work.data, "train", seed=seed, digits=work.digits)
    rng = random.Random(seed)
    return [[rows[rng.randrange(len(rows))] for _ in range(work.prompts_per_step)] for _ in range(n_steps)]


# ---------------------------------------------------------------------------------------
# Our side
# ---------------------------------------------------------------------------------------

def run_ours(n_steps: int, work: Work, seed: int, threads: int, micro_batch: int, compiled: bool = False,
             extra: tuple = (), out_dir: str | None = None) -> tuple[list[dict], object, object]:
    """train.py on the benchmark work; returns its per-step metrics, its Run and its Config.

    The ONE place that knows train.py's API: if it changes, fix this function only.
    extra: more of train.py's flags, after (and so winning over) these, e.g. --no-skip_zero_adv.
    """
    import train

    out_dir = out_dir or tempfile.mkdtemp(prefix="bench-ours-")
    cfg = train.parse_args(["--steps", str(n_steps), *work.flags(), "--seed", str(seed), "--threads", str(threads),
                            "--micro_batch", str(micro_batch), "--eval_every", "0", "--save_every", "0",
                            "--flip_every", "0", "--share_prompts", "--out_dir", out_dir]
                           + (["--compile"] if compiled else []) + list(extra))
    run = train.setup(cfg)
    return train.train(cfg, run), run, cfg


@contextlib.contextmanager
def timed_rollout():
    """Mark each of train.py's steps: wrap rollout.generate_rollouts while train.py runs.

    Yields a list that receives one record per rollout.generate_rollouts call (= one
    training step): its prompts (for the identical-work check), the wall and CPU clock
    at its start, the sampling seconds, and the generated tokens. train.py calls the
    function through the module, so replacing the module's attribute is enough; it is
    restored on exit. The rest of the split comes from train.py's own time/* metrics.
    """
    saved = rollout.generate_rollouts
    records = []

    def generate_rollouts(model, tokenizer, prompts, *args, **kwargs):
        rec = {"prompts": list(prompts), "wall": time.perf_counter(), "cpu": time.process_time()}
        rollouts = saved(model, tokenizer, prompts, *args, **kwargs)
        rec["sample"] = time.perf_counter() - rec["wall"]
        rec["tokens"] = float(rollouts.response_mask.sum())
        rec["rollouts"] = rollouts
        records.append(rec)
        return rollouts

    rollout.generate_rollouts = generate_rollouts
    try:
        yield records
    finally:
        rollout.generate_rollouts = saved


def measure_ours(warmup: int, steps: int, work: Work, seed: int, threads: int, micro_batch: int,
                 compiled: bool = False, ablate: bool = False, bound: bool = True, extra: tuple = (),
                 out_dir: str | None = None) -> dict:
    """Run warmup + steps + 1 steps of ours; per-step numbers of the `steps` measured ones
    (with `bound`, each step's lower bound; with `ablate`, each also replayed with and without
    our two newest speed-ups: ablation)."""
    reset_peak_rss()
    with timed_rollout() as recs:
        history, run, cfg = run_ours(warmup + steps + 1, work, seed, threads, micro_batch, compiled, extra, out_dir)
    model = run.model
    out = {"peak_rss_mb": peak_rss_mb(), "prompts": [r["prompts"] for r in recs], "steps": [], "records": recs}
    rows = work_rows(warmup + steps + 1, seed, work)
    for k in range(warmup, warmup + steps):
        m, rec, nxt = history[k], recs[k], recs[k + 1]
        split = {key[len("time/"):]: value for key, value in m.items()          # train.py's stages, in its order
                 if key.startswith("time/") and key not in ("time/elapsed", "time/evaluate")}
        wall, cpu = nxt["wall"] - rec["wall"], nxt["cpu"] - rec["cpu"]
        split["other"] = wall - sum(split.values())
        out["steps"].append({"wall": wall, "cpu": cpu, "reward": m["reward"], "tokens": rec["tokens"],
                             "sample": rec["sample"], "split": split, "skipped": m["frac_skipped"],
                             "duplicate": m["frac_duplicate"],
                             "bound": lower_bound(model, rec["rollouts"], rows[k], work.data, micro_batch) if bound else None,
                             "ablation": ablation(run, cfg, rec["rollouts"], rows[k], work, seed + k) if ablate else None})
    return out


def lower_bound(model, rollouts, rows: list[dict], task: str, micro_batch: int) -> dict:
    """The cost of a step's minimum work, timed on that step's own rollouts (wall and CPU s).

    The minimum work of an on-policy step: one no-grad forward over every sampled token
    (logprobs.token_logprobs over all B rollouts, prompt and response, teacher-forced), plus
    one forward and backward over the rollouts that carry gradient (GRPO advantage not 0),
    each distinct rollout once; both in length-sorted chunks of micro_batch rollouts. A
    sampler cannot draw the tokens with less than the first (it must compute every
    token's distribution), an update cannot do with less than the second if every
    rollout runs its own forward. (Ours can go below it only by computing less than a
    forward per rollout: share_prompts.) Returns {"wall", "cpu", "forward", "update"}.
    """
    from advantages import compute_advantages
    from machinery import forward

    scores = verify.score(rollouts.texts, [r["answer"] for r in rows for _ in range(rollouts.G)], tasks.get(task),
                          [r["prompt"] for r in rows for _ in range(rollouts.G)])
    adv = compute_advantages("grpo", verify.reward_tensor(scores).view(len(rows), rollouts.G)).reshape(-1)
    lengths = rollouts.response_mask.sum(1)
    carry = (adv != 0).nonzero().squeeze(1)
    was_training = model.training
    t0, c0 = time.perf_counter(), time.process_time()
    model.eval()
    with torch.no_grad():
        for idx in lengths.argsort(stable=True).split(micro_batch):
            logprobs.token_logprobs(model, *forward.batch_inputs(rollouts, idx, model.device))
    t1 = time.perf_counter()
    model.train()
    for idx in carry[lengths[carry].argsort(stable=True)].split(micro_batch):
        logp, _ = logprobs.token_logprobs(model, *forward.batch_inputs(rollouts, idx, model.device),
                                          merge_duplicates=True)
        (logp * adv[idx].unsqueeze(1)).sum().backward()
    t2, c2 = time.perf_counter(), time.process_time()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    nodes, tokens = prefix_tree_size(rollouts, carry)
    return {"wall": t2 - t0, "cpu": c2 - c0, "forward": t1 - t0, "update": t2 - t1,
            "tree_nodes": nodes, "tree_tokens": tokens}


def prefix_tree_size(rollouts, rows: torch.Tensor) -> tuple[int, int]:
    """(nodes, tokens): a prefix tree over each group's responses among `rows`, and their tokens.

    A response position whose prefix (prompt and the response before it) another rollout
    of the group shares computes the same hidden state in both, so an update could run it
    once. tokens - nodes is how many such repeats there are, the most that sharing
    response prefixes (as share_prompts shares prompts) could take off the update.
    """
    lengths = rollouts.response_mask.sum(1).long()
    prefixes = set()
    for i in rows.tolist():
        seq = tuple(rollouts.response_ids[i, :lengths[i]].tolist())
        prefixes.update((i // rollouts.G, seq[:t]) for t in range(1, len(seq) + 1))
    return len(prefixes), int(lengths[rows].sum())


def ablation(run, cfg, rollouts, rows: list[dict], work: Work, seed: int) -> dict:
    """CPU seconds of this step's sampling and update, each done both ways, paired.

    The sampler: the step's prompts sampled again from the same seed with the Llama
    decoder and with the transformers one (machinery/decoding.py; the same tokens, checked
    here). The update: its forward and backward over the rollouts with gradient, with
    shared prompts and with each rollout's own prompt (forward.share_prompts), gradients
    discarded. The two ways alternate which goes first from one step to the next, so a
    neighbour's load hits both alike. Returns {"llama", "transformers", "shared", "plain"}.
    """
    from advantages import compute_advantages
    from machinery import decoding, forward

    out, first = {}, seed % 2
    plain_decoder = lambda model, ids, mask, *rest: decoding.TransformersDecoder(model, ids, mask)
    tokens = {}
    for name in (("llama", "transformers") if first else ("transformers", "llama")):
        saved = decoding.make_decoder
        decoding.make_decoder = saved if name == "llama" else plain_decoder
        try:
            torch.manual_seed(seed)
            c = time.process_time()
            tokens[name] = rollout.generate_rollouts(run.model, run.tokenizer, rollouts.prompts, rollouts.G,
                                                     work.max_new_tokens, temperature=work.temperature,
                                                     chat_template=work.chat_template).response_ids
            out[name] = time.process_time() - c
        finally:
            decoding.make_decoder = saved
    if not torch.equal(tokens["llama"], tokens["transformers"]):
        raise RuntimeError("the two decoders drew different tokens: the ablation compares different work")
    scores = verify.score(rollouts.texts, [r["answer"] for r in rows for _ in range(rollouts.G)], tasks.get(work.data),
                          [r["prompt"] for r in rows for _ in range(rollouts.G)])
    adv = compute_advantages("grpo", verify.reward_tensor(scores).view(len(rows), rollouts.G)).reshape(-1)
    B = len(adv)
    micro = forward.micro_batches(torch.arange(B), adv != 0, torch.arange(B) // rollouts.G, rollouts.response_mask.sum(1),
                                  cfg.update.micro_batch, run.whole_groups)
    run.model.train()
    for name in (("shared", "plain") if first else ("plain", "shared")):
        c = time.process_time()
        prompts = (forward.share_prompts(run.train_model, rollouts, micro, cfg.update.micro_batch, run.sharing_off)
                   if name == "shared" else None)
        for idx in micro:
            logp, _ = forward.forward(run.train_model, rollouts, idx, run.update, run.sampling.temperature,
                                      prompts=prompts)
            (logp * adv[idx].unsqueeze(1)).sum().backward()
        forward.backward_prompts(prompts)
        out[name] = time.process_time() - c
        run.model.zero_grad(set_to_none=True)
    run.model.eval()
    return out


# ---------------------------------------------------------------------------------------
# The measured steps of several runs, and the process's peak memory
# ---------------------------------------------------------------------------------------

def pool(results: list[dict]) -> dict:
    """The measured steps of several runs of one trainer as one run (max peak memory)."""
    out = dict(results[0])
    out["steps"] = [s for r in results for s in r["steps"]]
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in results)
    for r in results[1:]:
        if r["prompts"] != results[0]["prompts"]:
            raise RuntimeError("two runs of the same trainer saw different prompts")
    return out


def med(steps: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in steps)


def mean(steps: list[dict], key: str) -> float:
    return sum(s[key] for s in steps) / len(steps)


def reset_peak_rss() -> None:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0: write 5 to clear_refs)."""
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")


def peak_rss_mb() -> float:
    """Peak resident set size since the last reset (VmHWM), in MB; ru_maxrss elsewhere."""
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
