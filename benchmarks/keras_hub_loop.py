"""The reference of `quality.py`: a careful keras-hub training loop, decode included.

    python benchmarks/keras_hub_loop.py --work-dir W --preset cpu --minutes 15 \\
        --batch-tokens 1024 --warmup-steps 300 [--dataset ding | --data-dir DIR] \\
        [--decode-file W/heldout.json]

What a keras-hub user who has read the paper writes, sharing nothing with
`keras_transformer` but the corpus loader, the `TransformerConfig` dims,
`keras_transformer.hardware.configure_threads()` and the keras-hub model of
`_common._keras_hub_model` (`ReversibleEmbedding` tied, `SinePositionEncoding`,
post-LN `TransformerEncoder` / `TransformerDecoder`):

- data: every train pair is tokenized once with the `sentencepiece` package
  and `W/vocab.model` (pad 0, unk 1, bos 2, eos 3): source = pieces + EOS,
  decoder input = BOS + pieces, labels = pieces + EOS; pairs longer than
  `max_length` are dropped. Each epoch the pairs are sorted by length (random
  order within a length) and cut into batches of at most `batch_tokens`
  tokens on the longer side, padding included (`batch_size * longest <=
  batch_tokens`); the batch order is shuffled.
- step: a `tf.function(reduce_retracing=True)` over numpy batches; Adam
  (0.9, 0.98, 1e-9) on the paper's schedule `scale * d_model^-0.5 *
  min(step^-0.5, step * warmup^-1.5)`; `keras.losses.CategoricalCrossentropy
  (from_logits=True, label_smoothing=0.1)` averaged over real target tokens.
- input: the next batches are padded in a thread while a step runs (as
  train.py's input pipeline prefetches), outside the timed window.
- budget: `--minutes` of training-loop time, checked after every step. The
  validation loss (same label-smoothed loss, all validation pairs by default)
  is measured every `--eval-minutes` with the clock paused, so the curve's
  minutes are training minutes.
- decode: `keras_hub.samplers.BeamSampler(num_beams=4)` over a cached
  `next(prompt, cache, index)` (the `TransformerDecoder` self- and
  cross-attention caches, as keras-hub's BART does). A beam that has emitted
  EOS is extended with padding at log-probability 0, so finished hypotheses
  keep their score; the 4 final beams are re-ranked with the GNMT length
  penalty `((5 + length) / 6) ** alpha` (`--alpha 0`: BeamSampler's own pick).

Writes `W/keras_hub_result.json` (numbers, curve, hypotheses) and prints one
JSON line (the same without the hypotheses).
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

RESULT_FILE = "keras_hub_result.json"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work-dir", required=True, help="holds vocab.model; gets the result")
    parser.add_argument("--dataset", default="ding")
    parser.add_argument("--data-dir", help="folder of train.xx/train.yy, validation.*, test.*")
    parser.add_argument("--direction", help="e.g. de-en (default: the corpus order)")
    parser.add_argument("--tfds-data-dir", help="where the corpus is prepared (train.py's W/tfds)")
    parser.add_argument("--preset", default="cpu")
    parser.add_argument("--vocab-size", type=int, help="must match vocab.model (default: preset)")
    parser.add_argument("--dropout", type=float, help="(default: the preset's)")
    parser.add_argument(
        "--attention-dropout", type=float,
        help="of the attention probabilities (default: the preset's, 0 as in the paper; "
        "keras-hub's blocks would use --dropout there too)",
    )  # fmt: skip
    parser.add_argument("--dtype-policy", default="float32", choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--batch-tokens", type=int, default=1024)
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument(
        "--lr-scale", type=float, default=1.0, help="scale of the paper's schedule (1.0 there)"
    )
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--minutes", type=float, default=15.0, help="training-loop time budget")
    parser.add_argument(
        "--eval-minutes", type=float, help="validation loss every this many training minutes "
        "(default: a sixth of --minutes)"
    )  # fmt: skip
    parser.add_argument("--val-pairs", type=int, default=0, help="validation pairs (0: all)")
    parser.add_argument("--decode-file", help="JSON with a list 'sources' to translate at the end")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty of the re-rank")
    parser.add_argument("--decode-batch", type=int, default=16, help="sentences per beam search")
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args(argv)


# --------------------------------------------------------------------------- data


@dataclasses.dataclass
class Pairs:
    """Tokenized pairs: `source[i]` = pieces + EOS, `target[i]` = pieces (int32 arrays)."""

    source: list
    target: list
    lengths: object  # (N,) max(len(source), len(target) + 1): the batch width a pair needs
    dropped: int


def tokenize(string_pairs, processor, max_length, eos_id):
    """A list of `(source, target)` strings -> `Pairs`, pairs longer than `max_length` dropped."""
    import numpy as np

    source, target, dropped = [], [], 0
    for start in range(0, len(string_pairs), 4096):
        chunk = string_pairs[start : start + 4096]
        source_pieces = processor.encode([s for s, _ in chunk])
        target_pieces = processor.encode([t for _, t in chunk])
        for s, t in zip(source_pieces, target_pieces, strict=True):
            if len(s) + 1 > max_length or len(t) + 1 > max_length:
                dropped += 1
                continue
            source.append(np.array(s + [eos_id], dtype="int32"))
            target.append(np.array(t, dtype="int32"))
    lengths = np.array(
        [max(len(s), len(t) + 1) for s, t in zip(source, target, strict=True)], dtype="int64"
    )
    return Pairs(source, target, lengths, dropped)


def make_batches(lengths, batch_tokens, rng=None):
    """Index arrays of batches with `len(batch) * longest <= batch_tokens`, sorted by length.

    `rng` shuffles the pairs within each length and the order of the batches;
    None keeps corpus order (validation).
    """
    import numpy as np

    order = np.arange(len(lengths)) if rng is None else rng.permutation(len(lengths))
    order = order[np.argsort(lengths[order], kind="stable")]
    batches, start = [], 0
    for i, index in enumerate(order):
        if (i + 1 - start) * lengths[index] > batch_tokens:
            batches.append(order[start:i])
            start = i
    if start < len(order):
        batches.append(order[start:])
    if rng is not None:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return batches


def padding_share(pairs, batches):
    """Pad positions / all positions of `batches`, source and target (labels) together."""
    real = positions = 0
    for batch in batches:
        sources = [len(pairs.source[i]) for i in batch]
        targets = [len(pairs.target[i]) + 1 for i in batch]
        real += sum(sources) + sum(targets)
        positions += len(batch) * (max(sources) + max(targets))
    return 1.0 - real / max(positions, 1)


def pad_batch(pairs, indices, bos_id, eos_id, pad_id=0):
    """`(source_ids (B, S), target_ids (B, T), labels (B, T))` int32, padded with `pad_id`."""
    import numpy as np

    sources = [pairs.source[i] for i in indices]
    targets = [pairs.target[i] for i in indices]
    width = max(len(t) for t in targets) + 1
    source = np.full((len(indices), max(len(s) for s in sources)), pad_id, dtype="int32")
    target_ids = np.full((len(indices), width), pad_id, dtype="int32")
    labels = np.full((len(indices), width), pad_id, dtype="int32")
    for row, (s, t) in enumerate(zip(sources, targets, strict=True)):
        source[row, : len(s)] = s
        target_ids[row, 0] = bos_id
        target_ids[row, 1 : len(t) + 1] = t
        labels[row, : len(t)] = t
        labels[row, len(t)] = eos_id
    return source, target_ids, labels


# --------------------------------------------------------------------------- training


def make_schedule_class():
    import keras
    from keras import ops

    class PaperSchedule(keras.optimizers.schedules.LearningRateSchedule):
        """`scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)` (Section 5.3)."""

        def __init__(self, d_model, warmup_steps, scale=1.0):
            self.d_model = int(d_model)
            self.warmup_steps = int(warmup_steps)
            self.scale = float(scale)

        def __call__(self, step):
            step = ops.cast(step, "float32") + 1.0  # Keras counts from 0, the paper from 1
            decay = ops.minimum(ops.rsqrt(step), step * self.warmup_steps**-1.5)
            return self.scale * self.d_model**-0.5 * decay

        def get_config(self):
            return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}

    return PaperSchedule


def make_steps(model, optimizer, config, label_smoothing):
    """`train_step(source, target_ids, labels) -> loss` and `eval_step -> (loss sum, tokens)`."""
    import keras
    import tensorflow as tf
    from keras import ops

    cross_entropy = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=label_smoothing, reduction=None
    )

    def loss_sum_and_count(labels, logits):
        per_token = cross_entropy(ops.one_hot(labels, config.vocab_size), logits)  # (B, T)
        mask = ops.cast(ops.not_equal(labels, config.pad_id), "float32")  # (B, T)
        return ops.sum(per_token * mask), ops.sum(mask)

    @tf.function(reduce_retracing=True)
    def train_step(source, target_ids, labels):
        with tf.GradientTape() as tape:
            logits = model({"source_ids": source, "target_ids": target_ids}, training=True)
            total, count = loss_sum_and_count(labels, logits)
            loss = total / count  # mean over real target tokens
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    @tf.function(reduce_retracing=True)
    def eval_step(source, target_ids, labels):
        logits = model({"source_ids": source, "target_ids": target_ids}, training=False)
        return loss_sum_and_count(labels, logits)

    return train_step, eval_step


def validation_loss(eval_step, batches):
    total, count = 0.0, 0.0
    for batch in batches:
        batch_total, batch_count = eval_step(*batch)
        total += float(batch_total)
        count += float(batch_count)
    return total / max(count, 1.0)


def prefetched(items, make, ahead=2):
    """`make(item)` of each item in order, the next `ahead` made in a thread while the
    caller trains on this one, as train.py's input pipeline prefetches its batches."""
    import collections
    import itertools
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        iterator = iter(items)
        pending = collections.deque(
            pool.submit(make, item) for item in itertools.islice(iterator, ahead)
        )
        while pending:
            result = pending.popleft().result()
            for item in iterator:
                pending.append(pool.submit(make, item))
                break
            yield result


