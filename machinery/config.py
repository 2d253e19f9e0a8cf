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
- a float flag must be a finite number: "nan" and "inf" parse as floats, and NaN passes
  every range check written as `x < 0` (each comparison is False), so they are refused
  here, for every float flag at once, naming the flag;
- `--config PATH` reads the same fields from a file: a run's config.json (nested as
  dataclasses.asdict writes it) or a YAML file (flat or nested). The file replaces the
  defaults, and every flag on the command line wins over the file (TRL's TrlParser does
  the same with its --config);
- flags are matched whole (no argparse abbreviations: `--temp` would silently mean
  --temperature today and fail once another flag starts with it); an unknown flag a
  user of another framework types gets a hint naming ours (`hints`);
- any parse error is ONE line on stderr and exit code 2, not argparse's usage dump.

The end of the file holds the checks at the door that every entry point shares (train.py,
plot_runs.py, advantages.py, python -m toy, the sweep runner): can this process write where
it was told to, is another process already writing there (lock_dir), and can the Hugging
Face hub provide a name. Each returns None or what is wrong, as
a phrase the caller puts after the flag's name, so a bad path is one line before any
work starts rather than a traceback after it. Last, train.py's --model check, built on
them, raises that line itself (its messages differ by case).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import fcntl
import inspect
import json
import math
import os
import re
import tempfile


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
    for group, obj in groups.items():
        docs = field_docs(type(obj))
        for f in dataclasses.fields(obj):
            if dataclasses.is_dataclass(getattr(obj, f.name)):
                continue
            assert f.name not in owner, f"flag --{f.name} is declared twice"
            owner[f.name], types[f.name] = group, f.type
            default, help_text = getattr(obj, f.name), docs.get(f.name, "")
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
    configs' names as a run's config.json has them ({"loss": {"kl_coef": 0.0}, ...}).
    Every value is checked against its field's type here, once: YAML reads `1e-6`
    (no dot) as a string, which becomes the float 1e-06; a number where a string belongs,
    or a string that is no number where one belongs, is refused naming the key.
    """
    if not os.path.isfile(path):
        raise ValueError("no such file")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".json"):
        try:
            tree = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"invalid JSON ({e.msg}, line {e.lineno})") from None
    elif path.endswith((".yaml", ".yml")):
        import yaml                              # PyYAML, a dependency of transformers

        try:
            tree = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"invalid YAML ({str(e).splitlines()[0]})") from None
    else:
        raise ValueError("expected a .json, .yaml or .yml file")
    if not isinstance(tree, dict):
        raise ValueError(f"expected a mapping of field names to values, got {type(tree).__name__}")
    flat = {}
    for key, value in tree.items():
        items = value.items() if key in nested and isinstance(value, dict) else [(key, value)]
        for name, v in items:
            if name not in types:
                raise ValueError(f"unknown field {name!r}" + (f" ({hints[name]})" if name in hints else ""))
            flat[name] = file_value(name, v, types[name])
    return flat


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


def field_docs(cls) -> dict:
    """Field name -> the one-line docstring under it (read from the class's source)."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    return {a.target.id: b.value.value for a, b in zip(body, body[1:])
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


# ---------------------------------------------------------------------------------------
# Checks at the door shared by the entry points: output paths and the hub
# ---------------------------------------------------------------------------------------

def writable_dir_problem(path: str) -> str | None:
    """None if `path` is, or can be created as, a directory this process can write in.

    Otherwise what is wrong: "is a file", "X (above it) is a file", or "cannot write in
    X (reason)" for the directory itself or, when it does not exist yet, its nearest
    existing ancestor (where makedirs would create it). Writability is tested by
    creating and removing a temporary file, not with os.access: access() says yes to
    root on a read-only mount, and the question is whether the write will succeed.
    """
    path = os.path.abspath(os.path.expanduser(path))
    probe = path
    while not os.path.exists(probe):
        if os.path.islink(probe):           # exists() is False through a dangling link or a loop of links
            return f"{probe} is a symbolic link that leads nowhere (dangling, or a loop)"
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        return "is a file, not a directory" if probe == path else f"{probe} (above it) is a file, not a directory"
    try:
        fd, name = tempfile.mkstemp(dir=probe, prefix=".write-test-")
        os.close(fd)
        os.remove(name)
    except OSError as e:
        return f"cannot write in {probe} ({e.strerror})"
    return None


def writable_file_problem(path: str) -> str | None:
    """None if a file can be written at `path` (its directory must exist), else what is wrong."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.isdir(path):
        return "is a directory; expected a file name"
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        return f"its directory does not exist ({folder})"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return "exists and cannot be written"
    problem = writable_dir_problem(folder)
    return f"its directory: {problem}" if problem else None


LOCK_FILE = "lock"


def lock_dir(path: str, what: str):
    """Make this process the only writer of directory `path`: the open lock file, or ValueError.

    An exclusive, non-blocking flock(2) on path/lock, taken before anything else is
    written there and held as long as the returned file stays open (close it to let go;
    the kernel lets go when the process ends, however it ends). Two writers on one
    directory interleave their lines and overwrite each other's checkpoints, and each
    exits 0; so the second one is refused, in one line naming the holder's PID, which
    the holder writes into the file. A lock file left by a dead process holds no lock:
    it is simply taken over. Creates `path` if needed. what: how the message names the
    directory ("--out_dir", "--out").
    """
    os.makedirs(path, exist_ok=True)
    f = open(os.path.join(path, LOCK_FILE), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise ValueError(f"{what} {path!r} is in use by another process (PID {holder}); wait for it to finish, "
                         "stop it, or choose another directory") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def hub_problem(repo_id: str, repo_type: str = "model") -> str | None:
    """None if the Hugging Face hub can plausibly provide repo_id, else why not.

    Offline mode (HF_HUB_OFFLINE=1) is the user's statement that the local cache has it:
    the loader reads the cache and says what is missing. A model whose config.json is in
    the cache needs no network. Otherwise ONE metadata request with a short timeout
    answers whether the repository exists and the hub is reachable: a loader that finds
    no network retries for about a minute and then prints a page of traceback. Errors
    other than "not found" and "unreachable" (gated, rate-limited) are left to the loader.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return None
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    if repo_type == "model" and isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return None
    try:
        HfApi().repo_info(repo_id, repo_type=repo_type, timeout=10)
    except RepositoryNotFoundError:
        return f"the Hugging Face hub has no {repo_type} {repo_id!r} (or it is private)"
    except HfHubHTTPError:
        return None
    except Exception as e:                  # no network: the HTTP client's own error types
        return (f"the Hugging Face hub is unreachable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                "if it is in the local cache, set HF_HUB_OFFLINE=1")
    return None


# A hub repository id: "name" or "owner/name" (letters, digits, '-', '_', '.'); anything
# else that is not an existing directory cannot be loaded by from_pretrained.
HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def check_model(model: str) -> None:
    """--model at the door: 'tiny', a model directory, or a hub id the hub can provide.

    An existing path must be a directory with a config.json (what save_pretrained
    writes; without it from_pretrained tries the hub and fails far from the cause). A
    path that does not exist is refused when it can only be a path: it starts with '/',
    '.' or '~', or it is not of the form name or owner/name. What remains is a hub id,
    checked by hub_problem: the local hub cache, else one quick request, so an
    offline machine hears so in a second instead of after a minute of retries.
    """
    if model == "tiny":
        return
    path = os.path.expanduser(model)
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(f"--model {model!r} is a file; expected a model directory or a hub id")
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"--model {model!r}: no config.json in that directory (not a saved model)")
        return
    if model.startswith(("/", ".", "~")):
        raise ValueError(f"--model {model!r}: no such directory")
    if not HUB_ID.fullmatch(model):
        raise ValueError(f"--model {model!r}: no such directory, and not a hub id (name or owner/name)")
    if problem := hub_problem(model, "model"):
        raise ValueError(f"--model {model!r} is no local directory, and {problem}")
