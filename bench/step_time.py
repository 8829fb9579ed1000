"""Time train_gpt.py's training step for the config in the environment: ms/step, tokens/s and,
on CUDA, MFU. Each mode (COMPILE x BF16) builds a fresh model, runs --warmup steps (compilation),
then times --steps steps. It uses the trainer's own model, optimizers, loader and step.

    DATA_PATH=./data/datasets/sotu_sp1024 TOKENIZER_PATH=./data/tokenizers/sotu_1024_bpe.model \\
        TRAIN_BATCH_TOKENS=8192 python bench/step_time.py --modes all
"""

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_gpt as tg  # noqa: E402


def time_mode(environ: dict, warmup: int, steps: int) -> dict:
    run = tg.setup(environ)
    hp, layout = run.hp, run.layout
    torch.manual_seed(hp.seed)
    model = tg.GPT(hp).to(layout.device)
    optimizers, muon = tg.build_optimizers(model, hp, layout)
    step_model = torch.compile(model, dynamic=False, fullgraph=True) if layout.use_compile else model
    if layout.use_compile:
        muon.orthogonalize = torch.compile(tg.zeropower_via_newtonschulz5)
    loader = tg.DistributedTokenLoader(os.path.join(hp.data_path, "fineweb_train_*.bin"), 0, 1, layout.device)
    batches = lambda: loader.next_batch(hp.train_batch_tokens, hp.train_seq_len, layout.grad_accum_steps)  # noqa: E731
    t0 = time.perf_counter()
    for _ in range(warmup):
        tg.train_step(step_model, batches, optimizers, hp, layout, lr_scale=1.0)
    tg.synchronize(layout.device)
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = tg.train_step(step_model, batches, optimizers, hp, layout, lr_scale=1.0)
    tg.synchronize(layout.device)
    step_ms = 1000 * (time.perf_counter() - t0) / steps
    tokens_per_s = hp.train_batch_tokens / (step_ms / 1000)
    peak = tg.peak_flops(layout.device)
    mfu = 100 * tg.count_flops_per_token(model, hp) * tokens_per_s / peak if peak else None
    return dict(compile=layout.use_compile, bf16=layout.use_bf16, params=sum(p.numel() for p in model.parameters()),
                warmup_s=warmup_s, step_ms=step_ms, tokens_per_s=tokens_per_s, mfu=mfu, loss=loss.item())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation happens here)")
    parser.add_argument("--modes", default="env", choices=["env", "all"],
                        help="env: COMPILE/BF16 as set; all: every combination of compile and bf16")
    args = parser.parse_args()
    combos = [(os.environ.get("COMPILE", "auto"), os.environ.get("BF16", "auto"))]
    if args.modes == "all":
        combos = list(itertools.product("01", "01"))
    print(f"{'compile':>7} {'bf16':>5} {'params':>10} {'warmup_s':>8} {'ms/step':>9} {'tok/s':>9} {'mfu':>6} loss")
    for use_compile, use_bf16 in combos:
        r = time_mode({**os.environ, "COMPILE": use_compile, "BF16": use_bf16}, args.warmup, args.steps)
        mfu = f"{r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(f"{r['compile']!s:>7} {r['bf16']!s:>5} {r['params']:>10} {r['warmup_s']:>8.1f} {r['step_ms']:>9.1f} "
              f"{r['tokens_per_s']:>9.0f} {mfu:>6} {r['loss']:.3f}", flush=True)


if __name__ == "__main__":
    main()