def train(args, config, model, train_pairs, val_batches):
    """Trains for `args.minutes` of loop time; returns the counts and the validation curve."""
    import keras
    import numpy as np

    schedule = make_schedule_class()(config.d_model, args.warmup_steps, args.lr_scale)
    optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    train_step, eval_step = make_steps(model, optimizer, config, args.label_smoothing)
    rng = np.random.default_rng(args.seed)
    budget = 60.0 * args.minutes
    eval_every = 60.0 * (args.eval_minutes or args.minutes / 6)
    counts = dict(steps=0, source_tokens=0, target_tokens=0, sentences=0)
    clock, eval_seconds, next_eval, losses, diverged = 0.0, 0.0, eval_every, [], False
    first_step_seconds = None
    curve = []  # {"minutes", "step", "val_loss"}; minutes of training-loop time

    def evaluate():
        nonlocal eval_seconds
        start = time.perf_counter()
        loss = validation_loss(eval_step, val_batches)
        eval_seconds += time.perf_counter() - start
        curve.append({"minutes": clock / 60.0, "step": counts["steps"], "val_loss": loss})
        print(
            f"step {counts['steps']}, {clock / 60:.2f} min: val_loss {loss:.4f}",
            file=sys.stderr,
            flush=True,
        )

    evaluate()
    while clock < budget and not diverged:

        def padded(batch):
            return batch, pad_batch(train_pairs, batch, config.bos_id, config.eos_id, config.pad_id)

        batches = make_batches(train_pairs.lengths, args.batch_tokens, rng)
        for batch, (source, target_ids, labels) in prefetched(batches, padded):
            start = time.perf_counter()
            loss = float(train_step(source, target_ids, labels))
            clock += time.perf_counter() - start
            counts["steps"] += 1
            if counts["steps"] == 1:
                first_step_seconds = clock  # with the trace of the step
            counts["source_tokens"] += int(np.count_nonzero(source != config.pad_id))
            counts["target_tokens"] += int(np.count_nonzero(labels != config.pad_id))
            counts["sentences"] += len(batch)
            losses.append(loss)
            if not math.isfinite(loss):
                diverged = True
                break
            if clock >= next_eval:
                evaluate()
                next_eval += eval_every
            if clock >= budget:
                break
    if curve[-1]["step"] != counts["steps"]:
        evaluate()
    seconds = max(clock, 1e-9)
    return {
        **counts,
        "passes_over_data": counts["sentences"] / max(len(train_pairs.lengths), 1),
        "train_seconds": clock,
        "first_step_seconds": first_step_seconds,
        "eval_seconds": eval_seconds,
        "tokens_per_second": (counts["source_tokens"] + counts["target_tokens"]) / seconds,
        "target_tokens_per_second": counts["target_tokens"] / seconds,
        "source_tokens_per_second": counts["source_tokens"] / seconds,
        "sentences_per_second": counts["sentences"] / seconds,
        "steps_per_second": counts["steps"] / seconds,
        "train_loss": float(np.mean(losses[-50:])) if losses else None,
        "final_val_loss": curve[-1]["val_loss"],
        "diverged": diverged,
        "curve": curve,
    }


