"""flags.py: a dataclass config as command-line flags, with its docstrings as help.

train.py's settings are one dataclass (machinery/config.py's `Config`) that nests one
dataclass per part of the run, each defined in the file that reads it: the objective's
(`loss.LossConfig`), the schedule's (`scheduler.SchedulerConfig`), the sampling's
(machinery/sampler.py), the update's (machinery/forward.py), the evaluation's
(machinery/evaluation.py) and the token diagnostics' (machinery/token_diagnostics.py).
Each owns its fields, their defaults and their checks (its __post_init__); this file only
turns such a tree into argparse flags and back, so there is one source of truth and no
adapter in between:

    --lr 1e-3 --loss_type gspo --schedule fade --micro_batch 8    (flat names, whichever part owns them)

- every field that is not itself a dataclass is a flag under its own name; two fields
  with the same name anywhere in the tree are a programming error (asserted);
- the default is the field's value in the default instance (so train.py's Config's
  `sched=SchedulerConfig(schedule="constant")` shows "constant", not the class default);
- the help text is the one-line docstring under the field (read from the source, the
  convention cleanrl's configs use), or the field's metadata["help"] for a field made
  by code (the advantages' hyper-parameters, machinery/config.py);
- every field of the engine's parts declares what --resume may do with it, in its
  metadata (RESUME below), and the chapters' (the objective's, the schedule's) are FIXED:
  machinery/config.py derives the resume check from that (resume_rules);
- a field typed `X | None` takes the word "none" for None; a bool is --flag / --no-flag;
- a float flag must be a finite number: "nan" and "inf" parse as floats, and NaN passes
  every range check written as `x < 0` (each comparison is False), so they are refused
  here, for every float flag at once, naming the flag;
- `--config PATH` reads the same fields from a file: a run's config.json (nested as
  dataclasses.asdict writes it, or flat as runs wrote it before the parts were nested)
  or a YAML file (flat or nested). The file replaces the defaults, and every flag on the
  command line wins over the file (TRL's TrlParser does the same with its --config);
- flags are matched whole (no argparse abbreviations: `--temp` would silently mean
  --temperature today and fail once another flag starts with it); an unknown flag a
  user of another framework types gets a hint naming ours (`hints`);
- any parse error is ONE line on stderr and exit code 2, not argparse's usage dump.

The checks at the door that the entry points share (paths, the lock, the hub) are in
machinery/checks.py.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import math
import os

# What --resume may do with a field, declared on the field: field(default=..., metadata=FIXED)
# (the chapters' configs declare nothing: all FIXED, machinery/config.py CHAPTER_CONFIGS).
# A checkpoint records the config it was trained with, and a resume compares every field
# with the new one (resume.resume_point), refusing a change to any FIXED field.
RESUME = "resume"                          # the metadata key every leaf field declares
MAY_CHANGE = {RESUME: "may change"}        # when the run stops, evaluates or saves, how fast, where it reports
FIXED = {RESUME: "fixed"}                  # the run's math: a resume refuses a new value
NOT_COMPARED = {RESUME: "not compared"}    # where and how this invocation runs (the directory may be moved)
RESUME_RULES = tuple(rule[RESUME] for rule in (MAY_CHANGE, FIXED, NOT_COMPARED))


def leaf_fields(root) -> list[tuple[str, object, dataclasses.Field]]:
    """(group, part, field) for every leaf field of the dataclass instance `root`.

    group: "" for root's own fields, else the name of the nested dataclass that holds it
    (one level of nesting: root.loss, root.sched, ...); part: that dataclass instance.
    A leaf is a field whose value is not itself a dataclass: one flag each.
    """
    groups = {"": root, **{f.name: getattr(root, f.name) for f in dataclasses.fields(root)
                           if dataclasses.is_dataclass(getattr(root, f.name))}}
    return [(group, part, f) for group, part in groups.items() for f in dataclasses.fields(part)
            if not dataclasses.is_dataclass(getattr(part, f.name))]


def flat_fields(tree: dict) -> dict:
    """{flag name: value} of a config as dataclasses.asdict or a config.json holds it, nested or flat.

    Names are unique across the parts (parse_flags asserts it), so flattening loses
    nothing: {"seed": 0, "update": {"micro_batch": 8}} and the flat {"seed": 0,
    "micro_batch": 8} an earlier run wrote both give {"seed": 0, "micro_batch": 8}.
    """
    return {k: v for key, value in tree.items()
            for k, v in (flat_fields(value).items() if isinstance(value, dict) else [(key, value)])}


def parse_flags(root, argv: list[str] | None, description: str, prog: str, hints: dict | None = None,
                not_from_file: tuple = ()) -> dict:
    """Parse argv against the fields of the dataclass instance `root` and its nested ones.

    Returns {"": {field: value} of root, "<name>": {field: value} of root.<name>, ...} for
    one level of nesting, so the caller builds the nested configs first (their own
    __post_init__ checks run) and then the root. Exits 2 with one line on a bad flag.
    hints: {name: one line} for flags another framework has and this one calls otherwise
    (an unknown --name, or key in a --config file, gets its line). not_from_file: fields
    a --config file may hold but does not set (train.py: resume and overwrite say what
    one invocation does with its directory, not what the run is).
    """
    parser = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.error = lambda message: parser.exit(2, f"{prog}: error: {message}\n")
    parser.add_argument("--config", metavar="PATH", default=None,
                        help="start from a run's config.json or a YAML file of the same fields; flags win over it")
    groups = {"": root, **{f.name: getattr(root, f.name) for f in dataclasses.fields(root)
                           if dataclasses.is_dataclass(getattr(root, f.name))}}
    owner, types = {}, {}
    for group, part, f in leaf_fields(root):
        assert f.name not in owner, f"flag --{f.name} is declared twice"
        owner[f.name], types[f.name] = group, f.type
        default, help_text = getattr(part, f.name), f.metadata.get("help") or field_docs(type(part)).get(f.name, "")
        if f.type == "bool":
            parser.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=default,
                                help=help_text)
        else:
            parser.add_argument(f"--{f.name}", type=flag_type(f.type), default=default, help=help_text)
    hints = hints or {}
    path = parser.parse_known_args(argv)[0].config
    if path is not None:
        try:
            values = read_config_file(path, types, set(groups) - {""}, hints)
        except ValueError as e:
            parser.error(f"--config {path}: {e}")
        parser.set_defaults(**{k: v for k, v in values.items() if k not in not_from_file})
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        name = unknown[0].split("=")[0].lstrip("-")
        parser.error(f"unrecognized argument {unknown[0]}" + (f": {hints[name]}" if name in hints else ""))
    args = vars(args)
    del args["config"]
    return {group: {k: v for k, v in args.items() if owner[k] == group} for group in groups}


def read_config_file(path: str, types: dict, nested: set, hints: dict) -> dict:
    """{flag: value} from a .json or .yaml/.yml file; ValueError (one line) naming what is wrong.

    The file holds the flags' fields, flat (`lr: 1.0e-6`) or nested under the nested
    configs' names as a run's config.json has them ({"loss": {"kl_coef": 0.0}, ...}); a
    field's name says where it belongs, so a config.json written before a part was nested
    (`"micro_batch": 32` at the top) reads the same.
    Every value is checked against its field's type here, once: YAML reads `1e-6`
    (no dot) as a string, which becomes the float 1e-06; a number where a string belongs,
    or a string that is no number where one belongs, is refused naming the key.
    A field given twice is refused naming both places: at the top and nested
    (`kl_coef: 0.1` and `loss: {kl_coef: 0.0}`), or one key twice in one mapping. JSON
    and YAML parsers keep the last of the two without a word, so the run would use a
    value the reader of the file may well not have seen (0.0 here, no KL penalty).
    """
    if not os.path.isfile(path):
        raise ValueError("no such file")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            tree = json.loads(text, object_pairs_hook=_json_object)
        except json.JSONDecodeError as e:
            raise ValueError(f"invalid JSON ({e.msg}, line {e.lineno})") from None
    elif path.endswith((".yaml", ".yml")):
        import yaml                              # PyYAML, a dependency of transformers

        try:
            tree = yaml.load(text, Loader=_unique_key_yaml_loader(yaml))
        except yaml.YAMLError as e:
            raise ValueError(f"invalid YAML ({str(e).splitlines()[0]})") from None
    else:
        raise ValueError("expected a .json, .yaml or .yml file")
    if not isinstance(tree, dict):
        raise ValueError(f"expected a mapping of field names to values, got {type(tree).__name__}")
    flat, where = {}, {}                          # field -> value; field -> where the file gave it
    for key, value in tree.items():
        items = value.items() if key in nested and isinstance(value, dict) else [(key, value)]
        for name, v in items:
            if name not in types:
                raise ValueError(f"unknown field {name!r}" + (f" ({hints[name]})" if name in hints else ""))
            place = name if name == key else f"{key}.{name}"
            if name in flat:
                raise ValueError(f"{name!r} is given twice, as {where[name]} and as {place}: keep one")
            flat[name], where[name] = file_value(name, v, types[name]), place
    return flat


def _json_object(pairs: list) -> dict:
    """json.loads' object_pairs_hook: a dict, refusing a key given twice in one object."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key!r} is given twice in one object: keep one")
        out[key] = value
    return out


