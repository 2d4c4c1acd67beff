"""What one translation request may ask, for both servers (the MLflow pyfunc model and the Ray
Serve deployment): its size, and the search settings it may change per request with their
bounds. A request over them is refused before any work, with the limit and its setting named
(HTTP 400).

Limits (environment variables, read at import):
- CONVS2S_SERVE_MAX_SENTENCES (256) sentences per request;
- CONVS2S_SERVE_MAX_CHARS (4,096) characters per sentence (the tokenizer reads a sentence
  whole before the model's position table cuts it);
- CONVS2S_SERVE_MAX_BEAM (16) beam width, and so nbest;
- CONVS2S_SERVE_MAX_LEN (1,024) output pieces (`max_len_b`, and `max_len_a` x 100).
"""

from __future__ import annotations

import os

from convs2s.config import SearchConfig

MAX_SENTENCES = int(os.environ.get("CONVS2S_SERVE_MAX_SENTENCES", 256))
MAX_CHARS = int(os.environ.get("CONVS2S_SERVE_MAX_CHARS", 4096))
MAX_BEAM = int(os.environ.get("CONVS2S_SERVE_MAX_BEAM", 16))
MAX_LEN = int(os.environ.get("CONVS2S_SERVE_MAX_LEN", 1024))

# Search settings a request may set: (type, lowest, highest)
SEARCH_PARAMS = {
    "beam": (int, 1, MAX_BEAM),
    "nbest": (int, 1, MAX_BEAM),
    "lenpen": (float, 0.0, 10.0),
    "max_len_a": (float, 0.0, MAX_LEN / 100),
    "max_len_b": (int, 0, MAX_LEN),
    "min_len": (int, 0, MAX_LEN),
    "unk_penalty": (float, -100.0, 100.0),
}


class RequestError(ValueError):
    """A request over the limits or with an unknown or bad parameter; the message says which."""


def check_sentences(sentences: list) -> None:
    if len(sentences) > MAX_SENTENCES:
        raise RequestError(f"{len(sentences)} sentences in one request; at most {MAX_SENTENCES} "
                           "(CONVS2S_SERVE_MAX_SENTENCES): split it")
    for i, s in enumerate(sentences):
        if s is not None and not isinstance(s, str):
            raise RequestError(f"sentence {i} is a {type(s).__name__}, not a string")
        if s is not None and len(s) > MAX_CHARS:
            raise RequestError(f"sentence {i} has {len(s):,} characters; at most {MAX_CHARS:,} "
                               "(CONVS2S_SERVE_MAX_CHARS)")


def search_for(base: SearchConfig, params: dict | None,
               allowed: tuple[str, ...] = tuple(SEARCH_PARAMS)) -> SearchConfig:
    """`base` with a request's search settings (those in `allowed`), each within its bounds."""
    params = params or {}
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise RequestError(f"unknown parameter(s) {', '.join(unknown)}; a request may set "
                           f"{', '.join(allowed)}")
    changes = {}
    for name, value in params.items():
        if value is None:
            continue
        kind, low, high = SEARCH_PARAMS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                (kind is int and isinstance(value, float) and not value.is_integer()):
            raise RequestError(f"{name} must be {'an integer' if kind is int else 'a number'}, "
                               f"got {value!r}")
        if not low <= value <= high:
            raise RequestError(f"{name}={value} is outside [{low}, {high}]")
        changes[name] = kind(value)
    try:
        return base.replace(**changes)
    except ValueError as err:  # e.g. nbest > beam
        raise RequestError(str(err)) from None