# --------------------------------------------------------------------------- decoding


def _embed(model, config, ids, start_index=0):
    """The scaled token embedding plus the sine positions from `start_index`: (B, T, D)."""
    x = model.embedding(ids) * math.sqrt(config.d_model)  # (B, T, D)
    return x + model.positions(x, start_index=start_index)


def _decode_with_cache(
    model, config, ids, memory, source_mask, self_cache, self_index, cross_cache, cross_index
):
    """Decoder on `ids` (B, t) at position `self_index`; caches (B, N_layers, 2, L, H, hd)."""
    from keras import ops

    y = _embed(model, config, ids, start_index=self_index)
    self_caches, cross_caches = [], []
    for i, layer in enumerate(model.decoder_layers):
        y, layer_self, layer_cross = layer(
            y,
            memory,
            encoder_padding_mask=source_mask,
            self_attention_cache=self_cache[:, i],
            self_attention_cache_update_index=self_index,
            cross_attention_cache=cross_cache[:, i],
            cross_attention_cache_update_index=cross_index,
        )
        self_caches.append(layer_self)
        cross_caches.append(layer_cross)
    logits = ops.cast(model.embedding(y, reverse=True), "float32")  # (B, t, V)
    return logits, ops.stack(self_caches, axis=1), ops.stack(cross_caches, axis=1)


