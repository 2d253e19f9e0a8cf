"""errors.py: the one error type of the door, in a module that imports nothing.

A usage error (a bad flag value, path, file or directory the user gave) is one line and
exit code 2; every other exception keeps its traceback (train.py's main). The type lives
here, alone, so that any file of the engine can raise it without importing the door's
checks (machinery/checks.py), which import more of the engine: checkpoint.py raises it
for a full disk, and checks.py -> hub_models.py -> checkpoint.py would otherwise be a
circle. checks.py re-exports it, so `checks.UsageError` is the same class.
"""


class UsageError(ValueError):
    """A bad value, path or file given by the user, found at the door: one line and exit code 2.

    Raised only where input enters (flags, --config, data files, run directories, model
    names), never by the lesson's formulas: train.py's main turns THIS type into one line
    and lets every other exception through with its traceback, so a bug a reader puts into
    a chapter shows where it is. A ValueError (its base class), so callers that catch
    ValueError for any bad input still do.
    """
