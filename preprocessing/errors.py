"""User-facing preprocessing errors, and recovering them from Ray's task-error wrappers.

A `PreprocessError` says which file or row is wrong and what to do about it. Raised inside a
Ray Data task it reaches the driver wrapped in `RayTaskError(UserCodeException)`, which keeps
only the formatted traceback text; `unwrap_ray_error` finds our message in it again so the
command line prints the one-line reason instead of a page of Ray internals.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class PreprocessError(RuntimeError):
    """Bad input or configuration: the message names the file / row and the fix."""


_MARKER = "PreprocessError: "


def unwrap_ray_error(exc: BaseException) -> PreprocessError | None:
    """The PreprocessError carried inside a Ray exception (or its text), else None."""
    seen = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, PreprocessError) and type(e) is PreprocessError:
            return e
        text = str(e)
        if _MARKER in text:
            # Ray formats the remote traceback; our message is everything after the last marker.
            msg = text[text.rindex(_MARKER) + len(_MARKER):].strip()
            return PreprocessError(msg)
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return None


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Re-raise a PreprocessError raised in a Ray task as itself, without Ray's wrapping."""
    try:
        yield
    except PreprocessError:
        raise
    except Exception as exc:  # noqa: BLE001 - we re-raise everything we do not recognise
        found = unwrap_ray_error(exc)
        if found is None:
            raise
        raise found from None
