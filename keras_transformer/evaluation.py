"""Translating and scoring with sacrebleu: the evaluation of a trained model."""

from keras_transformer.translator import Translator


def make_translate_fn(model, tokenizer, beam_size=1, alpha=0.6, batch_size=64):
    """`translate(list of str) -> list of str` with the model's key/value cache.

    Beam search decodes `beam_size` hypotheses per sentence, so the batch of
    sentences shrinks by that factor to keep the decoding batch constant.
    """
    translator = Translator(
        model,
        tokenizer,
        beam_size=beam_size,
        alpha=alpha,
        batch_size=max(8, batch_size // beam_size),
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
