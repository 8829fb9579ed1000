"""GPTQ against round-to-nearest on a real model: what GPTQ=1 buys at each width.

    python bench/gptq.py logs/<run>_model.int6_lzma.ptz logs/<run>.txt [--reader old/train_gpt.py]
        [--bits 6 5 4] [--calib-seqs 64] [--calib train|selfgen]

The run's model is read back (its weights sit on its export's grid) and re-exported at each --bits
width two ways, both by train_gpt.py's own code: round-to-nearest per row with the searched clip
(GPTQ=0), and GPTQ with the same per-row scales on Hessians from train_gpt.calibrate (GPTQ=1: the
next training sequences, or the model's own samples; the tied embedding through the output head's
inputs). Each model is scored with the plain validation eval.
"""

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train_gpt as tg  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("log", type=Path, help="the run's log: its hyperparameters line gives the model's shape")
    parser.add_argument("--reader", type=Path, help="the train_gpt.py that wrote the artifact, if its format is older")
    parser.add_argument("--bits", type=int, nargs="+", default=[6, 5, 4])
    parser.add_argument("--calib-seqs", type=int, default=64)
    parser.add_argument("--calib", choices=["train", "selfgen"], default="train")
    args = parser.parse_args()
    reader = tg
    if args.reader:
        spec = importlib.util.spec_from_file_location("reader_train_gpt", args.reader)
        reader = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(reader)
    line = next(l for l in args.log.read_text().splitlines() if l.startswith("hyperparameters: "))
    hp = tg.Hyperparameters(**json.loads(line.removeprefix("hyperparameters: ")))
    layout = tg.Layout(0, 1, 0, False, torch.device("cpu"), 1, False, False)
    state = reader.load_artifact(args.artifact)
    model = tg.GPT(hp)
    model.load_state_dict(state, strict=True)
    model.eval()

    tok = tg.load_tokenizer(hp.tokenizer_path, hp.vocab_size)
    val_tokens, val_bytes = tg.load_validation(os.path.join(hp.data_path, "fineweb_val_*.bin"), hp.train_seq_len, tok)
    hp.gptq_calib_seqs, hp.gptq_calib = args.calib_seqs, args.calib
    run = tg.Run(hp, layout, tok, val_tokens, val_bytes, log=print, model=model)
    loader = tg.DistributedTokenLoader(os.path.join(hp.data_path, "fineweb_train_*.bin"), 0, 1, layout.device)
    hessians = tg.calibrate(run, loader)  # what GPTQ=1 computes after training
    _, reference = tg.evaluate(model, val_tokens, val_bytes, hp, layout)
    print(f"the artifact's model: val_bpb {reference:.5f} (plain eval)")
    for bits in args.bits:
        for method in ("round-to-nearest", "gptq"):
            t0 = time.perf_counter()
            exported = tg.quantize_state_dict(state, bits, hp.embed_quant_bits, hessians if method == "gptq" else None)
            quantized = tg.dequantize_state_dict(exported)
            seconds = time.perf_counter() - t0
            model.load_state_dict(quantized, strict=True)
            _, bpb = tg.evaluate(model, val_tokens, val_bytes, hp, layout)
            print(f"int{bits} {method:<16} val_bpb {bpb:.5f} (Δ {bpb - reference:+.5f}), quantized in {seconds:.1f} s",
                  flush=True)
            model.load_state_dict(state, strict=True)


if __name__ == "__main__":
    main()
