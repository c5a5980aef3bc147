"""Requests of `keras-transformer-serve`, read and checked: TF Serving's row and columnar
formats and this server's own fields (search settings, glossary, steering).

Each `parse_*` function takes the decoded JSON body and raises `BadRequest`
with one line naming the problem, which the server answers with TF Serving's
error shape and status 400.
"""

import json

GREEDY_SIGNATURE = "translate_greedy"
DEFAULT_SIGNATURE = "serving_default"


class BadRequest(ValueError):
    """A request this server refuses: answered 400 with TF Serving's error shape."""


ROW_INPUTS = {"sentences", "prefix"}  # the named inputs of a row (or of columnar inputs)


def _text(value, what, max_characters):
    """`value`, checked to be a string of at most `max_characters` (`what` names it)."""
    if not isinstance(value, str):
        raise BadRequest(f"{what} is a {type(value).__name__}, not a string.")
    if len(value) > max_characters:
        raise BadRequest(
            f"{what} has {len(value)} characters; this server takes at most "
            f"{max_characters} (--max-characters)."
        )
    return value


def parse_sentences(body, max_sentences, max_characters):
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
    if columnar and isinstance(values, dict):
        if "sentences" not in values or not set(values) <= ROW_INPUTS:
            raise BadRequest(
                f"'inputs' has the input 'sentences' and optionally 'prefix'; got {sorted(values)}."
            )
        prefix = values.get("prefix")
        values = values["sentences"]
    if isinstance(values, str) and columnar:
        values = [values]
    if not isinstance(values, list):
        raise BadRequest(f"Expected a list of strings; got {type(values).__name__}.")
    sentences, row_prefixes = [], []
    for i, value in enumerate(values):
        row_prefix = None
        if isinstance(value, dict) and "sentences" in value and set(value) <= ROW_INPUTS:
            row_prefix = value.get("prefix")  # a row of named inputs
            value = value["sentences"]
        sentences.append(_text(value, f"Instance {i}", max_characters))
        row_prefixes.append(row_prefix)
    if not sentences:
        raise BadRequest("No sentence to translate: the instances are empty.")
    if len(sentences) > max_sentences:
        raise BadRequest(
            f"{len(sentences)} sentences in one request; this server takes at most "
            f"{max_sentences} (--max-sentences)."
        )
    if any(p is not None for p in row_prefixes):
        prefix = [p if p is not None else "" for p in row_prefixes]
    return sentences, columnar, prefix


def parse_settings(body, beam_sizes, default_beam, n_best=False):
    signature = body.get("signature_name", DEFAULT_SIGNATURE)
    if signature not in (DEFAULT_SIGNATURE, GREEDY_SIGNATURE):
        raise BadRequest(
            f"Unknown signature_name {signature!r}; this model has {DEFAULT_SIGNATURE!r} and "
            f"{GREEDY_SIGNATURE!r}."
        )
    beam = 1 if signature == GREEDY_SIGNATURE else body.get("beam_size", default_beam)
    if beam not in beam_sizes:
        raise BadRequest(f"beam_size must be one of {list(beam_sizes)}; got {beam!r}.")
    settings = {"beam_size": beam}
    if "alpha" in body:
        alpha = body["alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
            raise BadRequest(f"alpha must be a number >= 0; got {alpha!r}.")
        settings["alpha"] = float(alpha)
    if body.get("num_hypotheses") is not None:
        n = body["num_hypotheses"]
        if not n_best:
            raise BadRequest(
                "num_hypotheses needs the CTranslate2 engine (--engine ctranslate2): "
                "translate.onnx returns the best hypothesis only."
            )
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= beam:
            raise BadRequest(f"num_hypotheses must be an integer in [1, {beam}]; got {n!r}.")
        settings["num_hypotheses"] = n
    return settings


def _prefixes(body, named, count, max_characters):
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
    if isinstance(value, str):
        value = [value] * count
    if not isinstance(value, list) or len(value) != count:
        raise BadRequest(
            f"prefix must be a string or a list of one string per sentence ({count}); "
            f"got {json.dumps(value)[:80]}."
        )
    for i, prefix in enumerate(value):
        _text(prefix, f"prefix {i}", max_characters)
    return None if all(not p.strip() for p in value) else value


def _banned(body, max_characters):
    """The request's banned words and phrases (non-blank), or None."""
    value = body.get("banned")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(word, str) for word in value):
        raise BadRequest(
            f"banned must be a list of words or phrases (strings); got {json.dumps(value)[:80]}."
        )
    for word in value:
        if len(word) > max_characters:
            raise BadRequest(
                f"banned has a word of {len(word)} characters; this server takes at most "
                f"{max_characters} (--max-characters)."
            )
    words = [word for word in value if word.strip()]
    return words or None


