"""The softcapped head's memory, compiled: ours (train_gpt.GPT.logits and forward: the logits cast to fp32, then
the tanh cap, then the cross-entropy) beside the challenge's (the cap in bf16, then fp32 for the cross-entropy),
at one micro-step of the default run (65,536 tokens, width 512, vocab 1,024) or any shape.

    python bench/head_memory.py [--tokens 65536] [--dim 512] [--vocab 1024] [--device cpu|cuda]

For each head it prints the (tokens, vocab) buffers that the compiled forward and backward allocate, by dtype
(from inductor's generated code), and which of them the forward saves for the backward. On CUDA it also prints
the peak memory of a forward and backward above what was allocated before it.
"""

import argparse
import re

import torch
import torch.nn.functional as F
from torch._inductor.utils import run_and_get_code


def ours(x, weight, targets, cap):
    logits = F.linear(x, weight.to(x.dtype)).float()
    return F.cross_entropy(cap * torch.tanh(logits / cap), targets)


def challenge(x, weight, targets, cap):
    logits = cap * torch.tanh(F.linear(x, weight.to(x.dtype)) / cap)
    return F.cross_entropy(logits.float(), targets)


def measure(head, args, device):
    x = torch.randn(args.tokens, args.dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    weight = (0.02 * torch.randn(args.vocab, args.dim, device=device)).requires_grad_()
    targets = torch.randint(args.vocab, (args.tokens,), device=device)
    compiled = torch.compile(head, dynamic=False)
    saved = []

    def step():
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = compiled(x, weight, targets, 30.0)
        loss.backward()
    _, code = run_and_get_code(step)
    shape = rf"\({args.tokens}, {args.vocab}\), \({args.vocab}, 1\), (?:device='cuda', )?torch\.(\w+)"
    allocated = re.findall(rf"empty_strided_\w+\({shape}", "\n".join(code))
    kept = [str(t.dtype).removeprefix("torch.") for t in saved if t.shape == (args.tokens, args.vocab)]
    line = f"{head.__name__:9} (tokens, vocab) buffers allocated: {sorted(allocated)}; saved for backward: {kept}"
    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        line += f"; peak above the inputs: {(torch.cuda.max_memory_allocated() - base) / 2 ** 20:.0f} MiB"
    print(line, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=65_536)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    for head in (ours, challenge):
        measure(head, args, torch.device(args.device))


if __name__ == "__main__":
    main()
