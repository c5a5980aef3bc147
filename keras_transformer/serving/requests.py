"""Requests of `keras-transformer-serve`, read and checked: TF Serving's row and columnar
formats (with its `{"b64": ...}` strings) and this server's own fields (search settings,
glossary, steering), each by type and range, within the server's `Limits`.

    limits = Limits(max_sentences=256, max_characters=2000)
    body = parse_body(raw_bytes)                       # BadRequest for invalid JSON
    request = parse_request(body, info, limits, "onnx")  # Parsed: sentences, settings, ...

Each `parse_*` function takes the decoded JSON body and raises `BadRequest`
with one line naming the problem (and the limit's flag where a limit is
passed), which the server answers with TF Serving's error shape and status
400. A request is checked whole before it is queued: a refused one never
reaches a batch, so it can never change another request's answer.
"""

import base64
import binascii
import dataclasses
import json
import math
import re

GREEDY_SIGNATURE = "translate_greedy"
DEFAULT_SIGNATURE = "serving_default"
INT32_MAX = 2**31 - 1  # the graphs take top-k and seeds as int32
# Past these the float32 search overflows (a length penalty of inf, logits / ~0): NaN
# scores, not translations. GNMT's alpha is 0.6, Marian's 1.0.
MAX_ALPHA = 10.0
TEMPERATURES = (1e-3, 1e3)
_WORD = re.compile(r"\w+")  # a word, as the glossary matches them (terminology)


class BadRequest(ValueError):
    """A request this server refuses: answered with TF Serving's error shape and
    `status` (400, or 413 for a body over `--max-body-bytes`)."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold and take; each field is the flag of the same name
    (`--max-body-bytes`, ...), so an error names it. The defaults are the flags'."""

    max_body_bytes: int = 1 << 20  # the request body, checked before it is read
    max_sentences: int = 256  # per request
    max_characters: int = 2000  # per sentence (and per prefix)
    max_work: int = 1 << 17  # per request: characters of all its sentences x the beam
    max_banned: int = 64  # banned words or phrases per request
    max_glossary: int = 256  # glossary entries per request
    max_term_words: int = 16  # words of one banned phrase or glossary term
    max_term_characters: int = 200  # characters of one banned phrase or glossary term
    max_queue: int = 2048  # sentences waiting in all (503 beyond)
    # sentences waiting of one client (503 beyond); None: a quarter of max_queue, at least
    # max_sentences (`resolved`)
    max_client_queue: int | None = None
    timeout_seconds: float = 30.0  # per request, from its first byte to its answer
    body_seconds: float = 10.0  # to receive the body (408 after)

    def resolved(self):
        """These limits with `max_client_queue`'s default worked out."""
        if self.max_client_queue is not None:
            return self
        share = max(self.max_sentences, self.max_queue // 4)
        return dataclasses.replace(self, max_client_queue=min(share, self.max_queue))

    @staticmethod
    def flag(name):
        return "--" + {"timeout_seconds": "timeout", "body_seconds": "body-timeout"}.get(
            name, name.replace("_", "-")
        )

    def over(self, name, what, got):
        """`BadRequest` for `what` holding `got`, over the limit `name`."""
        return BadRequest(
            f"{what} has {got}; this server takes at most {getattr(self, name)} "
            f"({self.flag(name)})."
        )


ROW_INPUTS = {"sentences", "prefix"}  # the named inputs of a row (or of columnar inputs)


def _reject_constant(name):
    raise BadRequest(f"The request body is not valid JSON: {name} is not a JSON number.")


def parse_body(raw):
    """The JSON object of a request body (bytes); `BadRequest` for invalid UTF-8, invalid
    JSON (NaN and Infinity included, which Python's json would take) or JSON nested
    deeper than Python's parser goes."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRequest(f"The request body is not valid UTF-8 (byte {e.start}).") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise BadRequest("The request body is not valid JSON: it is nested too deeply.") from None
    except ValueError as e:
        if isinstance(e, BadRequest):
            raise
        raise BadRequest(f"The request body is not valid JSON: {e}.") from None


def _integer(body, name, low, high, default=None):
    """`body[name]`, an integer (not a bool, not a float) in [low, high], or `default`."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"{name} must be an integer in [{low}, {high}]; got {_short(value)}.")
    return value


def _number(body, name, low, high):
    """`body[name]` as a float in [low, high], or None."""
    value = body.get(name)
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not low <= value <= high):  # fmt: skip
        raise BadRequest(f"{name} must be a number in [{low:g}, {high:g}]; got {_short(value)}.")
    return float(value)