def _sampling(body, count):
    """`(settings, seeds)`: `sampling_topk` and `sampling_temperature` (the batch's; {}
    without sampling), and the request's `"seed"` as one seed per sentence, drawn as
    `Translator` and `OnnxTranslator` draw them (`frontend.steering_seeds`), or None."""
    topk = body.get("sampling_topk", 1)
    if topk is None:
        topk = 1
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 0:
        raise BadRequest(
            "sampling_topk must be an integer >= 0 (0: sample among all tokens; 1: no "
            f"sampling); got {topk!r}."
        )
    temperature, seed = body.get("sampling_temperature"), body.get("seed")
    if topk == 1:
        for name, value in (("sampling_temperature", temperature), ("seed", seed)):
            if value is not None:
                raise BadRequest(f"{name} applies to sampling only: give sampling_topk 0 or > 1.")
        return {}, None
    if temperature is None:
        temperature = 1.0
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or not 0 < temperature < float("inf")):  # fmt: skip
        raise BadRequest(f"sampling_temperature must be a number > 0; got {temperature!r}.")
    settings = {"sampling_topk": topk, "sampling_temperature": float(temperature)}
    if seed is None:
        return settings, None
    if isinstance(seed, list):
        if len(seed) != count or not all(
            isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**31 for s in seed
        ):
            raise BadRequest(
                f"seed must be an integer >= 0 or a list of {count} integers in [0, 2**31), "
                f"one per sentence; got {json.dumps(seed)[:80]}."
            )
        return settings, list(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise BadRequest(f"seed must be an integer >= 0 or a list of {count}; got {seed!r}.")
    return settings, seed


def parse_steering(body, named_prefix, count, supported, engine, max_characters):
    """`(settings, rows)` of a request's steering fields, checked: `settings` are the
    batch's (sampling's top-k and temperature: a request shares a batch only with
    requests with the same), `rows` the per-sentence steering (`target_prefix`,
    `banned`, `seed`: requests with different rows share a batch), or None.

    `supported`: the fields this engine takes (`LoadedTranslator.steering`)."""
    from keras_transformer import frontend

    prefixes = _prefixes(body, named_prefix, count, max_characters)
    banned = _banned(body, max_characters)
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


def parse_glossary(body, has_tags):
    """The request's `"glossary"` (this server's own field: `{"source term": "target
    term", ...}` or `[["source term", "target term"], ...]`) as a `Glossary`, or None."""
    from keras_transformer.terminology import Glossary

    value = body.get("glossary")
    if value is None:
        return None
    if not isinstance(value, (dict, list)):
        raise BadRequest(
            'glossary must be an object {"source term": "target term"} or a list of '
            f"[source term, target term] pairs; got {type(value).__name__}."
        )
    try:
        glossary = Glossary.from_value(value)
    except (TypeError, ValueError) as e:
        raise BadRequest(str(e)) from None
    if len(glossary) and not has_tags:
        raise BadRequest(
            "This model cannot take a glossary: it was trained without --terminology "
            "(its vocabulary has no glossary tags)."
        )
    return glossary
