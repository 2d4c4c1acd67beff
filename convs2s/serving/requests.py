"""What one translation request may ask, for both servers (the MLflow pyfunc model and the Ray
Serve deployment): its size, the search settings it may change per request with their bounds,
and the work those settings may ask of the search. A request over them is refused before any
search, with the limit and its setting named (HTTP 400).

Limits (environment variables of the server's operator, read at import):
- CONVS2S_SERVE_MAX_SENTENCES (256) sentences per request, at least one;
- CONVS2S_SERVE_MAX_CHARS (4,096) characters per sentence (the tokenizer reads a sentence
  whole before the model's position table cuts it);
- CONVS2S_SERVE_MAX_BEAM (16) beam width, and so nbest;
- CONVS2S_SERVE_MAX_LEN (1,024) output pieces (`max_len_b`, and `max_len_a` x 100);
- CONVS2S_SERVE_MAX_WORK (CONVS2S_SERVE_MAX_SENTENCES x 1,024) hypothesis steps per request:
  the sum over its sentences of beam x (the most output pieces the search allows the sentence,
  min(max_len_a x its source positions + max_len_b, the model's positions - 1), + EOS). Every
  hypothesis may run all its steps (`min_len` forbids EOS until then), so this bounds the
  request's search time. The default fits the most sentences at beam 5 and the default 200
  pieces; `min_len` over the most pieces any sentence may get is refused as well;
- CONVS2S_SERVE_MAX_ATTENTION (4,194,304 = 16 MiB of float32) attention values: those a
  request with `"attention": true` may get back (beam x steps x source positions, summed over
  its sentences), and those one search batch keeps while it runs (asked for, or for
  replace_unk): its batches are cut at that many (`batch_bound`). Without attention the search
  keeps none (`convs2s.inference.search.generate(attention=False)`);
- CONVS2S_SERVE_MAX_BODY (the most sentences x the most characters x 12 bytes, a character
  outside the BMP escaped as two `\\uXXXX`, + 64 KiB: 12.1 MiB by default, so that every
  request within the limits above fits) bytes of a request body on Ray Serve: a larger one is
  an HTTP 413 before it is parsed (parsed, a body is several times its size in Python
  objects: a multi-GB one would take its replica down before the limits above were read).
"""

from __future__ import annotations

import os

from convs2s.config import SearchConfig

MAX_SENTENCES = int(os.environ.get("CONVS2S_SERVE_MAX_SENTENCES", 256))
MAX_CHARS = int(os.environ.get("CONVS2S_SERVE_MAX_CHARS", 4096))
MAX_BEAM = int(os.environ.get("CONVS2S_SERVE_MAX_BEAM", 16))
MAX_LEN = int(os.environ.get("CONVS2S_SERVE_MAX_LEN", 1024))
MAX_WORK = int(os.environ.get("CONVS2S_SERVE_MAX_WORK", MAX_SENTENCES * 1024))
MAX_ATTENTION = int(os.environ.get("CONVS2S_SERVE_MAX_ATTENTION", 1 << 22))
MAX_BODY = int(os.environ.get("CONVS2S_SERVE_MAX_BODY", MAX_SENTENCES * MAX_CHARS * 12 + (1 << 16)))

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


# The limit's variable, for a setting whose upper bound the operator sets
LIMIT_VARIABLE = {"beam": "CONVS2S_SERVE_MAX_BEAM", "nbest": "CONVS2S_SERVE_MAX_BEAM",
                  "max_len_a": "CONVS2S_SERVE_MAX_LEN", "max_len_b": "CONVS2S_SERVE_MAX_LEN",
                  "min_len": "CONVS2S_SERVE_MAX_LEN"}


class RequestError(ValueError):
    """A request over the limits or with an unknown or bad parameter; the message says which."""


def check_sentences(sentences: list) -> None:
    if not sentences:
        raise RequestError('no sentences: "inputs" must hold at least one sentence')
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