def _short(value):
    """`value` as JSON, at most 80 characters (never a lone surrogate)."""
    if isinstance(value, float):
        return repr(value)
    try:
        return json.dumps(value)[:80]
    except RecursionError:
        return f"a deeply nested {type(value).__name__}"


def _text(value, what, max_characters, limit="max_characters"):
    """`value`, checked to be a string (or TF Serving's `{"b64": "..."}` of UTF-8 text)
    of at most `max_characters` characters, all of them encodable (no lone surrogate)."""
    if isinstance(value, dict) and set(value) == {"b64"}:
        value = _b64(value["b64"], what)
    if not isinstance(value, str):
        raise BadRequest(f"{what} is a {type(value).__name__}, not a string.")
    if len(value) > max_characters:
        raise BadRequest(
            f"{what} has {len(value)} characters; this server takes at most "
            f"{max_characters} ({Limits.flag(limit)})."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(
            f"{what} is not valid Unicode: a lone surrogate at character {e.start}."
        ) from None
    return value


def _b64(value, what):
    if not isinstance(value, str):
        raise BadRequest(f"{what}'s b64 is a {type(value).__name__}, not a base64 string.")
    try:
        return base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        raise BadRequest(f"{what}'s b64 is not base64 of UTF-8 text.") from None


def parse_sentences(body, limits):
    """`(sentences, columnar, prefix)` of a predict body, checked: TF Serving's row
    (`instances`) or columnar (`inputs`) format.

    `prefix`: the named input "prefix", as given (a row's `{"sentences": ..., "prefix":
    ...}`, None where a row has none; the columnar `"inputs": {"sentences": [...],
    "prefix": ...}`), or None; `_prefixes` checks it."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object with 'instances' or 'inputs'.")
    if ("instances" in body) == ("inputs" in body):
        raise BadRequest("The request must have exactly one of 'instances' or 'inputs'.")
    columnar = "inputs" in body
    values = body["inputs"] if columnar else body["instances"]
    prefix = None
    if columnar and isinstance(values, dict) and set(values) != {"b64"}:
        if "sentences" not in values or not set(values) <= ROW_INPUTS:
            raise BadRequest(
                "'inputs' has the input 'sentences' and optionally 'prefix'; got "
                f"{_short(sorted(values))}."
            )
        prefix = values.get("prefix")
        values = values["sentences"]
    if columnar and (isinstance(values, str) or isinstance(values, dict)):
        values = [values]
    if not isinstance(values, list):
        raise BadRequest(f"Expected a list of strings; got {type(values).__name__}.")
    if not values:
        raise BadRequest("No sentence to translate: the instances are empty.")
    if len(values) > limits.max_sentences:
        raise limits.over("max_sentences", "The request", f"{len(values)} sentences")
    sentences, row_prefixes = [], []
    for i, value in enumerate(values):
        row_prefix = None
        if isinstance(value, dict) and "sentences" in value and set(value) <= ROW_INPUTS:
            row_prefix = value.get("prefix")  # a row of named inputs
            value = value["sentences"]
        sentences.append(_text(value, f"Instance {i}", limits.max_characters))
        row_prefixes.append(row_prefix)
    if any(p is not None for p in row_prefixes):
        prefix = [p if p is not None else "" for p in row_prefixes]
    return sentences, columnar, prefix


def parse_settings(body, beam_sizes, default_beam, n_best=False):
    """The batch's search settings: `beam_size` (one of `beam_sizes`), `alpha`, and
    (CTranslate2, `n_best`) `num_hypotheses`."""
    signature = body.get("signature_name", DEFAULT_SIGNATURE)
    if signature not in (DEFAULT_SIGNATURE, GREEDY_SIGNATURE):
        raise BadRequest(
            f"Unknown signature_name {_short(signature)}; this model has "
            f"{DEFAULT_SIGNATURE!r} and {GREEDY_SIGNATURE!r}."
        )
    beam = 1 if signature == GREEDY_SIGNATURE else body.get("beam_size", default_beam)
    if isinstance(beam, bool) or not isinstance(beam, int) or beam not in beam_sizes:
        raise BadRequest(
            f"beam_size must be an integer, one of {list(beam_sizes)}; got {_short(beam)}."
        )
    settings = {"beam_size": beam}
    alpha = _number(body, "alpha", 0.0, MAX_ALPHA)
    if alpha is not None:
        settings["alpha"] = alpha
    if body.get("num_hypotheses") is not None:
        if not n_best:
            raise BadRequest(
                "num_hypotheses needs the CTranslate2 engine (--engine ctranslate2): "
                "translate.onnx returns the best hypothesis only."
            )
        settings["num_hypotheses"] = _integer(body, "num_hypotheses", 1, beam)
    return settings


def _prefixes(body, named, count, limits):
    """The forced target prefixes, one per sentence, or None (none, or all blank): the
    named input "prefix" (`named`, from `parse_sentences`) or the request's top-level
    `"prefix"`, each a string for every sentence or a list of one string per sentence."""
    value = body.get("prefix")
    if named is not None:
        if value is not None:
            raise BadRequest("prefix is given twice: as a named input and as a request field.")
        value = named
    if value is None:
        return None
    if isinstance(value, (str, dict)):
        value = [value] * count
    if not isinstance(value, list) or len(value) != count:
        raise BadRequest(
            f"prefix must be a string or a list of one string per sentence ({count}); "
            f"got {_short(value)}."
        )
    value = [_text(prefix, f"prefix {i}", limits.max_characters) for i, prefix in enumerate(value)]
    return None if all(not p.strip() for p in value) else value


def _term(value, what, limits):
    """A banned phrase or glossary term: a string within the term limits."""
    text = _text(value, what, limits.max_term_characters, "max_term_characters")
    words = len(_WORD.findall(text))
    if words > limits.max_term_words:
        raise limits.over("max_term_words", what, f"{words} words")
    return text


def _banned(body, limits):
    """The request's banned words and phrases (non-blank), or None."""
    value = body.get("banned")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(word, str) for word in value):
        raise BadRequest(
            f"banned must be a list of words or phrases (strings); got {_short(value)}."
        )
    if len(value) > limits.max_banned:
        raise limits.over("max_banned", "banned", f"{len(value)} phrases")
    words = [_term(word, f"banned {i}", limits) for i, word in enumerate(value)]
    return [word for word in words if word.strip()] or None


