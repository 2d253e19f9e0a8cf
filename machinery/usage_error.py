"""usage_error.py: UsageError, the one-line error of a bad input, and the two questions its raisers share.

A usage error (a bad flag value, path, file or directory the user gave) is one line and
exit code 2; every other exception keeps its traceback (train.py's main). The checks at
the door (machinery/checks.py) import the files that fetch models and write checkpoints,
and those files raise usage errors too (a full disk, a cache that cannot be written): so
the error type, the one question about a directory they ask (writable_dir_problem) and
how a size reads in their messages (size_text) live here, below both, and checks.py
re-exports them. Without this file, checkpoint.py -> checks.py -> hub_models.py ->
checkpoint.py (and hub_models.py -> checks.py) were circles. Only the standard library.
"""

from __future__ import annotations

import os
import tempfile


class UsageError(ValueError):
    """A bad value, path or file given by the user, found at the door: one line and exit code 2.

    Raised only where input enters (flags, --config, data files, run directories, model
    names), never by the lesson's formulas: train.py's main turns THIS type into one line
    and lets every other exception through with its traceback, so a bug a reader puts into
    a chapter shows where it is. A ValueError (its base class), so callers that catch
    ValueError for any bad input still do.
    """


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


def size_text(n: int) -> str:
    """Bytes for a reader, in powers of 1000: 1.4 MB, 3.2 GB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