def output_steps(source_positions: int, search: SearchConfig, max_positions: int) -> int:
    """Decoder steps a hypothesis of a source of `source_positions` (pieces + EOS) may take:
    the most output pieces the search allows it (as `convs2s.inference.search` caps them),
    + its EOS."""
    pieces = int(source_positions * search.max_len_a + search.max_len_b)
    return min(pieces, max_positions - 1) + 1


def check_work(source_positions: list[int], search: SearchConfig, max_positions: int,
               attention: bool = False) -> None:
    """Refuse a request whose search could cost more than the limits (module docstring):
    `source_positions` per sentence (0: an empty one, not searched;
    `Translator.source_lengths`), the request's `search`, the model's `max_positions`;
    `attention`: the answer carries the attention matrices."""
    a, b = f"{search.max_len_a:g}", search.max_len_b  # 0, not 0.0 (a float setting)
    longest = output_steps(max_positions, search, max_positions) - 1
    if search.min_len > longest:
        raise RequestError(f"min_len={search.min_len} is more output pieces than this search "
                           f"gives any sentence: at most {longest} (max_len_a={a} x source "
                           f"positions + max_len_b={b}, within the model's {max_positions} "
                           "positions)")
    sources = [n for n in source_positions if n]
    steps = [output_steps(n, search, max_positions) for n in sources]
    work = search.beam * sum(steps)
    if work > MAX_WORK:
        raise RequestError(f"this request may take {work:,} hypothesis steps ({len(steps)} "
                           f"sentences x beam {search.beam} x up to {max(steps)} steps each: "
                           f"max_len_a={a} x source positions + max_len_b={b} output pieces "
                           f"+ EOS); at most {MAX_WORK:,} "
                           "(CONVS2S_SERVE_MAX_WORK): send fewer sentences, or a smaller beam, "
                           "max_len_a or max_len_b")
    if attention:
        values = search.beam * sum(t * n for t, n in zip(steps, sources))
        if values > MAX_ATTENTION:
            raise RequestError(f"the attention of this request is up to {values:,} values "
                               f"(beam {search.beam} x output steps x source positions, summed "
                               f"over {len(steps)} sentences); at most {MAX_ATTENTION:,} "
                               "(CONVS2S_SERVE_MAX_ATTENTION): ask it for fewer or shorter "
                               "sentences, or a smaller beam")


def batch_bound(search: SearchConfig, max_positions: int, attention: bool) -> SearchConfig:
    """`search` with its batches cut so that one search batch keeping attention (`attention`
    asked, or for replace_unk) holds at most MAX_ATTENTION values of it: beam x the most steps
    x padded source positions per sentence (`max_tokens`; a sentence over that budget is a
    batch of its own, which `check_work` bounds for an attention request). Other searches keep
    no attention and are returned as they are; so are the translations (a float32 sentence's
    translation does not depend on its batch, unless a shortlist makes the batch's vocabulary
    the union of its sentences')."""
    if not (attention or search.replace_unk):
        return search
    budget = max(1, MAX_ATTENTION // (search.beam * output_steps(max_positions, search,
                                                                  max_positions)))
    if search.max_tokens and search.max_tokens <= budget:
        return search
    return search.replace(max_tokens=budget)


def check_default_search(search: SearchConfig,
                         names: tuple[str, ...] = tuple(SEARCH_PARAMS)) -> None:
    """A model's default search (a logged model's: MLflow sends its logged value of every
    setting a request leaves out) within the bounds a request may ask; ValueError naming the
    setting otherwise (else every request would be refused, naming a setting its client never
    sent)."""
    for name in names:
        _, low, high = SEARCH_PARAMS[name]
        value = getattr(search, name)
        if not low <= value <= high:
            limit = f" ({LIMIT_VARIABLE[name]} on the server)" if name in LIMIT_VARIABLE else ""
            raise ValueError(f"search {name}={value} is outside [{low}, {high}], what a request "
                             f"may ask{limit}: every request to the model would be refused; "
                             f"give a {name} within it")
