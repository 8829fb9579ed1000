"""Is full-Hessian GPTQ worth its lines in train_gpt.py? A prototype, measured on a real model.

    python bench/gptq.py logs/<run>_model.int6_lzma.ptz logs/<run>.txt [--reader old/train_gpt.py]
        [--bits 6 5 4] [--calib-seqs 64]

The run's model is read back (its weights sit on the export's int-N grid) and re-exported at each
--bits width two ways: today's round-to-nearest per row with the searched clip (train_gpt.quantize_rows),
and GPTQ with the same per-row scales: H = X^T X of each quantized matrix's inputs over calibration
sequences from the *training* shards, dampened by 1% of its mean diagonal, columns in descending
order of H's diagonal (act order), blocks of 128, each column's rounding error pushed onto the
columns not yet quantized through the upper Cholesky factor of H^-1 (Frantar et al. 2022). The token
embedding keeps round-to-nearest in both. Each model is scored with the plain validation eval.
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


def gptq_rows(w: torch.Tensor, H: torch.Tensor, bits: int, block: int = 128, damp: float = 0.01):
    """Integers (as float) and per-row scales for w (out, in) given its input Hessian H (in, in)."""
    qmax = 2 ** (bits - 1) - 1
    _, scale = tg.quantize_rows(w, bits)  # the clip search's scales: the format and the loader stay as they are
    W, H = w.clone().double(), H.clone().double()
    dead = H.diagonal() == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    order = torch.argsort(H.diagonal(), descending=True)
    W, H = W[:, order], H[order][:, order]
    H += damp * H.diagonal().mean() * torch.eye(len(H), dtype=H.dtype)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    s = scale.double()[:, None]
    Q = torch.zeros_like(W)
    for a in range(0, W.size(1), block):
        b = min(a + block, W.size(1))
        err = torch.zeros(W.size(0), b - a, dtype=W.dtype)
        for j in range(a, b):
            q = torch.clamp(torch.round(W[:, j:j + 1] / s), -qmax, qmax)
            Q[:, j:j + 1] = q
            e = (W[:, j:j + 1] - q * s) / U[j, j]
            W[:, j + 1:b] -= e @ U[j:j + 1, j + 1:b]
            err[:, j - a:j - a + 1] = e
        W[:, b:] -= err @ U[a:b, b:]
    return Q[:, torch.argsort(order)].float(), scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("log", type=Path, help="the run's log: its hyperparameters line gives the model's shape")
    parser.add_argument("--reader", type=Path, help="the train_gpt.py that wrote the artifact, if its format is older")
    parser.add_argument("--bits", type=int, nargs="+", default=[6, 5, 4])
    parser.add_argument("--calib-seqs", type=int, default=64)
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

    # calibration: H = X^T X of every quantized CastedLinear's input, over training sequences
    hessians, hooks = {}, []
    for name, m in model.named_modules():
        if isinstance(m, tg.CastedLinear) and tg.is_quantized(m.weight):
            hessians[name + ".weight"] = torch.zeros(m.in_features, m.in_features, dtype=torch.float64)

            def hook(module, inputs, _, key=name + ".weight"):
                x = inputs[0].reshape(-1, inputs[0].size(-1)).double()
                hessians[key] += x.T @ x
            hooks.append(m.register_forward_hook(hook))
    loader = tg.DistributedTokenLoader(os.path.join(hp.data_path, "fineweb_train_*.bin"), 0, 1, layout.device)
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(args.calib_seqs // 8):
            x, _ = loader.next_batch(8 * hp.train_seq_len, hp.train_seq_len, 1)
            model.logits(x)
    for h in hooks:
        h.remove()
    print(f"calibration: {args.calib_seqs} training sequences of {hp.train_seq_len}, {time.perf_counter() - t0:.1f} s")

    tok = tg.load_tokenizer(hp.tokenizer_path, hp.vocab_size)
    val_tokens, val_bytes = tg.load_validation(os.path.join(hp.data_path, "fineweb_val_*.bin"), hp.train_seq_len, tok)
    _, reference = tg.evaluate(model, val_tokens, val_bytes, hp, layout)
    print(f"the artifact's model: val_bpb {reference:.5f} (plain eval)")
    for bits in args.bits:
        for method in ("round-to-nearest", "gptq"):
            t0 = time.perf_counter()
            quantized = {}
            for name, w in state.items():
                if name in hessians and method == "gptq":
                    q, scale = gptq_rows(w.float(), hessians[name], bits)
                elif tg.is_quantized(w):
                    q, scale = tg.quantize_rows(w.float(), hp.embed_quant_bits if name == "tok_emb.weight" else bits)
                else:
                    quantized[name] = w
                    continue
                quantized[name] = q * scale.float()[:, None]
            seconds = time.perf_counter() - t0
            model.load_state_dict(quantized, strict=True)
            _, bpb = tg.evaluate(model, val_tokens, val_bytes, hp, layout)
            print(f"int{bits} {method:<16} val_bpb {bpb:.5f} (Δ {bpb - reference:+.5f}), quantized in {seconds:.1f} s",
                  flush=True)
            model.load_state_dict(state, strict=True)


if __name__ == "__main__":
    main()
