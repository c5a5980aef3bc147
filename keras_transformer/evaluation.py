"""Translating and scoring with sacrebleu: the evaluation of a trained model."""

from keras_transformer.search import PAPER
from keras_transformer.translator import Translator


def make_translate_fn(model, tokenizer, search=PAPER, batch_size=64):
    """`translate(list of str) -> list of str` with the model's key/value cache.

    Args:
        search: a `SearchConfig`. Beam search decodes `beam_size` hypotheses
            per sentence, so the batch of sentences shrinks by that factor to
            keep the decoding batch constant.
    """
    translator = Translator(
        model, tokenizer, search=search, batch_size=max(8, batch_size // search.beam_size)
    )
    return translator.translate


def score(hypotheses, references):
    """sacreBLEU and chrF of `hypotheses` against one reference each."""
    import sacrebleu

    return {
        "bleu": float(sacrebleu.corpus_bleu(hypotheses, [references]).score),
        "chrf": float(sacrebleu.corpus_chrf(hypotheses, [references]).score),
        "segments": len(hypotheses),
    }


def normalize_for_match(text):
    """The normalization of exact match: casefolded, whitespace collapsed to one
    space and stripped, trailing full stops removed (`" The  Dog. "` -> `"the dog"`)."""
    return " ".join(text.casefold().split()).rstrip(".").rstrip()


def score_multi(hypotheses, reference_lists):
    """sacreBLEU, chrF and exact match against every accepted reference.

    Args:
        hypotheses: list of str.
        reference_lists: one non-empty list of str per hypothesis; its first
            element is the single reference that `score` would use.

    Returns:
        dict with
        - `bleu`, `chrf`: sacrebleu with one reference stream per accepted
          translation. A segment with fewer references has `None` in the
          streams it lacks, which sacrebleu drops for that segment (an empty
          string would count as a reference of length 0).
        - `bleu_single`, `chrf_single`: the same against the first reference
          only, equal to `score(hypotheses, [refs[0] for refs in reference_lists])`.
        - `exact_match`, `exact_match_first`: the fraction of hypotheses equal to
          any accepted reference / to the first one, both sides passed through
          `normalize_for_match` (casefold, collapse and strip whitespace, strip
          trailing `.`).
        - `segments`, `references_per_segment` (mean).
    """
    if len(hypotheses) != len(reference_lists) or not hypotheses:
        raise ValueError(
            "Expected one reference list per hypothesis, at least one. Received: "
            f"{len(hypotheses)} hypotheses and {len(reference_lists)} reference lists"
        )
    empty = [i for i, refs in enumerate(reference_lists) if not refs]
    if empty:
        raise ValueError(f"Every segment needs a reference. Received: none for segments {empty}")
    import sacrebleu

    num_streams = max(len(refs) for refs in reference_lists)
    # Stream k holds every segment's k-th reference, None where a segment has fewer.
    streams = [
        [refs[k] if k < len(refs) else None for refs in reference_lists] for k in range(num_streams)
    ]
    single = score(hypotheses, streams[0])
    match_any = match_first = 0
    for hypothesis, refs in zip(hypotheses, reference_lists, strict=True):
        hypothesis, refs = normalize_for_match(hypothesis), [normalize_for_match(r) for r in refs]
        match_any += hypothesis in refs
        match_first += hypothesis == refs[0]
    segments = len(hypotheses)
    return {
        "bleu": float(sacrebleu.corpus_bleu(hypotheses, streams).score),
        "chrf": float(sacrebleu.corpus_chrf(hypotheses, streams).score),
        "bleu_single": single["bleu"],
        "chrf_single": single["chrf"],
        "exact_match": match_any / segments,
        "exact_match_first": match_first / segments,
        "segments": segments,
        "references_per_segment": sum(len(refs) for refs in reference_lists) / segments,
    }
