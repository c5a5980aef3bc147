"""The training defaults of each preset, and the model config a corpus implies.

`TrainingConfig` (options.py) leaves what it is not given at None; these
tables say what None means per preset, `model_config` the preset's
`TransformerConfig` with the options' changes, and `corpus_defaults` what the
passes a budget buys over a corpus change in it (budget.py settles them).
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
        # At most the last 3 of the 200-step checkpoints, k in 1, 2, 3 chosen by
        # validation loss, the EMA's weights its 1 (docs/training.md, "Weight averaging").
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
    dropout_start=0.0,  # dropout from the first step
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

# `corpus_defaults`: the `cpu` preset's dropout grows with the passes its budget buys over
# the training pairs, from its own 0 up to `DROPOUT_RAMP[0]` passes, linearly to
# `CORPUS_DROPOUT` at `DROPOUT_RAMP[1]` and on (docs/training.md, "Dropout by the passes").
# Measured, one core per run: dropout 0 ahead of 0.1 by 2.1 to 5.3 chrF at 3.7 to 7.4
# passes, level or behind at 8.3 to 8.6 (-0.15 on Ding's sentences, -3.55 on a 30k-pair
# sample), 0.1 ahead by 1.2 at 12 to 13.5; a step at 8 passes put runs a few hundred steps
# apart on the two sides of a 3-chrF cliff. At 10 passes over the 30k sample, 0.05 and
# 0.2 each lost about 3 chrF beside 0.1 (the ramp's top), and 0.1 turned on after 30% or
# 50% of the budget (`--dropout-start`) 1.3 and 1.7.
DROPOUT_RAMP = (6.0, 10.0)
CORPUS_DROPOUT = 0.1
# The `cpu` preset's seconds per step on 2 CPU cores, for the passes a time budget buys
# before a model exists to time: the calibration's choice on a 2-core AMD EPYC Zen 4
# (mixed_bfloat16, 210 ms; docs/performance.md, "Precision and XLA"). The Zen 5 of the
# default run steps in about half that (12,855 steps in 22 minutes), so it makes about
# twice the passes estimated here; one core in float32 about a third. Measured with
# FFN 1024, the preset's width until 2026-11-29: FFN 512 makes 14-25% more steps, which
# the calibration's measured step then puts right (`training/budget.py`).
CPU_STEP_SECONDS = 0.21


def budget_passes(config, batches_per_pass, step_seconds=CPU_STEP_SECONDS):
    """The passes over the training pairs that `config`'s budget buys: its epochs x steps
    batches, or fewer where its time budget ends first at `step_seconds` a step."""
    steps = config.epochs * config.steps
    if config.max_train_minutes is not None:  # 0: one step
        steps = min(steps, max(1.0, 60 * config.max_train_minutes / step_seconds))
    return steps / max(batches_per_pass, 1)


def corpus_defaults(passes, preset):
    """Config overrides for a run that makes `passes` passes over its training pairs
    (`budget_passes`; docs/data.md, "Your own data").

    The `cpu` preset trains without dropout, as suits its default run: 2.4
    passes over Ding's 377k pairs in 22 minutes on a 2-core Zen 4, about 5 on a
    Zen 5. A corpus its budget sees more than `DROPOUT_RAMP[0]` times (about 6.2,
    after rounding to 0.01) trains with dropout, growing linearly to
    `CORPUS_DROPOUT` at `DROPOUT_RAMP[1]` passes and more (2-core AMD EPYC Zen 4,
    one core per run, 2026-11-28,
    docs/training.md, "Dropout by the passes"): dropout 0 led by 3.7 chrF after
    4 passes over Ding's 18k full sentences and by 3.4 and 5.3 after 3.7-3.9 over
    a 100k-pair sample, and had lost the lead after 8.3; on a Zen 3 (2-core runs,
    5.4-5.9 and 12-13.5 passes) 0 led by 2.1 and then 0.1 by 1.2, and on a 30k-pair
    sample (one core per run) 0 by 2.6 after 7 passes and 0.1 by 3.6 after 8.5. 0.3, the
    published small-data recipes' value for runs of many more epochs, lost 7
    chrF there at 10 minutes. The `small` and `tiny` presets have 0.1 already.

    Returns:
        dict of `TransformerConfig` fields (possibly empty).
    """
    low, high = DROPOUT_RAMP
    share = min(1.0, max(0.0, (passes - low) / (high - low)))
    dropout = round(CORPUS_DROPOUT * share, 2)  # in steps of 0.01, for the log and run.json
    return {"dropout": dropout} if preset == "cpu" and dropout else {}


def model_config(config, finished=None):
    """The `TransformerConfig` trained before the corpus's defaults (`corpus_picks`):
    the preset's with the options' overrides, or `--init-from`'s (whose architecture
    and vocabulary are kept).

    Args:
        config: the resolved `TrainingConfig`.
        finished: `lifecycle.FinishedRun` of `--init-from`, or None.
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
        return dataclasses.replace(saved, **changes)
    return get_preset(config.preset, **changes)


def corpus_picks(config, passes, finished=None):
    """What `corpus_defaults` changes in `model_config`'s config for a run of `passes`
    passes: nothing the command line sets (nor said to be picked), nothing for
    `--init-from` (whose model is kept)."""
    if finished is not None:
        return {}
    changes = model_overrides(config)
    return {k: v for k, v in corpus_defaults(passes, config.preset).items() if k not in changes}


def model_overrides(config):
    """The `TransformerConfig` fields the options set (those given, not None)."""
    names = ("vocab_size", "dropout", "attention_dropout", *SHAPE, "max_length")
    changes = {name: getattr(config, name) for name in names}
    changes["use_fused_attention"] = config.fused_attention
    return {name: value for name, value in changes.items() if value is not None}
