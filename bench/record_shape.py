"""What a configuration costs on 8×H100, by arithmetic, and what its artifact weighs, by a real export.

    env $STACK python bench/record_shape.py [--mfu 0.38 0.24 0.15]   (STACK: README, "The record track")
        [--val-tokens 40540160] [--gpus 8] [--peak 989e12] [--memory] [--keep artifact.ptz]

The settings come from the environment, as for train_gpt.py (and are validated the same way). Printed:
- parameters, and FLOPs per trained token (train_gpt.count_flops_per_token: 6 per matmul weight, looped
  blocks each time they run, attention without a causal discount), before and after the depth-recurrence
  switch, and per step of TRAIN_BATCH_TOKENS;
- at each --mfu (a fraction of --gpus × --peak bf16 FLOP/s): ms per step, and the steps and tokens that fit
  the wallclock budget (MAX_WALLCLOCK_SECONDS less GPTQ_RESERVE_SECONDS; looped from LOOP_START_FRAC of it);
- the evaluation's forward-equivalents per validation token (round trip 1; sliding EVAL_SEQ_LEN/EVAL_STRIDE;
  TTT the sliding scoring + 3 per epoch for training) and their seconds at each --mfu;
- the artifact's bytes: train_gpt.save_artifact on the model with every quantized matrix drawn from a
  normal distribution (a trained matrix's rows are close to normal: README, "The record track"), plus
  this train_gpt.py's bytes, against the 16,000,000-byte cap;
- with --memory, what one TRAIN_SEQ_LEN sequence saves for the backward pass (eager, bf16 autocast on this
  CPU, after the loop switch; the bf16 copies of the weights included): times the sequences each GPU
  takes per micro-step, an estimate of the activations' peak memory (torch.compile on CUDA saves less).
"""

import argparse
import os
from pathlib import Path

import torch

from run_files import ROOT, tg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mfu", type=float, nargs="+", default=[0.38, 0.24, 0.15])
    parser.add_argument("--val-tokens", type=float, default=40_540_160, help="validation tokens (sp8192: the field's)")
    parser.add_argument("--keep", type=Path, help="also write the artifact here (for bench/compressors.py)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--peak", type=float, default=989e12, help="dense bf16 FLOP/s per GPU (H100 SXM)")
    parser.add_argument("--memory", action="store_true", help="measure the activations one sequence saves (slow)")
    args = parser.parse_args()
    hp = tg.Hyperparameters.from_env(os.environ)
    torch.manual_seed(0)
    model = tg.GPT(hp)
    params = sum(p.numel() for p in model.parameters())
    per_token = [tg.count_flops_per_token(model, hp)]
    if hp.loop_repeats:
        model.looping = True
        per_token.append(tg.count_flops_per_token(model, hp))
        model.looping = False
    print(f"parameters: {params:,}")
    print("FLOPs per trained token: " + " / ".join(f"{f / 1e6:.1f}M" for f in per_token) +
          (" (before / after the depth-recurrence switch)" if hp.loop_repeats else "") +
          "; per step of " + f"{hp.train_batch_tokens:,} tokens: " + " / ".join(f"{f * hp.train_batch_tokens:.3e}" for f in per_token))
    budget_s = hp.budget_ms / 1000.0
    looped_from = hp.loop_start_frac if hp.loop_repeats else 1.0
    window = hp.eval_seq_len or hp.train_seq_len
    forwards = {"round trip": 1.0}
    if hp.eval_stride and (hp.sliding_eval or not hp.ttt):  # SLIDING_EVAL=0 leaves the sliding windows to TTT
        forwards["sliding"] = window / hp.eval_stride
    if hp.ttt:
        forwards["TTT"] = (window / hp.eval_stride if hp.eval_stride else 1.0) + 3.0 * hp.ttt_epochs
    forward_flops = per_token[-1] / 3.0  # a forward is a third of a trained token's 6 per weight
    print(f"evaluation: {args.val_tokens / 1e6:.1f}M validation tokens, {forward_flops / 1e6:.1f}M FLOPs per forward token; "
          + ", ".join(f"{name} {n:g} forwards" for name, n in forwards.items())
          + f": {sum(forwards.values()) * args.val_tokens * forward_flops:.2e} FLOPs")
    for mfu in args.mfu:
        rate = mfu * args.gpus * args.peak
        ms = [1000.0 * f * hp.train_batch_tokens / rate for f in per_token]
        steps = looped_from * budget_s * 1000.0 / ms[0] + (1.0 - looped_from) * budget_s * 1000.0 / ms[-1]
        eval_s = sum(forwards.values()) * args.val_tokens * forward_flops / rate
        print(f"MFU {mfu:.0%}: " + " / ".join(f"{m:.0f}" for m in ms) + f" ms per step; {steps:,.0f} steps "
              f"({steps * hp.train_batch_tokens / 1e9:.2f}B tokens) in {budget_s:.0f} s; evaluation {eval_s:.0f} s")
    if args.memory:
        saved_for_backward(model, hp, args.gpus)
    torch.manual_seed(1)  # the same draw with or without --memory
    with torch.no_grad():
        for name, p in model.named_parameters():
            if tg.is_quantized(name, p):
                p.normal_(0.0, 0.02)
    blob = tg.save_artifact(model.state_dict(), args.keep, hp)
    source = (ROOT / "train_gpt.py").read_bytes()
    code = len(tg.pack_source(source) if hp.pack_code else source)
    total = len(blob) + code
    verdict = f"{16_000_000 - total:,} under the cap" if total <= 16_000_000 else f"{total - 16_000_000:,} OVER the cap"
    print(f"artifact (normal weights): {len(blob):,} bytes int{hp.quant_bits}+{hp.compressor} "
          f"({len(blob) / params:.3f} per parameter) + code {code:,}{' packed' * hp.pack_code} = {total:,} bytes, "
          f"{verdict}" + (f"; kept as {args.keep}" if args.keep else ""))


def saved_for_backward(model: "tg.GPT", hp: "tg.Hyperparameters", gpus: int) -> None:
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    model.looping = bool(hp.loop_repeats)
    idx = torch.randint(0, hp.vocab_size, (1, hp.train_seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx, idx)
    model.looping = False
    per_gpu = hp.train_batch_tokens // (gpus * tg.resolve_grad_accum(hp, gpus) * hp.train_seq_len)
    per_seq = sum(storages.values())
    print(f"saved for backward: {per_seq / 2**30:.2f} GiB per {hp.train_seq_len}-token sequence; {per_gpu} sequences per "
          f"GPU per micro-step: {per_gpu * per_seq / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
