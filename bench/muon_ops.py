"""The ops one Muon step dispatches, ours beside the challenge's train_gpt.py (given its path), at the default
run's shape (9x512: 54 matrices), counted on this CPU by a dispatch mode: each aten op is a kernel launch or
more on a GPU (a foreach op over a list is one, or a few), so the count is what the host must launch.

    python bench/muon_ops.py --reference path/to/the/challenge/train_gpt.py

Ours keeps the matrices in banks of one shape (4 at the default shape) and runs each bank's Newton-Schulz
batched; the challenge's runs one per matrix. Eager counts: on CUDA ours compiles each bank's update into a few
fused kernels, the challenge's compiles Newton-Schulz per matrix.
"""

import argparse

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from run_files import tg
from step_ops import challenge_model


class OpCounter(TorchDispatchMode):
    """The aten ops dispatched (each a kernel launch or more on a GPU; a foreach op is one)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def steady_step_ops(optimizer, params) -> int:
    """Ops of the second step, a steady one (the challenge's Muon makes its momentum buffers at its first)."""
    for _ in range(2):
        for p in params:
            p.grad = torch.randn_like(p)
        with OpCounter() as counter:
            optimizer.step()
    return counter.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", required=True, help="the challenge's train_gpt.py")
    parser.add_argument("--model-dim", type=int, default=512, help="narrower: quicker, the same count")
    args = parser.parse_args()
    hp = tg.Hyperparameters(model_dim=args.model_dim)
    torch.manual_seed(0)
    _, muon = tg.build_optimizers(tg.GPT(hp), hp, tg.Layout())
    ours = muon.param_groups[0]["params"]
    challenge = challenge_model(args.reference, hp)
    module = challenge.__class__.__module__
    patterns = getattr(__import__(module), "CONTROL_TENSOR_NAME_PATTERNS", ())
    theirs = [p for name, p in challenge.blocks.named_parameters()
              if p.ndim == 2 and not any(pattern in name for pattern in patterns)]
    reference = __import__(module).Muon(theirs, lr=hp.matrix_lr, momentum=hp.muon_momentum,
                                        backend_steps=hp.muon_backend_steps)
    print("| script | matrices | ops a Muon step |\n|---|---|---|")
    print(f"| ours (banks) | {len(ours)} | {steady_step_ops(muon, ours)} |")
    print(f"| challenge | {len(theirs)} | {steady_step_ops(reference, theirs)} |")


if __name__ == "__main__":
    main()
