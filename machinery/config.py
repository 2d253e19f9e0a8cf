"""config.py: a dataclass config as command-line flags, with its docstrings as help.

train.py's hyper-parameters are one dataclass (`train.Config`) that nests the objective's
(`loss.LossConfig`) and the schedule's (`scheduler.SchedulerConfig`). Each module owns
its fields, their defaults and their checks; this file only turns such a tree into
argparse flags and back, so there is one source of truth and no adapter in between:

    --lr 1e-3 --loss_type gspo --schedule fade     (flat names, whichever config owns them)

- every field that is not itself a dataclass is a flag under its own name; two fields
  with the same name anywhere in the tree are a programming error (asserted);
- the default is the field's value in the default instance (so `train.Config`'s
  `sched=SchedulerConfig(schedule="constant")` shows "constant", not the class default);
- the help text is the one-line docstring under the field (read from the source, the
  convention cleanrl's configs use);
- a field typed `X | None` takes the word "none" for None; a bool is --flag / --no-flag;
- any parse error is ONE line on stderr and exit code 2, not argparse's usage dump.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect


def parse_flags(root, argv: list[str] | None, description: str, prog: str) -> dict:
    """Parse argv against the fields of the dataclass instance `root` and its nested ones.

    Returns {"": {field: value} of root, "<name>": {field: value} of root.<name>, ...} for
    one level of nesting, so the caller builds the nested configs first (their own
    __post_init__ checks run) and then the root. Exits 2 with one line on a bad flag.
    """
    parser = argparse.ArgumentParser(prog=prog, description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.error = lambda message: parser.exit(2, f"{prog}: error: {message}\n")
    groups = {"": root, **{f.name: getattr(root, f.name) for f in dataclasses.fields(root)
                           if dataclasses.is_dataclass(getattr(root, f.name))}}
    owner = {}
    for group, obj in groups.items():
        docs = field_docs(type(obj))
        for f in dataclasses.fields(obj):
            if dataclasses.is_dataclass(getattr(obj, f.name)):
                continue
            assert f.name not in owner, f"flag --{f.name} is declared twice"
            owner[f.name] = group
            default, help_text = getattr(obj, f.name), docs.get(f.name, "")
            if f.type == "bool":
                parser.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=default,
                                    help=help_text)
            else:
                parser.add_argument(f"--{f.name}", type=flag_type(f.type), default=default, help=help_text)
    args = vars(parser.parse_args(argv))
    return {group: {k: v for k, v in args.items() if owner[k] == group} for group in groups}


def flag_type(annotation: str):
    """argparse type for a field annotation: 'int', 'float', 'str', or 'X | None'."""
    base = {"int": int, "float": float, "str": str}[annotation.replace(" | None", "")]
    if "None" not in annotation:
        return base

    def parse(text: str):
        return None if text.lower() == "none" else base(text)
    parse.__name__ = base.__name__          # argparse names the type in its error message
    return parse


def field_docs(cls) -> dict:
    """Field name -> the one-line docstring under it (read from the class's source)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    return {a.target.id: b.value.value for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}
