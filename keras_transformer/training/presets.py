"""The training defaults of each preset, and the model config a corpus implies.

`TrainingConfig` (options.py) leaves what it is not given at None; these
tables say what None means per preset, and `model_config` what a corpus of a
given size changes in the preset's `TransformerConfig`.
"""

import dataclasses

from keras_transformer.search import PAPER

# The model's shape, each overridable from the command line.
SHAPE = ("encoder_layers", "decoder_layers", "d_model", "num_heads", "d_ff")

# Sampled segmentations of the training pairs with --bpe-dropout: each costs one
# more tokenization of them and their size on disk (docs/training.md, "BPE-dropout").
BPE_DROPOUT_COPIES = 8

# Per-preset training defaults; command-line options override them.
TRAINING_DEFAULTS = {
    # The default run: 22 minutes of training on a 2-core CPU, then beam search on
    # the first 1,000 test pairs (`--test-samples 0`: all), within 30 minutes in
    # all, install included (docs/training.md, "Measured: the default run": about 5 minutes
    # go to install, start-up, averaging, test decoding and export). Small batches
    # and a short warm-up: in this budget the number of updates limits learning.
    "cpu": dict(
        epochs=200,
        steps=200,  # an epoch is a checkpoint: enough of them to average
        batch_tokens=1024,
        warmup_steps=300,
        learning_rate_scale=0.5,  # peak 1.8e-3; 1.0 learned slower
        max_train_minutes=22.0,
        test_samples=1000,
        validation_bleu_every=0,  # the test decode at the end measures quality
        # A pass over Ding's 4,367 validation pairs costs ~3 s, 6% of a 200-step
        # epoch on the EPYC; every other epoch (and the last) halves that.
        validation_every=2,
        # Averaging the last 2 of 200-step checkpoints won in both measured default
        # runs (validation loss 4.516 -> 4.472); 5 and 8 lost (docs/training.md).
        average_last=3,
        # An exponential moving average of the weights beat averaging the last
        # checkpoints of the same run, a little, on both measured corpora (22-minute
        # runs, 2-core AMD EPYC Zen 5, 2026-11-26; docs/training.md, "Weight averaging"):
        # Ding test chrF 32.47 vs 32.29 (last 5) and 31.83 (last weights); its full
        # sentences as one's own corpus 26.84 vs 26.55 and 25.91.
        ema=0.999,
        # The search, chosen on the validation split with benchmarks/search_sweep.py
        # (the 22-minute default model, 2-core AMD EPYC Zen 5, 2026-11-26; docs/performance.md,
        # "Serving"): stopping once 8 hypotheses ended (beam 4, patience 2) with alpha 1.5
        # beat the exact bound at alpha 1.0 by 0.9 chrF there and by 0.8 on the test
        # pairs (1.0 on their full sentences), decoding in half the time; alpha 1.5 under
        # the exact bound lost 1.5 (it searches to the length limit and favours long output).
        alpha=1.5,
        stopping="k_finished",
        patience=2.0,
    ),  # fmt: skip
    "small": dict(epochs=10, steps=400, batch_tokens=2048, warmup_steps=500),
    "tiny": dict(epochs=2, steps=20, batch_tokens=512, warmup_steps=50),
    "base": dict(epochs=100, steps=1000, batch_tokens=25000, warmup_steps=4000),
    "big": dict(epochs=300, steps=1000, batch_tokens=25000, warmup_steps=4000),
}
# What a preset's entry above leaves out.
COMMON_DEFAULTS = dict(
    learning_rate_scale=1.0,  # the paper's curve
    average_last=8,  # checkpoints averaged at most (k in 1, 2, 3, 5, 8)
    validation_bleu_every=1,  # greedy validation BLEU every epoch
    validation_every=1,  # validation loss every epoch
    test_samples=0,  # all test pairs
    max_train_minutes=None,  # no time budget
    cooldown=0.0,  # the paper's schedule to the end
    beam_size=PAPER.beam_size,
    alpha=PAPER.alpha,
    stopping=PAPER.stopping,
    patience=PAPER.patience,
    sentence_repeats=1,  # every training pair once per pass
    label_smoothing=0.1,  # the paper's (recipe.LABEL_SMOOTHING)
    # BPE merges converge long before the Ding dictionary's 750k lines, and training
    # on all of them takes minutes on 2 cores (vocabulary.train_vocabulary).
    vocab_sample_size=300_000,
    bpe_dropout=0.0,  # off: every pass reads the one deterministic segmentation
    bpe_dropout_copies=BPE_DROPOUT_COPIES,
)

# `corpus_defaults`: below this many training pairs, the cpu preset trains with dropout.
SMALL_CORPUS_PAIRS = 200_000
SMALL_CORPUS_DROPOUT = 0.1


def corpus_defaults(train_pairs, preset):
    """Config overrides for a corpus of `train_pairs` training pairs
    (docs/data.md, "Your own data").

    The `cpu` preset trains without dropout: it sees Ding's 377k pairs about
    1.8 times in its 22 minutes. A corpus under 200k pairs is seen many
    times in the same budget. Measured on Ding's 18k full sentences (2-core
    AMD EPYC Zen 3, benchmarks/README.md "Own data"): in 10 minutes (6
    passes) dropout 0 had stopped improving on the validation pairs while
    0.1 still improved, and 0.1 ended ahead at 22 minutes; 0.3, the
    published small-data recipes' value for runs of many more epochs, lost
    7 chrF at 10 minutes. The `small` and `tiny` presets have 0.1 already.

    Returns:
        dict of `TransformerConfig` fields (possibly empty).
    """
    if train_pairs < SMALL_CORPUS_PAIRS and preset == "cpu":
        return {"dropout": SMALL_CORPUS_DROPOUT}
    return {}


def model_config(config, train_pairs=None, corpus="ding", finished=None):
    """The `TransformerConfig` trained: the preset's, with the corpus's and the options'
    overrides, or `--init-from`'s (whose architecture and vocabulary are kept).

    Args:
        config: the resolved `TrainingConfig`.
        train_pairs, corpus: the corpus's training pairs and name (`corpus_defaults`
            apply off Ding, whose pairs the presets were measured on).
        finished: `lifecycle.FinishedRun` of `--init-from`, or None.

    Returns:
        `(TransformerConfig, picked)`: `picked` the corpus-size defaults taken.
    """
    from keras_transformer.config import get_preset

    changes = model_overrides(config)  # what the command line sets
    if finished is not None:
        saved = get_preset(config.preset, **finished.run_info["config"])
        if changes.get("vocab_size", saved.vocab_size) != saved.vocab_size:
            raise ValueError(
                f"--init-from {finished.work.path} keeps its {saved.vocab_size}-piece vocabulary. "
                f"Received: vocab_size={config.vocab_size}"
            )
        return dataclasses.replace(saved, **changes), {}
    picked = {}
    if corpus != "ding":  # the presets' defaults are measured on Ding
        # What the command line sets is not picked (nor said to be).
        picked = {
            k: v for k, v in corpus_defaults(train_pairs, config.preset).items() if k not in changes
        }
    return get_preset(config.preset, **picked, **changes), picked


def model_overrides(config):
    """The `TransformerConfig` fields the options set (those given, not None)."""
    names = ("vocab_size", "dropout", "attention_dropout", *SHAPE, "max_length")
    changes = {name: getattr(config, name) for name in names}
    changes["use_fused_attention"] = config.fused_attention
    return {name: value for name, value in changes.items() if value is not None}
