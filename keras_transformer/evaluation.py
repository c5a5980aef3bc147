"""The evaluation of a trained model: translating and scoring with sacrebleu, the
test split's scores (the Ding dictionary's own included), and the validation loss."""

from keras_transformer.search import PAPER
from keras_transformer.translators.keras_translator import Translator


def make_translator(model, tokenizer, search=PAPER, batch_size=64):
    """The `Translator` of evaluation: `batch_size` hypotheses decoded together.

    Args:
        search: a `SearchConfig`. Beam search decodes `beam_size` hypotheses
            per sentence, so the batch of sentences shrinks by that factor to
            keep the decoding batch constant.
    """
    return Translator(
        model, tokenizer, search=search, batch_size=max(8, batch_size // search.beam_size)
    )


def make_translate_fn(model, tokenizer, search=PAPER, batch_size=64):
    """`translate(list of str) -> list of str` with the model's key/value cache."""
    return make_translator(model, tokenizer, search, batch_size).translate


def score(hypotheses, references):
    """sacreBLEU and chrF of `hypotheses` against one reference each."""
    import sacrebleu

    return {
        "bleu": float(sacrebleu.corpus_bleu(hypotheses, [references]).score),
        "chrf": float(sacrebleu.corpus_chrf(hypotheses, [references]).score),
        "segments": len(hypotheses),
    }


def validation_loss(model, batches, pad_id):
    """Token-weighted label-smoothed loss over `batches`, whole validation passes
    (`val_ds.evaluation()`); the model's compile state is left alone."""
    import keras

    from keras_transformer.recipe import paper_loss

    loss_fn = paper_loss(pad_id)
    total = tokens = 0.0
    for features, labels in batches:
        real = float(keras.ops.sum(keras.ops.cast(labels != pad_id, "float32")))
        # The compiled forward pass: eager calls took 43 s per pass of Ding's
        # validation split, 3 to 4 passes per run (docs/training.md, "Measured: the
        # default run").
        logits = model.predict_on_batch(features)
        total += float(loss_fn(labels, logits)) * real
        tokens += real
    return total / tokens


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


def score_test(pairs, hypotheses, corpus="", ding_path=None, samples_per_kind=4):
    """The test split's scores, and a few samples to print.

    Args:
        pairs: the test `(source, reference)` pairs; `hypotheses` their translations.
        corpus: the corpus's name; on `"ding"` the dictionary's own structure adds
            the full sentences' scores and the phrases' against every accepted
            translation (`ding.accepted_references`).

    Returns:
        `(metrics, samples)`: `metrics["test"]` (and on Ding `test_sentences`,
        `test_all_references`, `test_phrases_all_references`); `samples` a list of
        `{"source", "reference", "translation"}`: the first phrases, then sentences.
    """
    references = [t for _, t in pairs]
    metrics = {"test": score(hypotheses, references)}
    sentences = []
    if corpus == "ding":
        sentences = _score_ding(metrics, pairs, hypotheses, ding_path)
    if sentences:
        metrics["test_sentences"] = score(
            [hypotheses[i] for i in sentences], [references[i] for i in sentences]
        )
    sentence_set = set(sentences)
    phrases = [i for i in range(len(pairs)) if i not in sentence_set]
    shown = phrases[: samples_per_kind if sentences else 2 * samples_per_kind]
    samples = [
        {"source": pairs[i][0], "reference": references[i], "translation": hypotheses[i]}
        for i in shown + sentences[:samples_per_kind]
    ]
    return metrics, samples


def _score_ding(metrics, pairs, hypotheses, ding_path):
    """Adds the multi-reference scores of the Ding dictionary; returns its sentence indices."""
    from keras_transformer.data import ding

    sentences = [i for i, (s, t) in enumerate(pairs) if ding.is_sentence(s, t)]
    # A Ding entry often accepts several translations (`;` synonyms, other senses).
    accepted = ding.accepted_references(
        pairs, ding.accepted_translations(ding_path or ding.DEFAULT_CORPUS_PATH)
    )
    sentence_set = set(sentences)
    phrases = [i for i in range(len(pairs)) if i not in sentence_set]
    metrics["test_all_references"] = score_multi(hypotheses, accepted)
    if phrases:
        metrics["test_phrases_all_references"] = score_multi(
            [hypotheses[i] for i in phrases], [accepted[i] for i in phrases]
        )
    return sentences
