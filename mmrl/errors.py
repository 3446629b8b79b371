"""Errors in what the user wrote or asked for (recipe, overrides, data, paths, launch).

The CLI prints a `UserError` as one line and any other exception with its full traceback, so a
genuine bug hours into a run is never reduced to a message (`mmrl --debug` shows the traceback
of both).
"""

from __future__ import annotations

from contextlib import contextmanager


class UserError(Exception):
    """A mistake the user can fix: the message names the key, file, value or command to change."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named does not exist."""


# Exceptions that, raised while a run reads what the user gave it (recipe, data, model paths), are
# about that input: marked by `reading_user_input`, they print as one line like a `UserError`.
INPUT_EXCEPTIONS = (ValueError, KeyError, OSError, ImportError)  # OSError: a model path or hub id not found


@contextmanager
def reading_user_input():
    """Mark the `INPUT_EXCEPTIONS` raised inside as user errors (their type is kept)."""
    try:
        yield
    except INPUT_EXCEPTIONS as e:
        e.mmrl_user_error = True
        raise


def is_user_error(e: BaseException) -> bool:
    return isinstance(e, UserError) or getattr(e, "mmrl_user_error", False)


def message(e: BaseException) -> str:
    """One line: a KeyError's message without the quotes ``str(KeyError)`` adds, then the error's notes."""
    text = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
    return "; ".join([text, *getattr(e, "__notes__", ())])  # a note: e.g. where the failed run's checkpoint is
