"""The sandbox's replies: one reader, on both sides of the worker, that cannot raise.

A scoring child's reply is the answer's to write: code in the child (an eval-based
scorer runs the answer) can write any bytes to its reply pipe and exit. Its worker reads
them, keeps a number and some module names, and writes its own reply to the trainer.
Both replies are read by read_reply below, with the same caps and the same schema
checks, so nothing a child writes can reach the trainer as an exception: before this
reader, a reply of ~2 KB, {"value": [[[...]]]} nested 990 deep, passed the worker (which
parses at a shallow stack) and raised RecursionError in json.loads in the trainer's
deeper one, and train.py exited with a traceback at that step; a reply of 1,000 emoji
(4 KB as UTF-8) grew to 12 KB when the worker re-encoded it and killed the channel; a
reply starting with a NUL byte made json guess UTF-16 and import its codec, which a
worker run as `nobody` could not read, and the worker died. Every way a reply can fail
has a name here (REASONS); the answer then gets no score (it scores 0), and the trainer
counts the reason and reports it once (tasks/sandbox.py: _no_score).

Loaded by tasks/sandbox_worker.py by its path (a worker imports nothing of the project
as a package), and through it by tasks/sandbox.py: one copy of the rules on both sides.
Standard library only.
"""

from __future__ import annotations

import json
import math
import re


# The caps, the same on both sides. A reply longer than MAX_REPLY_BYTES, or nested deeper
# than MAX_REPLY_DEPTH, is refused before any JSON parser sees it. A worker's own reply
# holds only identifiers (ASCII) and a number, so it always fits: 20 names of 100
# characters are ~2.1 KB.
MAX_REPLY_BYTES = 4096        # a reply, either way, may not be longer (bytes of UTF-8 JSON)
MAX_REPLY_DEPTH = 2           # {"missing": [...]}: an object holding a list, no deeper
MAX_MISSING = 20              # module names a reply may report (the warning prints 3)
MAX_NAME_CHARS = 100          # a longer dotted name is not a module a scorer imports
MAX_TEXT_CHARS = 300          # the worker's own words ("broken": why)
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
REASONS = {
    "timeout": "it did not answer within its timeout",
    "crash": "it ended without a reply (killed, out of memory, or exited)",
    "too_long": f"its reply was longer than {MAX_REPLY_BYTES} bytes",
    "not_utf8": "its reply was not UTF-8",
    "too_deep": f"its reply was nested deeper than {MAX_REPLY_DEPTH} levels",
    "not_json": "its reply was not JSON",
    "wrong_shape": 'its reply was not {"value": a number or a bool, "missing": [module names]}',
    "not_finite": "its value was not a finite number",
    "worker_stuck": "its worker did not answer in time (it was replaced)",
    "worker_lost": "two workers in a row died or broke before they could score it",
    "worker_reply": "its worker's reply was unreadable (it was replaced)",
}
# What each side's reply holds: field -> kind (read_reply checks it).
CHILD_REPLY = {"value": "score", "missing": "names"}
WORKER_REPLY = {"value": "score_or_none", "missing": "names", "scored": "bool", "broken": "text", "reason": "reason"}


def read_reply(data: bytes, fields: dict) -> tuple[dict | None, str]:
    """(the reply, "") or (None, the reason's name in REASONS): never raises, whatever the bytes.

    In order: at most MAX_REPLY_BYTES ("too_long"); strict UTF-8 ("not_utf8": never
    json's guess from the first bytes, which took a reply starting with NUL for UTF-16 and
    imported that codec, which a worker run as `nobody` may be unable to read); nested at
    most MAX_REPLY_DEPTH deep, outside strings ("too_deep"); JSON ("not_json"); then an
    object with exactly `fields`' keys, each of its kind ("wrong_shape", "not_finite"):
      score          a bool, or an int or float that is finite as a float (a 400-digit
                     integer is "not_finite"); score_or_none: that, or null
      names          a list; the items that are dotted Python identifiers of at most
                     MAX_NAME_CHARS characters are kept, at most MAX_MISSING (a name with an
                     escape code, a secret or a file's text is dropped, never printed)
      bool, text     a bool; a string of at most MAX_TEXT_CHARS
      reason         "" or a name in REASONS
    Cost: one pass over at most 4 KB; ~0.1 ms for a usual reply of ~40 bytes.
    """
    try:
        if len(data) > MAX_REPLY_BYTES:
            return None, "too_long"
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            return None, "not_utf8"
        if _json_depth(text) > MAX_REPLY_DEPTH:
            return None, "too_deep"
        try:
            reply = json.loads(text)
        except (ValueError, RecursionError):
            return None, "not_json"
        if not isinstance(reply, dict) or set(reply) != set(fields):
            return None, "wrong_shape"
        for name, kind in fields.items():
            value = reply[name]
            if kind in ("score", "score_or_none"):
                if value is None and kind == "score_or_none" or isinstance(value, bool):
                    continue
                if not isinstance(value, (int, float)):
                    return None, "wrong_shape"
                try:
                    if not math.isfinite(float(value)):
                        return None, "not_finite"
                except OverflowError:             # an int beyond float's range
                    return None, "not_finite"
            elif kind == "names":
                if not isinstance(value, list):
                    return None, "wrong_shape"
                reply[name] = [n for n in value if isinstance(n, str) and len(n) <= MAX_NAME_CHARS
                               and _MODULE_NAME.fullmatch(n)][:MAX_MISSING]
            elif (kind == "bool" and not isinstance(value, bool)
                  or kind == "text" and not (isinstance(value, str) and len(value) <= MAX_TEXT_CHARS)
                  or kind == "reason" and value != "" and value not in REASONS):
                return None, "wrong_shape"
        return reply, ""
    except Exception:                             # never seen; a reader that raises is no reader
        return None, "not_json"


def _json_depth(text: str) -> int:
    """How deep [ and { nest in JSON text, outside its strings (a string's own escaped quote
    does not end it). Linear, with no recursion, so any text can be measured."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest
