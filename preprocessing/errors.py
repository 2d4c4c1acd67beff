"""User-facing preprocessing errors, and recovering them from Ray's task-error wrappers.

A `PreprocessError` says which file or row is wrong and what to do about it. Raised inside a
Ray Data task it reaches the driver wrapped in `RayTaskError(UserCodeException)`, which keeps
only the formatted traceback text; `unwrap_ray_error` finds our message in it again so the
command line prints the one-line reason instead of a page of Ray internals.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator


class PreprocessError(RuntimeError):
    """Bad input or configuration: the message names the file / row and the fix.

    `cli_fix` is a fix worded with the preprocessing command's flags (`--source`, `--split`),
    kept apart from `fact` so that a command with other flags (the workflows' `--data`) can
    say its own instead."""

    def __init__(self, fact: str, cli_fix: str = ""):
        super().__init__(f"{fact}; {cli_fix}" if cli_fix else fact)
        self.fact, self.cli_fix = fact, cli_fix

    def __reduce__(self):  # pickles (Ray) with both parts
        return type(self), (self.fact, self.cli_fix)


_MARKER = "PreprocessError: "
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def unwrap_ray_error(exc: BaseException) -> PreprocessError | None:
    """The PreprocessError carried inside a Ray exception (or its text), else None.

    Ray wraps an error raised in a task in a class that derives from both RayTaskError and the
    error's own class, so `isinstance(wrapped, PreprocessError)` holds while its text is the
    whole remote traceback: only an exception of exactly our class is the plain message."""
    seen, todo, text_hit = set(), [exc], None
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if type(e) is PreprocessError:
            return e
        text = _ANSI.sub("", str(e))
        if text_hit is None and _MARKER in text:
            # Ray formats the remote traceback; our message is the line after the last marker.
            text_hit = text[text.rindex(_MARKER) + len(_MARKER):].strip().splitlines()[0]
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return PreprocessError(text_hit) if text_hit else None


def message(exc: PreprocessError) -> str:
    """The one-line message of a PreprocessError, also when it is Ray's wrapped copy."""
    found = unwrap_ray_error(exc)
    return str(found if found is not None else exc)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Re-raise a PreprocessError raised in a Ray task as itself, without Ray's wrapping."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - we re-raise everything we do not recognise
        if type(exc) is PreprocessError:
            raise
        found = unwrap_ray_error(exc)
        if found is None:
            raise
        raise found from None