def _sampling(body, count):
    """`(settings, seeds)`: `sampling_topk` and `sampling_temperature` (the batch's; {}
    without sampling), and the request's `"seed"` as one seed per sentence, drawn as
    `Translator` and `OnnxTranslator` draw them (`frontend.steering_seeds`), or None."""
    topk = _integer(body, "sampling_topk", 0, INT32_MAX, default=1)  # 0: all; 1: no sampling
    temperature, seed = body.get("sampling_temperature"), body.get("seed")
    if topk == 1:
        for name, value in (("sampling_temperature", temperature), ("seed", seed)):
            if value is not None:
                raise BadRequest(f"{name} applies to sampling only: give sampling_topk 0 or > 1.")
        return {}, None
    temperature = _number(body, "sampling_temperature", *TEMPERATURES)
    settings = {"sampling_topk": topk, "sampling_temperature": temperature or 1.0}
    if seed is None:
        return settings, None
    if isinstance(seed, list):
        if len(seed) != count or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= INT32_MAX for s in seed
        ):
            raise BadRequest(
                f"seed must be an integer >= 0 or a list of {count} integers in [0, 2**31), "
                f"one per sentence; got {_short(seed)}."
            )
        return settings, list(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= INT32_MAX:
        raise BadRequest(
            f"seed must be an integer >= 0 (below 2**31) or a list of {count}; got {_short(seed)}."
        )
    return settings, seed


def parse_steering(body, named_prefix, count, supported, engine, limits):
    """`(settings, rows)` of a request's steering fields, checked: `settings` are the
    batch's (sampling's top-k and temperature: a request shares a batch only with
    requests with the same), `rows` the per-sentence steering (`target_prefix`,
    `banned`, `seed`: requests with different rows share a batch), or None.

    `supported`: the fields this engine takes (`LoadedTranslator.steering`)."""
    from keras_transformer.serving import frontend

    prefixes = _prefixes(body, named_prefix, count, limits)
    banned = _banned(body, limits)
    settings, seed = _sampling(body, count)
    given = [name for name, value in (("prefix", prefixes), ("banned", banned),
                                      ("sampling_topk", settings or None), ("seed", seed))
             if value is not None]  # fmt: skip
    missing = [name for name in given if name not in supported]
    if missing and engine == "onnx":
        raise BadRequest(
            f"This export has no translate_steered.onnx, the graph that {missing[0]} needs: "
            "it was exported by an older version; export the work directory again."
        )
    if missing:
        reason = {"seed": ": its sampling draws from CTranslate2's own generator, without "
                  "per-sentence seeds; sample without a seed, or serve --engine onnx"}  # fmt: skip
        raise BadRequest(
            f"{missing[0]} is not supported by --engine {engine}{reason.get(missing[0], '')}."
        )
    rows = {}
    if prefixes is not None:
        rows["target_prefix"] = prefixes
    if banned is not None:
        rows["banned"] = [banned] * count
    if settings and "seed" in supported:  # seeds drawn here: a request's, not its batch's
        rows["seed"] = frontend.steering_seeds(seed, count).tolist()
    return settings, rows or None


def parse_glossary(body, has_tags, limits=Limits()):
    """The request's `"glossary"` (this server's own field: `{"source term": "target
    term", ...}` or `[["source term", "target term"], ...]`) as a `Glossary`, or None;
    at most `max_glossary` entries, each term within the term limits."""
    from keras_transformer.terminology import Glossary

    value = body.get("glossary")
    if value is None:
        return None
    if not isinstance(value, (dict, list)):
        raise BadRequest(
            'glossary must be an object {"source term": "target term"} or a list of '
            f"[source term, target term] pairs; got {type(value).__name__}."
        )
    if len(value) > limits.max_glossary:
        raise limits.over("max_glossary", "glossary", f"{len(value)} entries")
    pairs = list(value.items()) if isinstance(value, dict) else value
    for i, pair in enumerate(pairs):
        if isinstance(pair, (list, tuple)) and len(pair) == 2:
            for side, term in zip(("source", "target"), pair, strict=True):
                _term(term, f"glossary entry {i}'s {side} term", limits)
    try:
        glossary = Glossary.from_value(pairs)
    except (TypeError, ValueError) as e:
        raise BadRequest(str(e)) from None
    if len(glossary) and not has_tags:
        raise BadRequest(
            "This model cannot take a glossary: it was trained without --terminology "
            "(its vocabulary has no glossary tags)."
        )
    return glossary


@dataclasses.dataclass
class Parsed:
    """A predict request, checked: what the queue takes, and how to answer."""

    sentences: list
    settings: dict  # the batch's (beam_size, alpha, num_hypotheses, sampling)
    rows: dict | None  # per-sentence steering
    glossary: object  # a terminology.Glossary, or None
    columnar: bool  # answer as "outputs" (else "predictions")


def parse_request(body, info, limits, engine):
    """The `Parsed` request of a decoded predict body; `info`: the served version's
    (`worker_load`'s answer: beam sizes, glossary, steering)."""
    sentences, columnar, prefix = parse_sentences(body, limits)
    settings = parse_settings(
        body, info["beam_sizes"], info["default_beam"], engine == "ctranslate2"
    )
    work = sum(len(s) for s in sentences) * max(settings["beam_size"], 1)
    if work > limits.max_work:
        raise limits.over(
            "max_work", "The request", f"{work} characters x beam ({settings['beam_size']})"
        )
    glossary = parse_glossary(body, info.get("glossary", False), limits)
    sampling, rows = parse_steering(
        body, prefix, len(sentences), info.get("steering", ()), engine, limits
    )
    if sampling and settings.get("num_hypotheses", 1) > 1:
        raise BadRequest("num_hypotheses must be 1 with sampling (one sample per sentence).")
    settings.update(sampling)
    return Parsed(sentences, settings, rows, glossary, columnar)
