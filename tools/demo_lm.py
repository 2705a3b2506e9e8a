"""``kaun-ir demo lm``: a character-level GPT trained on the shipped Shakespeare corpus.

The model is ``kn.models.decoder`` in its GPT-2 form (learned positions, pre-LayerNorm, GELU MLP)
over the corpus's characters. It trains with ``train.fit`` (one compiled step: forward, kaun_ir's
own autodiff, AdamW) on random windows of the text for a fixed time budget (``--seconds``, about
a minute by default) with a progress bar, reports the held-out loss, then prints a sample drawn
with ``kn.models.generate`` (KV cache, temperature, top-k).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``kaun-ir demo lm`` to the demo's ``parser``."""
    group = parser.add_argument_group("demo lm (character-level GPT on Shakespeare)")
    group.add_argument(
        "--seconds", type=float, default=60.0, help="training time budget (default: %(default)s)"
    )
    group.add_argument(
        "--seq-len", type=int, default=64, help="context length in characters (default: %(default)s)"
    )
    group.add_argument("--dim", type=int, default=64, help="model width (default: %(default)s)")
    group.add_argument("--layers", type=int, default=2, help="transformer blocks (default: %(default)s)")
    group.add_argument(
        "--lm-batch-size", type=int, default=16, help="windows per step (default: %(default)s)"
    )
    group.add_argument("--sample-chars", type=int, default=300, help="length of the printed sample")
    group.add_argument(
        "--prompt", default="ROMEO.\n", help="text the sample continues (default: %(default)r)"
    )


class Vocabulary:
    """Characters <-> int32 ids (sorted characters of the corpus)."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> np.ndarray:
        """The character ids of ``text``; ``ValueError`` naming characters the corpus lacks."""
        unknown = sorted(set(text) - set(self.index))
        if unknown:
            raise ValueError(f"characters not in the corpus: {''.join(unknown)!r}")
        return np.array([self.index[c] for c in text], np.int32)

    def decode(self, ids) -> str:
        """The text of a sequence of character ids."""
        return "".join(self.chars[int(i)] for i in ids)


class _Windows:
    """Random ``(x, y)`` windows of ``ids``: ``y`` is ``x`` shifted by one character."""

    def __init__(self, ids: np.ndarray, batch: int, seq_len: int, seconds: float, seed: int):
        self.ids, self.batch, self.seq_len, self.seconds = ids, batch, seq_len, seconds
        self.rng = np.random.default_rng(seed)

    def __iter__(self):
        end = time.monotonic() + self.seconds
        offsets = np.arange(self.seq_len + 1)
        while time.monotonic() < end:
            starts = self.rng.integers(0, len(self.ids) - self.seq_len - 1, self.batch)
            block = self.ids[starts[:, None] + offsets]
            yield block[:, :-1], block[:, 1:]


def run(args: argparse.Namespace) -> int:
    """Train the character-level GPT on Shakespeare for the time budget and print a sample."""
    from kaun_ir import datasets, layer, models, optim, ptree, rng, train
    from kaun_ir.models import DecoderConfig, decoder
    from kaun_ir.nn import loss

    text = datasets.shakespeare()
    vocab = Vocabulary(text)
    ids = vocab.encode(text)
    split = int(len(ids) * 0.95)
    train_ids, held_out = ids[:split], ids[split:]
    cfg = DecoderConfig(
        vocab_size=len(vocab.chars),
        dim=args.dim,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=4,
        hidden_dim=4 * args.dim,
        max_positions=args.seq_len,
        mlp="gelu",
        tie_embeddings=True,
    )
    model = decoder(cfg, "char_gpt")
    trainer = train.make(model, optim.adamw(3e-3, weight_decay=0.01), loss=loss.cross_entropy_sparse)
    with rng.scope(args.seed):
        st = train.init(trainer)
    count = ptree.count_parameters(layer.params(train.vars(st)))
    print(
        f"corpus: {len(text):,} characters of Shakespeare, {len(vocab.chars)} distinct; model: {count:,} "
        f"parameters ({args.layers} blocks, width {args.dim}, context {args.seq_len})"
    )
    print(f"training for {args.seconds:g} s ...", flush=True)
    losses = []
    started = time.monotonic()
    batches = _Windows(train_ids, args.lm_batch_size, args.seq_len, args.seconds, args.seed)
    # progress bar on a terminal (train.fit's own); the loop ends when the time budget is spent
    st = train.fit(trainer, st, batches, report=lambda step, loss, state: losses.append(loss))
    elapsed = time.monotonic() - started
    evaluate = _Windows(held_out, 64, args.seq_len, float("inf"), args.seed + 1)
    x, y = next(iter(evaluate))
    logits = train.predict(trainer, st, x)
    held = float(np.asarray(loss.cross_entropy_sparse(logits, y)))
    first = float(np.mean(losses[:10])) if losses else float("nan")
    last = float(np.mean(losses[-10:])) if losses else float("nan")
    print(
        f"{len(losses)} steps in {elapsed:.0f} s: training loss {first:.3f} -> {last:.3f} "
        f"(uniform guess: {np.log(len(vocab.chars)):.3f}); held-out loss {held:.3f}"
    )
    from kaun_ir.models import Pretrained

    trained = Pretrained(model, train.vars(st), cfg, "gpt2")
    out = list(vocab.encode(args.prompt))
    remaining = args.sample_chars
    while remaining > 0:  # positions are learned up to seq_len: continue from the last half window
        window = out[-(args.seq_len // 2) :]
        take = min(remaining, args.seq_len - len(window))
        generated = models.generate(
            trained, np.array(window, np.int32), take, temperature=0.8, top_k=10, seed=args.seed + len(out)
        )
        out.extend(generated[len(window) :].tolist())
        remaining -= take
    print("--- sample (temperature 0.8, top-k 10) ---")
    print(vocab.decode(out))
    print("---")
    return 0
