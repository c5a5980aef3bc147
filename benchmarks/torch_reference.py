"""The reference most users of the field would write: the same Transformer in plain PyTorch.

    python benchmarks/torch_reference.py --preset base --batch-size 384 --length 64 \\
        --no-padding --matmul-size 8192          # on a GPU: bf16 autocast + torch.compile
    python benchmarks/torch_reference.py --preset tiny --no-compile   # a CPU smoke run

`torch.nn.Transformer` (post-LN, ReLU, dropout on embeddings and every
residual branch, `batch_first`), sinusoidal positions, one embedding matrix
shared by source, target and the output projection (inputs scaled by
sqrt(d_model)), label-smoothed cross-entropy (0.1, padding ignored) and
Adam (0.9, 0.98, 1e-9; `fused=True` on a GPU) under the paper's learning
rate schedule. Mixed precision is `torch.autocast` in bfloat16 with float32
weights, as `mixed_bfloat16` in Keras; `torch.compile` compiles the model
(default mode). Its attention is `nn.MultiheadAttention`, which calls
`F.scaled_dot_product_attention` with the merged causal and padding mask.
One difference from the Keras builds: `nn.Transformer` adds a final
LayerNorm after each stack (2 of about 40 LayerNorms; no matmul FLOPs).

`--variant fair` is the same model as a PyTorch expert tuning it would write
(`build_fair`): the Keras builds' layers and dropout and nothing more,
`F.scaled_dot_product_attention` with `is_causal=True` and no mask when the
batch has no padding, the cast to float32 and the label-smoothed loss inside
the compiled function, and with `--compile-mode reduce-overhead` CUDA graphs:

    python benchmarks/torch_reference.py --variant fair --preset base --batch-size 384 \
        --length 64 --no-padding --matmul-size 8192 --rounds 10 --steps 25

The batch is `_common.make_batch`'s, as in `train_throughput.py`, and the
output one JSON line in that script's worker format, so its `--json`
results and these go in one table. Each round times `--steps` steps,
synchronizes the device once, and the median over rounds is reported.
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _common.add_batch_arguments(parser)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (compilation)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16", help="autocast dtype, or float32")
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument(
        "--variant", choices=("plain", "fair"), default="plain",
        help="plain: nn.Transformer, the loss outside torch.compile; fair: `build_fair`, "
        "the loss inside the compiled function",
    )  # fmt: skip
    parser.add_argument(
        "--compile-mode", default=None,
        help="torch.compile mode of the fair variant, e.g. reduce-overhead (CUDA graphs)",
    )  # fmt: skip
    parser.add_argument("--json", help="also write the result here")
    return parser.parse_args(argv)


def sinusoids(length, d_model):
    import torch

    position = torch.arange(length, dtype=torch.float32)[:, None]
    rate = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(1e4) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * rate)
    table[:, 1::2] = torch.cos(position * rate)
    return table


def build(config):
    import torch
    from torch import nn

    class Reference(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(config.vocab_size, config.d_model)
            nn.init.normal_(self.embedding.weight, std=config.d_model**-0.5)
            self.transformer = nn.Transformer(
                d_model=config.d_model,
                nhead=config.num_heads,
                num_encoder_layers=config.num_layers,
                num_decoder_layers=config.num_layers,
                dim_feedforward=config.d_ff,
                dropout=config.dropout,
                layer_norm_eps=config.layer_norm_epsilon,
                batch_first=True,
                norm_first=False,
            )
            self.dropout = nn.Dropout(config.dropout)
            self.register_buffer("positions", sinusoids(config.max_length, config.d_model))

        def embed(self, ids):
            x = self.embedding(ids) * math.sqrt(config.d_model)
            return self.dropout(x + self.positions[: ids.shape[1]])

        def forward(self, source, target):
            length = target.shape[1]
            causal = torch.triu(
                torch.ones(length, length, dtype=torch.bool, device=target.device), diagonal=1
            )
            source_padding = source == config.pad_id
            hidden = self.transformer(
                self.embed(source),
                self.embed(target),
                tgt_mask=causal,
                src_key_padding_mask=source_padding,
                tgt_key_padding_mask=target == config.pad_id,
                memory_key_padding_mask=source_padding,
                tgt_is_causal=True,
            )
            return hidden @ self.embedding.weight.T

    return Reference()


def build_fair(config, padding):
    """The same model written for speed as a PyTorch expert would: the layers of
    the Keras builds and nothing more (dropout on the embeddings and on each
    sublayer's output; none inside the feed-forward or on the attention
    weights, which `nn.Transformer` has; no final LayerNorms), attention through
    `F.scaled_dot_product_attention` with `is_causal=True` and no mask where the
    batch has no padding (so that the flash kernels can run). Its parameters
    are the Keras `Transformer`'s, one for one (tests/test_benchmark_tools.py)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    d, heads = config.d_model, config.num_heads

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value, self.output = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x, memory, mask=None, causal=False):
            def split(t):
                return t.unflatten(-1, (heads, d // heads)).transpose(1, 2)

            q, k, v = split(self.query(x)), split(self.key(memory)), split(self.value(memory))
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
            return self.output(out.transpose(1, 2).flatten(2))

    class Block(nn.Module):
        def __init__(self, cross):
            super().__init__()
            self.self_attention, self.self_norm = (
                Attention(),
                nn.LayerNorm(d, eps=config.layer_norm_epsilon),
            )
            if cross:
                self.cross_attention = Attention()
                self.cross_norm = nn.LayerNorm(d, eps=config.layer_norm_epsilon)
            self.inner, self.outer = nn.Linear(d, config.d_ff), nn.Linear(config.d_ff, d)
            self.ff_norm = nn.LayerNorm(d, eps=config.layer_norm_epsilon)
            self.dropout = nn.Dropout(config.dropout)

        def forward(self, x, self_mask, causal, memory=None, memory_mask=None):
            x = self.self_norm(x + self.dropout(self.self_attention(x, x, self_mask, causal)))
            if memory is not None:
                attended = self.cross_attention(x, memory, memory_mask)
                x = self.cross_norm(x + self.dropout(attended))
            return self.ff_norm(x + self.dropout(self.outer(F.relu(self.inner(x)))))

    class Fair(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(config.vocab_size, d)
            nn.init.normal_(self.embedding.weight, std=d**-0.5)
            self.encoder = nn.ModuleList(Block(False) for _ in range(config.num_layers))
            self.decoder = nn.ModuleList(Block(True) for _ in range(config.num_layers))
            self.dropout = nn.Dropout(config.dropout)
            self.register_buffer("positions", sinusoids(config.max_length, d))

        def embed(self, ids):
            x = self.embedding(ids) * math.sqrt(d)
            return self.dropout(x + self.positions[: ids.shape[1]])

        def forward(self, source, target):
            source_mask = target_mask = None
            if padding:  # boolean masks, True where attention may look
                keep = (source != config.pad_id)[:, None, None, :]
                length = target.shape[1]
                causal = torch.ones(length, length, dtype=torch.bool, device=target.device).tril()
                source_mask = keep
                target_mask = causal & (target != config.pad_id)[:, None, None, :]
            x = self.embed(source)
            for block in self.encoder:
                x = block(x, source_mask, False)
            y = self.embed(target)
            for block in self.decoder:
                y = block(y, target_mask, not padding, memory=x, memory_mask=source_mask)
            return y @ self.embedding.weight.T

    return Fair()


def matmul_flops_per_s(size, dtype, device):
    import torch

    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    a @ b  # warm-up
    times = []
    for _ in range(5):
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(10):
            a @ b
        _synchronize(device)
        times.append((time.perf_counter() - start) / 10)
    return 2 * size**3 / _common.median(times)


def _synchronize(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _candidate_name(fair, compile_mode):
    """`torch_reference`, `torch_reference_fair`, `torch_reference_fair_reduce-overhead`."""
    if not fair:
        return "torch_reference"
    return "torch_reference_fair" + (f"_{compile_mode}" if compile_mode else "")


def load_batch(args, config, device):
    """`(source, target, labels)`: `_common.make_batch`'s batch as long tensors on `device`."""
    import torch

    x, y = _common.make_batch(
        config, args.batch_size, args.length, args.length, padding=not args.no_padding
    )
    source = torch.as_tensor(x["source_ids"], dtype=torch.long, device=device)
    target = torch.as_tensor(x["target_ids"], dtype=torch.long, device=device)
    labels = torch.as_tensor(y, dtype=torch.long, device=device)
    return source, target, labels


def make_optimizer(model, config, device):
    """`(optimizer, schedule)`: Adam (0.9, 0.98, 1e-9) under the paper's learning rate."""
    import torch

    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, fused=device.type == "cuda"
    )
    warmup = 4000
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: config.d_model**-0.5 * min((step + 1) ** -0.5, (step + 1) * warmup**-1.5),
    )
    return optimizer, schedule


def make_forward_loss(forward, config, device, dtype):
    """`forward_loss(source, target, labels)`: `forward` under autocast to `dtype` (none
    for float32), then the label-smoothed cross-entropy of its logits in float32."""
    import torch
    import torch.nn.functional as F

    autocast_dtype = getattr(torch, dtype)

    def forward_loss(source, target, labels):
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=dtype != "float32"):
            logits = forward(source, target)
        return F.cross_entropy(
            logits.float().reshape(-1, config.vocab_size),
            labels.reshape(-1),
            ignore_index=config.pad_id,
            label_smoothing=0.1,
        )

    return forward_loss


def compiled_loss(args, fair, model, eager_loss, config, device):
    """The step's loss function as `--compile` and `--variant` have it compiled: the
    model alone (plain: as most users write it), or the model and the loss as one
    function (fair: `eager_loss` compiled)."""
    import torch

    if args.compile and fair:
        return torch.compile(eager_loss, mode=args.compile_mode)
    if args.compile:
        return make_forward_loss(torch.compile(model), config, device, args.dtype)
    return eager_loss


def train_step(step_loss, batch, optimizer, schedule):
    """One training step on `batch`; returns its loss, detached (not synchronized)."""
    loss = step_loss(*batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    schedule.step()
    return loss.detach()


def warm_up(args, step_loss, eager_loss, step):
    """Runs `--warmup` steps of `step(step_loss)`, again eagerly (`eager_loss`) if the
    compiled function fails; returns `(step_loss, compiled, loss, seconds)`."""
    start = time.perf_counter()
    compiled = args.compile
    try:
        for _ in range(args.warmup):
            loss = step(step_loss)
    except Exception as error:  # noqa: BLE001 - a reference that runs beats none
        if not args.compile:
            raise
        print(f"torch.compile failed ({type(error).__name__}: {error}); eager", file=sys.stderr)
        step_loss, compiled = eager_loss, False
        for _ in range(args.warmup):
            loss = step(step_loss)
    float(loss)
    return step_loss, compiled, loss, time.perf_counter() - start


def time_rounds(args, step_loss, step, loss):
    """`(seconds per step of each round, the last loss)`: `--rounds` of `--steps` steps,
    the device synchronized once a round (`loss`, the warm-up's, where none runs)."""
    times = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step(step_loss)
        float(loss)  # synchronizes
        times.append((time.perf_counter() - start) / args.steps)
    return times, loss


def make_result(args, config, device, fair, params, compiled, warmup_s, times, loss):
    """The result line, in `train_throughput.py`'s worker format; measures the matmuls."""
    import torch

    autocast_dtype = getattr(torch, args.dtype)
    matmul = {"float32": matmul_flops_per_s(args.matmul_size, torch.float32, device)}
    if args.dtype != "float32":
        matmul[args.dtype] = matmul_flops_per_s(args.matmul_size, autocast_dtype, device)
    flops = _common.training_flops(config, args.batch_size, args.length, args.length)
    tokens = args.batch_size * 2 * args.length
    step = _common.median(times)
    return {
        "backend": "torch (plain PyTorch)" if not fair else "torch (PyTorch, tuned)",
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "jit_compile": compiled,
        "dtype": args.dtype if args.dtype == "float32" else f"mixed_{args.dtype}",
        "tokens_per_step": tokens,
        "flops_per_step": flops,
        "matmul_flops_per_s": matmul,
        "warmup_s": warmup_s,
        "final_loss": float(loss),
        "candidates": {
            _candidate_name(fair, args.compile_mode): {
                "params": params,
                "step_s": times,
                "median_step_s": step,
                "tokens_per_s": tokens / step,
                "flops_per_s": flops / step,
            }
        },
    }


def main(argv=None):
    args = parse_args(argv)
    import torch

    from keras_transformer.config import get_preset

    config = get_preset(args.preset)
    if args.dropout is not None:
        config = get_preset(args.preset, dropout=args.dropout)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    batch = load_batch(args, config, device)
    fair = args.variant == "fair"
    model = (build_fair(config, not args.no_padding) if fair else build(config)).to(device)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    optimizer, schedule = make_optimizer(model, config, device)
    eager_loss = make_forward_loss(model, config, device, args.dtype)
    step_loss = compiled_loss(args, fair, model, eager_loss, config, device)

    def step(step_loss):
        return train_step(step_loss, batch, optimizer, schedule)

    step_loss, compiled, loss, warmup_s = warm_up(args, step_loss, eager_loss, step)
    times, loss = time_rounds(args, step_loss, step, loss)
    result = make_result(args, config, device, fair, params, compiled, warmup_s, times, loss)
    line = json.dumps(result)
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