def _encode_and_seed(model, config, source_ids, prompt):
    """`(self_cache, memory, source_mask, cross_cache)`: the encoder's output and the
    decoder caches after one step on BOS (which computes the cross-attention cache once)."""
    from keras import ops

    num_layers, num_heads = config.num_layers, config.num_heads
    head_dim = config.d_model // num_heads
    batch, length = ops.shape(prompt)[0], ops.shape(prompt)[1]
    source_mask = ops.not_equal(source_ids, config.pad_id)  # (B, S) True = real token
    memory = _embed(model, config, source_ids)
    for layer in model.encoder_layers:
        memory = layer(memory, padding_mask=source_mask)  # (B, S, D)
    shape = (batch, num_layers, 2, length, num_heads, head_dim)
    self_cache = ops.zeros(shape, memory.dtype)
    cross_shape = (batch, num_layers, 2, ops.shape(source_ids)[1], num_heads, head_dim)
    cross_cache = ops.zeros(cross_shape, memory.dtype)
    # Seeds the cross-attention cache (computed once) with one step on BOS.
    _, self_cache, cross_cache = _decode_with_cache(
        model, config, prompt[:, :1], memory, source_mask, self_cache, 0, cross_cache, 0
    )
    return self_cache, memory, source_mask, cross_cache


def make_generate(model, config, beam_size):
    """`generate(source_ids (B, S), prompt (B, L)) -> (beams (B, K, L), log_probs (B, K))`.

    `prompt` is BOS followed by padding; the beams are sorted by log-probability.
    """
    import keras_hub
    import tensorflow as tf
    from keras import ops

    sampler = keras_hub.samplers.BeamSampler(num_beams=beam_size, return_all_beams=True)
    vocab = ops.arange(config.vocab_size)
    # Live beams never emit padding or BOS; finished beams emit padding at log-probability 0.
    banned = ops.logical_or(ops.equal(vocab, config.pad_id), ops.equal(vocab, config.bos_id))
    finished_logits = ops.where(ops.equal(vocab, config.pad_id), 0.0, -1e9)[None, :]  # (1, V)

    # Static shapes on every trace: with `reduce_retracing` a relaxed retrace enters
    # keras-hub's sampler loop with a static batch that its body makes dynamic
    # ("enters the loop with shape (64, None), but has shape (None, None)").
    @tf.function
    def generate(source_ids, prompt):
        cache = _encode_and_seed(model, config, source_ids, prompt)

        def next(prompt, cache, index):
            self_cache, memory, source_mask, cross_cache = cache
            cache_index = index - 1  # the position of the previous token
            previous = ops.slice(prompt, [0, cache_index], [ops.shape(prompt)[0], 1])  # (b, 1)
            logits, self_cache, _ = _decode_with_cache(
                model, config, previous, memory, source_mask, self_cache, cache_index,
                cross_cache, None,
            )  # fmt: skip
            logits = ops.where(banned[None, :], -1e9, logits[:, 0, :])  # (b, V)
            finished = ops.logical_or(
                ops.equal(previous, config.eos_id), ops.equal(previous, config.pad_id)
            )  # (b, 1)
            logits = ops.where(finished, finished_logits, logits)
            return logits, None, (self_cache, memory, source_mask, cross_cache)

        return sampler(
            next=next,
            prompt=prompt,
            cache=cache,
            index=1,
            mask=ops.not_equal(prompt, config.pad_id),  # (B, L) True = given (the BOS)
            stop_token_ids=[config.eos_id],
        )

    return generate