def _unique_key_yaml_loader(yaml):
    """A yaml.SafeLoader that refuses a key given twice in one mapping, naming both lines."""
    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise ValueError(f"{key!r} is given twice in one mapping (lines {seen[key]} and "
                                     f"{key_node.start_mark.line + 1}): keep one")
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)
    return Loader


def file_value(name: str, value, annotation: str):
    """A config file's value for a field of this annotation ('int', 'float | None', ...), checked."""
    base = annotation.replace(" | None", "")
    if value is None:
        if "None" not in annotation:
            raise ValueError(f"{name!r} may not be null")
        return None
    ok = {"bool": isinstance(value, bool),
          "int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "str": isinstance(value, str)}[base]
    if not ok and base == "float" and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if not ok:
        raise ValueError(f"{name!r} must be {'an' if base == 'int' else 'a'} {base}, got {value!r}")
    return float(value) if base == "float" else value


def nonfinite_floats(config) -> list[tuple[str, float]]:
    """(name, value) of every float field of `config` and its nested configs that is NaN or inf.

    "nan" and "inf" parse as floats, NaN fails every range check silently (kl_coef < 0 is
    False, so NaN would pass and switch the term off), and inf passes them (an infinite
    coefficient, a clip that never clips). parse_flags refuses them on the command line;
    a config's own checks ask this for a --config file and the Python API (refuse_nonfinite).
    """
    return [(f.name, getattr(part, f.name)) for _, part, f in leaf_fields(config)
            if isinstance(getattr(part, f.name), float) and not math.isfinite(getattr(part, f.name))]


def refuse_nonfinite(config) -> None:
    """ValueError "--name must be a finite number, got nan" for the first such float field
    of `config` (nested parts included): the first check of every part's __post_init__, so
    a NaN is named as such, not as a value outside a range."""
    for name, value in nonfinite_floats(config):
        raise ValueError(f"--{name} must be a finite number, got {value}")


def require(condition: bool, message: str) -> None:
    """ValueError(message) unless condition: the one-line checks of every part's __post_init__."""
    if not condition:
        raise ValueError(message)


def check_counts(part, at_least: dict, at_most: dict | None = None) -> None:
    """Each count field of `part` in its range, or ValueError naming the first one out of it.

    at_least: {name: low}: "--name must be >= low, got v"; at_most: {name: (limit, what a
    value past it would cost)}: "--name must be at most limit (cost), got v". Every bound
    of a count sits far past any useful value: without them a 31-digit --digits hung with
    no output, and a huge --micro_batch died in C++ without naming its flag.
    """
    for name, low in at_least.items():
        require(getattr(part, name) >= low, f"--{name} must be >= {low}, got {getattr(part, name)}")
    for name, (limit, cost) in (at_most or {}).items():
        require(getattr(part, name) <= limit, f"--{name} must be at most {limit} ({cost}), got {getattr(part, name)}")


def flag_type(annotation: str):
    """argparse type for a field annotation: 'int', 'float' (finite only), 'str', or 'X | None'."""
    base = {"int": int, "float": finite_float, "str": str}[annotation.replace(" | None", "")]
    if "None" not in annotation:
        return base

    def parse(text: str):
        return None if text.lower() == "none" else base(text)
    parse.__name__ = base.__name__          # argparse names the type in its error message
    return parse


def finite_float(text: str) -> float:
    """float(text), refusing NaN and the infinities with a message argparse prints after the flag."""
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


@functools.cache
def field_docs(cls) -> dict:
    """Field name -> the one-line docstring under it (read from the class's source, once per class)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    return {a.target.id: b.value.value for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


# Names a TRL or verl user will type, and what they are here: the hint an unknown flag
# (or a config file's key) gets, and a flag of ours the chosen advantage does not read.
OTHER_NAMES = {
    "beta": "TRL's KL coefficient `beta` is --kl_coef here (FADE's EMA rate is --ema_beta)",
    "kl_loss_coef": "verl's kl_loss_coef is --kl_coef here",
    "learning_rate": "TRL's learning_rate is --lr here",
    "num_generations": "TRL's num_generations (verl's rollout.n) is --group_size here",
    "max_completion_length": "TRL's max_completion_length is --max_new_tokens here",
    "response_length": "verl's response_length is --max_new_tokens here",
    "epsilon": "TRL's epsilon (verl's clip_ratio_low) is --eps_low here, and epsilon_high --eps_high (with "
               "loss_type='cispo', epsilon_high - 1: TRL caps the ratio at epsilon_high itself)",
    "epsilon_high": "TRL's epsilon_high (verl's clip_ratio_high) is --eps_high here; with loss_type='cispo' TRL caps "
                    "the ratio at epsilon_high itself, so --eps_high is epsilon_high - 1 (TRL's 5.0: --eps_high 4)",
    "delta": "TRL's delta is --dual_clip here at TRL's recommended delta > 1 + epsilon_high (A > 0 tokens "
             "untouched); below that it caps A > 0 tokens at delta and A < 0 ones at 1 + epsilon_high: "
             "--eps_high delta - 1 with --dual_clip 1 + epsilon_high",
    "num_iterations": "TRL's num_iterations (verl's ppo_epochs) is --epochs here",
    "loss_agg_mode": "verl's loss_agg_mode is --agg here",
    "entropy_coeff": "verl's entropy_coeff is --entropy_coef here",
    "max_grad_norm": "TRL's max_grad_norm (verl's grad_clip) is --grad_clip here",
    "warmup_steps": "the learning-rate warm-up is --lr_warmup_steps here (a number of steps)",
    "warmup_ratio": "the learning-rate warm-up is --lr_warmup_steps here (a number of steps)",
    "use_vllm": "TRL's use_vllm is --backend vllm here",
    "output_dir": "TRL's output_dir is --out_dir here",
    "max_steps": "TRL's max_steps is --steps here",
    "gamma": "verl's gamma is GAE's discount; critic-free RL has no value function to discount",
    "lam": "verl's lam is GAE's lambda; critic-free RL has no value function",
    # TRL's GRPOConfig / TrainingArguments
    "per_device_train_batch_size": "TRL's per_device_train_batch_size is --micro_batch here (rollouts per "
                                   "forward/backward: memory only, the result does not depend on it)",
    "gradient_accumulation_steps": "there is no accumulation count here: each optimizer step covers "
                                   "--prompts_per_step x --group_size / --minibatches rollouts, accumulated "
                                   "over micro-batches of --micro_batch",
    "generation_batch_size": "TRL's generation_batch_size is --prompts_per_step x --group_size here",
    "steps_per_generation": "TRL's steps_per_generation is --minibatches here (optimizer steps per rollout batch)",
    "scale_rewards": "TRL's scale_rewards is the advantage here: 'group' is --advantage grpo, 'none' (Dr. GRPO) "
                     "--advantage mean",
    "save_steps": "TRL's save_steps (verl's save_freq) is --save_every here",
    "eval_steps": "TRL's eval_steps (verl's test_freq) is --eval_every here",
    "num_generations_eval": "TRL's num_generations_eval is --eval_samples here",
    "vllm_gpu_memory_utilization": "TRL's vllm_gpu_memory_utilization is --gpu_memory_utilization here",
    "importance_sampling_level": "TRL's importance_sampling_level='sequence' (GSPO) is --loss_type gspo here",
    "torch_compile": "TRL's torch_compile (verl's use_torch_compile) is --compile here",
    "max_prompt_length": "prompts are read whole here (no truncation); the engine sizes itself to the longest",
    "num_train_epochs": "runs are counted in rollout batches here: --steps",
    "logging_steps": "every step is logged here (metrics.jsonl; --report_to mirrors it)",
    # verl's ppo_trainer.yaml (the last part of the dotted name)
    "adv_estimator": "verl's algorithm.adv_estimator is --advantage here",
    "norm_adv_by_std_in_grpo": "verl's norm_adv_by_std_in_grpo=True is --advantage grpo here, False --advantage mean",
    "ppo_epochs": "verl's ppo_epochs is --epochs here",
    "ppo_mini_batch_size": "verl's ppo_mini_batch_size is set by --minibatches here (train_batch_size / mini-batch)",
    "ppo_micro_batch_size_per_gpu": "verl's ppo_micro_batch_size_per_gpu is --micro_batch here",
    "clip_ratio_low": "verl's clip_ratio_low is --eps_low here",
    "clip_ratio_high": "verl's clip_ratio_high is --eps_high here",
    "clip_ratio_c": "verl's clip_ratio_c (the dual clip) is --dual_clip here",
    "loss_mode": "verl's policy_loss.loss_mode is --loss_type here (vanilla: ppo)",
    "kl_loss_type": "verl's kl_loss_type is --kl_estimator here (low_var_kl: k3)",
    "use_kl_loss": "the KL penalty is on when --kl_coef > 0 here",
    "train_batch_size": "verl's data.train_batch_size is --prompts_per_step here",
    "max_response_length": "verl's max_response_length is --max_new_tokens here",
    "total_training_steps": "verl's total_training_steps is --steps here",
    "test_freq": "verl's test_freq is --eval_every here",
    "save_freq": "verl's save_freq is --save_every here",
    "use_torch_compile": "verl's use_torch_compile is --compile here",
    "enable_gradient_checkpointing": "verl's enable_gradient_checkpointing is --gradient_checkpointing here",
    "train_files": "verl's data.train_files is --data here",
    "val_files": "verl's data.val_files is --eval_data here",
    "path": "verl's model.path is --model here",
    "apply_chat_template_kwargs": "the chat template is --chat_template here",
    "n": "verl's rollout.n is --group_size here (rollout.val_kwargs.n: --eval_samples)",
    "name": "verl's rollout.name=vllm is --backend vllm here",
    "train_dataset": "TRL's train_dataset is --data here (a task name, reasoning_gym:NAME or a .jsonl file)",
    "eval_dataset": "TRL's eval_dataset is --eval_data here",
    "use_bias_correction_kl": "the KL estimator is --kl_estimator here (TRL's default is k3)",
    "default_local_dir": "verl's trainer.default_local_dir is --out_dir here",
    "resume_from_checkpoint": "TRL's resume_from_checkpoint is --resume here (it continues --out_dir)",
    "resume_mode": "verl's trainer.resume_mode is --resume here (it continues --out_dir)",
    "project_name": "verl's trainer.project_name is --project here (experiment_name: --run_name)",
    "experiment_name": "verl's trainer.experiment_name is --run_name here",
    "log_completions": "TRL's log_completions is --log_eval_completions here (RUN/samples.jsonl)",
    "num_completions_to_print": "completions go to RUN/samples.jsonl here (--log_eval_completions)",
    "log_val_generations": "verl's trainer.log_val_generations is --log_eval_completions here",
}

# Values another framework gives to a flag we also have, under its own meaning:
# {(flag, value): one line}. train.py's parse_args refuses them with the line.
VALUE_HINTS = {
    ("loss_type", "dapo"): "TRL's loss_type='dapo' is the token-mean aggregation: --agg token-mean here (the "
                           "default); --loss_type picks the surrogate (ppo, cispo, gspo)",
    ("loss_type", "bnpo"): "TRL's loss_type='bnpo' normalises by the batch's tokens: --agg token-mean here; "
                           "--loss_type picks the surrogate (ppo, cispo, gspo)",
    ("loss_type", "grpo"): "TRL's loss_type='grpo' (1/|o_i| per sequence) is --agg seq-mean-token-mean here; "
                           "--loss_type picks the surrogate (ppo, cispo, gspo)",
    ("loss_type", "dr_grpo"): "TRL's loss_type='dr_grpo' (divide by max_completion_length) is --agg "
                              "seq-mean-token-sum-norm here, with --advantage mean for Dr. GRPO's advantage",
    ("loss_type", "vanilla"): "verl's loss_mode vanilla is --loss_type ppo here",
    ("kl_estimator", "low_var_kl"): "verl's low_var_kl is --kl_estimator k3 here",
    ("kl_estimator", "kl"): "verl's kl is --kl_estimator k1 here",
    ("kl_estimator", "mse"): "verl's mse is --kl_estimator k2 here",
    ("advantage", "dr_grpo"): "Dr. GRPO's advantage (no division by the group's std) is --advantage mean here",
    ("advantage", "reinforce_plus_plus"): "verl's reinforce_plus_plus is --advantage reinforce_pp here",
    ("agg", "dapo"): "TRL's 'dapo' is --agg token-mean here",
}
