"""GPTQ against round-to-nearest on a real model: what GPTQ=1 buys at each width.

    python bench/gptq.py logs/<run>_model.int6_lzma.ptz logs/<run>.txt [--reader old/train_gpt.py]
        [--bits 6 5 4] [--sigmas 0 12.85] [--calib-seqs 64] [--compressor brotli]
    python bench/gptq.py checkpoints/<run>/step_NNNNNN logs/<run>.txt ...   (a checkpoint's float weights)

The run's model is read back (an artifact's weights sit on its export's grid; a checkpoint's are the
trained floats) and re-exported at each --bits width two ways, both by train_gpt.py's own code:
round-to-nearest per row with the searched clip (GPTQ=0), and GPTQ with the same per-row scales on
Hessians from train_gpt.calibrate (GPTQ=1: the next training sequences; the tied embedding through the
output head's inputs). --sigmas other than 0 replaces the clip search by MATRIX_CLIP_SIGMAS's clip at that
many row standard deviations (block matrices only; the embedding keeps the run's export). Each model is
scored with the plain validation eval; its artifact's compressed bytes are given per parameter.
"""

import argparse
import dataclasses
import io
import time
from functools import partial

import torch

from run_files import add_run_arguments, cpu_run, read_run, tg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("--bits", type=int, nargs="+", default=[6, 5, 4])
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.0], help="0: the clip search")
    parser.add_argument("--calib-seqs", type=int, default=64)
    parser.add_argument("--compressor", default="brotli", choices=list(tg.COMPRESSORS))
    args = parser.parse_args()
    hp, state = read_run(args)
    hp.gptq_calib_seqs = args.calib_seqs
    run = cpu_run(hp, state)
    model = run.model
    loader = tg.DistributedTokenLoader(tg.train_pattern(hp.data_path))
    hessians = tg.calibrate(run, loader)  # what GPTQ=1 computes after training
    windows = hp.windows(False)
    _, reference = tg.metrics(tg.score(model, run.val, run.layout, *windows))
    print(f"the model as read: val_bpb {reference:.5f} (plain eval)")
    compress = partial(tg.compress, name=args.compressor)
    parameters = sum(t.numel() for t in state.values())
    for bits in args.bits:
        for sigmas in args.sigmas:
            export_hp = dataclasses.replace(hp, matrix_bits=bits, matrix_clip_sigmas=sigmas)
            for method in ("round-to-nearest", "gptq"):
                t0 = time.perf_counter()
                used = hessians if method == "gptq" else None
                exported = tg.quantize_state_dict(state, export_hp, used)
                quantized = tg.dequantize_state_dict(exported)
                seconds = time.perf_counter() - t0
                buffer = io.BytesIO()
                torch.save(exported, buffer)
                blob = compress(buffer.getvalue())
                model.load_state_dict(quantized, strict=True)
                _, bpb = tg.metrics(tg.score(model, run.val, run.layout, *windows))
                clip = f"{sigmas:g} stds" if sigmas else "searched"
                print(f"int{bits} clip {clip:<10} {method:<16} val_bpb {bpb:.5f} "
                      f"(Δ {bpb - reference:+.5f}), {len(blob):,} bytes {args.compressor} "
                      f"({len(blob) / parameters:.3f} per parameter), quantized in {seconds:.1f} s",
                      flush=True)
                model.load_state_dict(state, strict=True)


if __name__ == "__main__":
    main()