def translate(sentences, processor, model, config, beam_size, alpha, batch_size, generate=None):
    """Beam search over `sentences`, in batches of similar length; returns strings in order.
    `generate`: a `make_generate` function to reuse (its traces with it)."""
    import numpy as np

    generate = generate or make_generate(model, config, beam_size)
    pieces = [processor.encode(s)[: config.max_length - 1] + [config.eos_id] for s in sentences]
    order = sorted(range(len(sentences)), key=lambda i: len(pieces[i]))
    hypotheses = [""] * len(sentences)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = -(-max(len(pieces[i]) for i in rows) // 8) * 8  # few traced shapes
        source = np.full((len(rows), width), config.pad_id, dtype="int32")
        for row, i in enumerate(rows):
            source[row, : len(pieces[i])] = pieces[i]
        length = min(config.max_length, width + 50)  # one prompt length per source width
        prompt = np.full((len(rows), length), config.pad_id, dtype="int32")
        prompt[:, 0] = config.bos_id
        beams, log_probs = generate(source, prompt)
        beams, log_probs = beams.numpy(), log_probs.numpy()
        for row, i in enumerate(rows):
            best, best_score = [], -math.inf
            for ids, log_prob in zip(beams[row], log_probs[row], strict=True):
                ids = ids[1:].tolist()
                ids = ids[: ids.index(config.eos_id) + 1] if config.eos_id in ids else ids
                score = log_prob / ((5.0 + len(ids)) / 6.0) ** alpha  # GNMT length penalty
                if score > best_score:
                    best, best_score = ids, score
            tokens = [t for t in best if t not in (config.pad_id, config.eos_id)]
            hypotheses[i] = processor.decode(tokens)
    return hypotheses


# --------------------------------------------------------------------------- the worker


def load_config(args):
    """Seeds Keras, sets the dtype policy; the preset's config with the flags' overrides."""
    import keras

    from keras_transformer.config import get_preset

    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy(args.dtype_policy)
    overrides = {"vocab_size": args.vocab_size} if args.vocab_size else {}
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    return get_preset(args.preset, **overrides)


def load_processor(args, config):
    """`W/vocab.model`'s sentencepiece processor, checked against the config's ids and size."""
    import sentencepiece

    vocab_path = os.path.join(args.work_dir, "vocab.model")
    processor = sentencepiece.SentencePieceProcessor(model_file=vocab_path)
    if processor.vocab_size() != config.vocab_size:
        raise ValueError(
            f"{vocab_path} has {processor.vocab_size()} pieces; pass --vocab-size "
            f"{processor.vocab_size()}. Received: vocab_size={config.vocab_size}"
        )
    special = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
    if special != (config.pad_id, 1, config.bos_id, config.eos_id):
        raise ValueError(f"{vocab_path}: pad/unk/bos/eos ids are {special}, expected (0, 1, 2, 3)")
    return processor


@dataclasses.dataclass
class Corpus:
    """The tokenized corpus: train pairs and their batches of the first epoch's order (for
    the padding share), validation pairs and their padded batches."""

    train_pairs: Pairs
    batches: list
    val_pairs: Pairs
    val_batches: list
    tokenize_seconds: float


def load_corpus(args, config, processor):
    """Loads and tokenizes the corpus, cuts the batches; prints their counts."""
    import numpy as np

    from keras_transformer.data import load_translation_data

    data = load_translation_data(
        args.dataset,
        data_dir=args.data_dir,
        direction=args.direction,
        tfds_data_dir=args.tfds_data_dir,
    )
    tokenize_start = time.time()
    train_pairs = tokenize(data.splits["train"], processor, config.max_length, config.eos_id)
    validation = data.splits["validation"]
    if args.val_pairs:
        validation = validation[: args.val_pairs]
    val_pairs = tokenize(validation, processor, config.max_length, config.eos_id)
    val_batches = [
        pad_batch(val_pairs, batch, config.bos_id, config.eos_id, config.pad_id)
        for batch in make_batches(val_pairs.lengths, args.batch_tokens)
    ]
    tokenize_seconds = time.time() - tokenize_start
    batches = make_batches(train_pairs.lengths, args.batch_tokens, np.random.default_rng(0))
    print(
        f"{len(train_pairs.lengths)} train pairs ({train_pairs.dropped} dropped), "
        f"{len(batches)} batches per epoch, {len(val_pairs.lengths)} validation pairs; "
        f"tokenized in {tokenize_seconds:.0f}s",
        file=sys.stderr,
        flush=True,
    )
    return Corpus(train_pairs, batches, val_pairs, val_batches, tokenize_seconds)


def build_model(args, config):
    """`_common._keras_hub_model`, built, with the attention dropout set before any trace."""
    import numpy as np

    from benchmarks import _common

    model = _common._keras_hub_model(config)
    ids = np.array([[5, 6, config.eos_id]], dtype="int32")
    model({"source_ids": ids, "target_ids": ids}, training=False)  # builds the weights
    attention_dropout = config.attention_dropout
    if args.attention_dropout is not None:
        attention_dropout = args.attention_dropout
    _common.set_attention_dropout(model, attention_dropout)  # before the step is traced
    return model


def decode_heldout(args, processor, model, config):
    """`(hypotheses, seconds)` of `--decode-file`'s sources, the second of two passes
    timed; `(None, None)` without the flag."""
    if not args.decode_file:
        return None, None
    with open(args.decode_file, encoding="utf-8") as f:
        sources = json.load(f)["sources"]
    decode = (sources, processor, model, config, args.beam_size, args.alpha, args.decode_batch)
    generate = make_generate(model, config, args.beam_size)
    translate(*decode, generate=generate)  # untimed: traces every shape, as quality.py's
    start = time.time()  # first pass of train.py's model does
    hypotheses = translate(*decode, generate=generate)
    return hypotheses, time.time() - start


def settings(args, threads):
    """The run's settings, as the result records them."""
    return {
        "preset": args.preset,
        "dtype_policy": args.dtype_policy,
        "batch_tokens": args.batch_tokens,
        "warmup_steps": args.warmup_steps,
        "learning_rate_scale": args.lr_scale,
        "label_smoothing": args.label_smoothing,
        "minutes": args.minutes,
        "seed": args.seed,
        "beam_size": args.beam_size,
        "alpha": args.alpha,
        "threads": threads,
    }


def run(args):
    """Loads, tokenizes, trains, evaluates, decodes; returns the result dict."""
    wall_start = time.time()
    from keras_transformer.hardware import configure_threads

    threads = configure_threads()  # before TensorFlow runs its first op, as train.py does
    from benchmarks import _common

    config = load_config(args)
    processor = load_processor(args, config)
    corpus = load_corpus(args, config, processor)
    train_pairs, batches = corpus.train_pairs, corpus.batches
    model = build_model(args, config)
    startup_seconds = time.time() - wall_start
    result = train(args, config, model, train_pairs, corpus.val_batches)
    hypotheses, decode_seconds = decode_heldout(args, processor, model, config)
    return {
        "build": "keras_hub",
        "config": dataclasses.asdict(config),
        "settings": settings(args, threads),
        "params": _common.count_params(model),
        "train_pairs": len(train_pairs.lengths),
        "dropped_pairs": train_pairs.dropped,
        "validation_pairs": len(corpus.val_pairs.lengths),
        "batches_per_epoch": len(batches),
        "mean_batch_size": len(train_pairs.lengths) / max(len(batches), 1),
        "padding_share": padding_share(train_pairs, batches),
        **result,
        "startup_seconds": startup_seconds,
        "tokenize_seconds": corpus.tokenize_seconds,
        "decode_seconds": decode_seconds,
        "wall_seconds": time.time() - wall_start,
        "hypotheses": hypotheses,
    }


def main(argv=None):
    args = parse_args(argv)
    result = run(args)
    with open(os.path.join(args.work_dir, RESULT_FILE), "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, ensure_ascii=False)
    print(json.dumps({key: value for key, value in result.items() if key != "hypotheses"}))


if __name__ == "__main__":
    main()
