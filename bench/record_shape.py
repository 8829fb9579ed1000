"""What a configuration costs on 8×H100, by arithmetic, and what its artifact weighs, by a real export.

    env $STACK python bench/record_shape.py [--mfu 0.38 0.24 0.15]   (STACK: docs/GPU.md, "The record track")
        [--val-tokens 40540160] [--gpus 8] [--peak 989e12] [--memory] [--keep artifact.ptz]

The settings come from the environment, as for train_gpt.py (and are validated the same way). Printed:
- parameters, and FLOPs per trained token (bench/flops.py's count_flops_per_token: 6 per matmul weight,
  looped blocks each time they run, attention without a causal discount), before and after the
  depth-recurrence switch, and per step of TRAIN_BATCH_TOKENS;
- at each --mfu (a fraction of --gpus × --peak bf16 FLOP/s): ms per step, and the steps and tokens that fit
  the wallclock budget (MAX_WALLCLOCK_SECONDS less GPTQ_RESERVE_SECONDS; looped from ENABLE_LOOPING_AT of
  it);
- the evaluation's forward-equivalents per validation token (round trip 1; sliding TRAIN_SEQ_LEN/EVAL_STRIDE;
  per-document LoRA TTT 2 per token position it runs, a forward and the backward to the adapters, the
  positions counted on FineWeb's document lengths as the field's logs give them, bench/fineweb_val_doc_lengths.json,
  every row of a group of TTT_BATCH_SIZE running until its longest document ends, as compiled) and their
  seconds at each --mfu;
- the artifact's bytes: train_gpt.save_artifact on the model with every quantized matrix drawn from a
  normal distribution (a trained matrix's rows are close to normal: docs/GPU.md, "The record track"), plus
  this train_gpt.py's bytes (packed by tools/packing.py with PACK_CODE=1), against the 16,000,000 cap;
- with --memory, what one TRAIN_SEQ_LEN sequence saves for the backward pass (eager, bf16 autocast on this
  CPU, after the loop switch; the bf16 copies of the weights included): times the sequences each GPU
  takes per micro-step, an estimate of the activations' peak memory (torch.compile on CUDA saves less).
"""

import argparse
import os
from pathlib import Path

import torch

from flops import LENGTHS, count_flops_per_token, fineweb_ttt_positions, peak_flops
from run_files import ROOT, tg  # puts the repository's root on sys.path
from tools.packing import pack_source  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mfu", type=float, nargs="+", default=[0.38, 0.24, 0.15])
    parser.add_argument("--val-tokens", type=float, default=40_540_160,
                        help="validation tokens (sp8192: the field's)")
    parser.add_argument("--keep", type=Path, help="also write the artifact here (for bench/compressors.py)")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--peak", type=float, default=peak_flops("H100"),
                        help="dense bf16 FLOP/s per GPU (default: H100 SXM's)")
    parser.add_argument("--memory", action="store_true",
                        help="measure the activations one sequence saves (slow)")
    args = parser.parse_args()
    try:
        hp = tg.Hyperparameters.from_env(os.environ, args.gpus)
    except tg.ConfigError as error:
        raise SystemExit(f"train_gpt.py: error: {error}") from None
    torch.manual_seed(0)
    model = tg.GPT(hp)
    params = sum(p.numel() for p in model.parameters())
    per_token = [count_flops_per_token(model, hp)]
    if hp.num_loops:
        model.set_looping(True)
        per_token.append(count_flops_per_token(model, hp))
        model.set_looping(False)
    print(f"parameters: {params:,}")
    flops = " / ".join(f"{f / 1e6:.1f}M" for f in per_token)
    per_step = " / ".join(f"{f * hp.train_batch_tokens:.3e}" for f in per_token)
    switch = " (before / after the depth-recurrence switch)" if hp.num_loops else ""
    print(f"FLOPs per trained token: {flops}{switch}; "
          f"per step of {hp.train_batch_tokens:,} tokens: {per_step}")
    budget_s = hp.budget_ms / 1000.0
    looped_from = hp.enable_looping_at if hp.num_loops else 1.0
    window = hp.train_seq_len
    forwards = {"round trip": 1.0}
    # SLIDING_WINDOW_ENABLED=0 leaves the sliding windows to TTT
    if hp.eval_stride and (hp.sliding_window_enabled or not hp.ttt_enabled):
        forwards["sliding"] = window / hp.eval_stride
    if hp.ttt_enabled:
        forwards["TTT"] = 2.0 * fineweb_ttt_positions(hp) / LENGTHS["tokens"]
    forward_flops = per_token[-1] / 3.0  # a forward is a third of a trained token's 6 per weight
    eval_flops = sum(forwards.values()) * args.val_tokens * forward_flops
    passes = ", ".join(f"{name} {n:g} forwards" for name, n in forwards.items())
    print(f"evaluation: {args.val_tokens / 1e6:.1f}M validation tokens, {forward_flops / 1e6:.1f}M FLOPs "
          f"per forward token; {passes}: {eval_flops:.2e} FLOPs")
    for mfu in args.mfu:
        rate = mfu * args.gpus * args.peak
        ms = [1000.0 * f * hp.train_batch_tokens / rate for f in per_token]
        budget_ms = budget_s * 1000.0
        steps = looped_from * budget_ms / ms[0] + (1.0 - looped_from) * budget_ms / ms[-1]
        eval_s = eval_flops / rate
        step_ms = " / ".join(f"{m:.0f}" for m in ms)
        tokens_b = steps * hp.train_batch_tokens / 1e9
        print(f"MFU {mfu:.0%}: {step_ms} ms per step; {steps:,.0f} steps ({tokens_b:.2f}B tokens) "
              f"in {budget_s:.0f} s; evaluation {eval_s:.0f} s")
    if args.memory:
        saved_for_backward(model, hp, args.gpus)
    torch.manual_seed(1)  # the same draw with or without --memory
    with torch.no_grad():
        for name, p in model.named_parameters():
            if tg.is_quantized(name, p):
                p.normal_(0.0, 0.02)
    blob = tg.save_artifact(model.state_dict(), args.keep, hp)
    source = (ROOT / "train_gpt.py").read_bytes()
    code = len(pack_source(source) if hp.pack_code else source)
    total = len(blob) + code
    verdict = f"{16_000_000 - total:,} under the cap"
    if total > 16_000_000:
        verdict = f"{total - 16_000_000:,} OVER the cap"
    packed = " packed" if hp.pack_code else ""
    kept = f"; kept as {args.keep}" if args.keep else ""
    print(f"artifact (normal weights): {len(blob):,} bytes int{hp.matrix_bits}+{hp.compressor} "
          f"({len(blob) / params:.3f} per parameter) + code {code:,}{packed} = {total:,} bytes, "
          f"{verdict}{kept}")


def saved_for_backward(model: tg.GPT, hp: tg.Hyperparameters, gpus: int) -> None:
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    model.set_looping(bool(hp.num_loops))
    idx = torch.randint(0, hp.vocab_size, (1, hp.train_seq_len))
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with hooks, torch.autocast("cpu", dtype=torch.bfloat16):
        model(idx, idx)
    model.set_looping(False)
    per_gpu = hp.train_batch_tokens // (gpus * hp.micro_steps(gpus) * hp.train_seq_len)
    per_seq = sum(storages.values())
    print(f"saved for backward: {per_seq / 2**30:.2f} GiB per {hp.train_seq_len}-token sequence; "
          f"{per_gpu} sequences per GPU per micro-step: {per_gpu * per_seq / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
