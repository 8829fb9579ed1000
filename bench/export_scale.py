"""The default export's bytes as the weights' scale changes: ours, and the challenge's (given its script).

    python bench/export_scale.py --reference path/to/the/challenge/train_gpt.py

The default model (9x512, sp1024) with each large matrix drawn afresh at std sigma (Gaussian, or Student's t with
4 degrees of freedom scaled to the same std: heavier tails, as trained weights have), the rest as initialized;
each export is serialized and compressed as its script does it (ours: save_artifact; the challenge's:
quantize_state_dict_int8, torch.save, zlib level 9). The challenge floors each row's scale at 1/127, so rows of
small weights round to few levels and compress well; ours searches each row's clip without a floor, so its bytes
hardly depend on the scale. What a trained model makes is its real run's business: this says which way the
scale moves each export.
"""

import argparse

import torch

from run_files import challenge_export_bytes, reader_module, tg

SIGMAS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)


def drawn(base: dict, sigma: float, tails: str, seed: int = 1) -> dict:
    """base with each large matrix (over 65,536 weights: the challenge's and ours both quantize these) redrawn."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for name, t in base.items():
        if t.ndim == 2 and t.numel() > 65_536:
            w = torch.randn(t.shape, generator=g)
            if tails == "t4":  # Student's t, 4 degrees of freedom, std 1
                chi2 = torch.randn((4, *t.shape), generator=g).square().sum(0)
                w = w / (chi2 / 4).sqrt() / 2 ** 0.5
            state[name] = w * sigma
        else:
            state[name] = t.clone()
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference", help="the challenge's train_gpt.py (its export beside ours)")
    parser.add_argument("--tails", default="normal,t4", help="normal, t4 or both")
    args = parser.parse_args()
    reference = reader_module(args.reference) if args.reference else None
    hp = tg.Hyperparameters()
    torch.manual_seed(0)
    base = tg.GPT(hp).state_dict()
    print("| weights | sigma | ours (bytes) | the challenge's (bytes) |")
    print("|---|---|---|---|")
    for tails in args.tails.split(","):
        for sigma in SIGMAS:
            state = drawn(base, sigma, tails)
            ours = len(tg.save_artifact(state, None, hp))
            theirs = f"{challenge_export_bytes(reference, state):,}" if reference else "-"
            print(f"| {tails} | {sigma} | {ours:,} | {theirs} |", flush=True)


if __name__ == "__main__":
    main()
