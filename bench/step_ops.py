"""The compiled training step, op by op, beside the challenge's own train_gpt.py (given its path).

    python bench/step_ops.py --reference path/to/the/challenge/train_gpt.py
    python bench/step_ops.py --reference train_gpt.py      # ours against itself: no difference (the tests)

Each model is built at the challenge's default shape (9x512, sp1024) as its script builds it (the challenge's
cast to bf16, then its linear weights and control tensors back to fp32; ours in fp32), and one micro-step's
forward and backward under bf16 autocast is traced by torch.compile through AOTAutograd with the
decompositions Inductor applies, on this CPU. CPU autocast leaves rms_norm in its input's dtype where CUDA's
runs it in fp32; the trace applies CUDA's rule (q and k then meet RoPE in fp32 in both scripts, as on a GPU).
Counted: the aten ops of the forward and backward graphs that Inductor fuses into kernels, by kind. Matmuls,
attention and reductions are kernels of their own and must match; where ours has more casts, pointwise ops or
views, the reason is named below (EXTRA); anything else makes the bench exit with status 1. The GPU's own
kernel launches per step, for both scripts, come from bench/gpu_check.py's parity part (torch.profiler).
"""

import argparse
import collections
import sys
from pathlib import Path

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._inductor.decomposition import select_decomp_table

from run_files import reader_module, tg

# What an aten op becomes under Inductor: matmuls, attention and reductions are kernels of their own (or a
# reduction's loop), so they must match; casts and pointwise ops fuse into their neighbours; views are free.
HEAVY = ("matmul", "attention", "reduction")
VIEWS = ("view", "alias", "reshape", "unsqueeze", "squeeze", "permute", "transpose", "aten.t.", "expand", "slice.",
         "select", "split", "getitem", "as_strided", "unbind")
REDUCTIONS = ("sum", "amax", "amin", "mean", "var", "prod", "argmax", "any.", "all.", "max.", "min.")
# Where ours runs more ops of a kind than the challenge's script, and why.
EXTRA = {
    "cast": "ours keeps the embedding in fp32 where the challenge's casts it to bf16, so the embedding's output "
            "and the tied head's weight are cast to bf16 and their gradients back; and relu^2 is written "
            "leaky_relu(x, 0)^2, whose decomposition computes in fp32 (each layer's MLP hidden cast in and out, "
            "twice forward and three times backward) where relu stays in bf16. Inductor fuses a cast into the "
            "kernel beside it, and its GPU kernels compute bf16 in fp32 registers either way",
    "pointwise": "the same maths written otherwise: relu^2 as leaky_relu(x, 0)^2 (a comparison and a select), "
                 "the rotation by +theta (a subtraction) where the challenge's rotates by -theta (a negation and "
                 "an addition), and the challenge's rotary tables computed inside its graph (iota, cos, sin)",
    "view": "chunk() where the challenge's slices: views cost nothing",
}


def kind(op: str) -> str:
    if "mm" in op:
        return "matmul"
    if "attention" in op:
        return "attention"
    if any(v in op for v in VIEWS):
        return "view"
    if "convert_element_type" in op or "_to_copy" in op:
        return "cast"
    if any(r in op for r in REDUCTIONS):
        return "reduction"
    return "pointwise"


def challenge_model(path: Path, hp):
    """The challenge's GPT as its main() builds it, from its own file."""
    module = reader_module(path)
    if not hasattr(module, "restore_low_dim_params_to_fp32"):  # ours, standing in for the challenge's
        return module.GPT(hp)
    model = module.GPT(vocab_size=hp.vocab_size, num_layers=hp.num_layers, model_dim=hp.model_dim,
                       num_heads=hp.num_heads, num_kv_heads=hp.num_kv_heads, mlp_mult=hp.mlp_mult,
                       tie_embeddings=True, tied_embed_init_std=hp.tied_embed_init_std,
                       logit_softcap=hp.logit_softcap, rope_base=hp.rope_base, qk_gain_init=hp.qk_gain_init)
    model = model.bfloat16()
    for m in model.modules():
        if isinstance(m, module.CastedLinear):
            m.float()
    module.restore_low_dim_params_to_fp32(model)
    return model


def rms_norm_as_on_cuda(x, *args, **kwargs):
    """F.rms_norm as CUDA's autocast runs it, in fp32 whatever x's dtype (the CPU's autocast leaves it in x's):
    so on CUDA both scripts' q and k leave it in fp32 and meet RoPE's tables there."""
    if torch.is_autocast_enabled("cpu"):
        x = x.float()
    return RMS_NORM(x, *args, **kwargs)


RMS_NORM = torch.nn.functional.rms_norm


def traced_ops(model, batch: int, seq_len: int, vocab: int) -> dict:
    """{"forward": Counter, "backward": Counter} of the aten ops in one compiled micro-step, under CPU autocast
    with CUDA's rule for rms_norm."""
    graphs = {}

    def recorder(kind):
        def compiler(gm, example_inputs):
            graphs[kind] = collections.Counter(str(node.target) for node in gm.graph.nodes
                                               if node.op == "call_function")
            return gm.forward
        return compiler
    backend = aot_autograd(fw_compiler=recorder("forward"), bw_compiler=recorder("backward"),
                           decompositions=select_decomp_table())
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    x = torch.randint(0, vocab, (batch, seq_len))
    torch.nn.functional.rms_norm = rms_norm_as_on_cuda
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compiled(x, x)
        loss.backward()
    finally:
        torch.nn.functional.rms_norm = RMS_NORM
    return graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="the challenge's train_gpt.py")
    parser.add_argument("--batch", type=int, default=2, help="sequences per micro-step (the graph is the same)")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--num-layers", type=int, default=9, help="fewer: a quicker trace, for the tests")
    args = parser.parse_args()
    hp = tg.Hyperparameters(train_seq_len=args.seq_len, num_layers=args.num_layers)
    torch.manual_seed(0)
    graphs = {"ours": traced_ops(tg.GPT(hp), args.batch, args.seq_len, hp.vocab_size),
              "challenge": traced_ops(challenge_model(args.reference, hp), args.batch, args.seq_len, hp.vocab_size)}
    kinds = ("matmul", "attention", "reduction", "cast", "pointwise", "view")
    print("| graph | script | " + " | ".join(kinds) + " |\n|---|---|" + "---|" * len(kinds))
    unexplained = []
    for graph in ("forward", "backward"):
        counts = {}
        for script, found in graphs.items():
            counts[script] = collections.Counter()
            for op, n in found[graph].items():
                counts[script][kind(op)] += n
            print(f"| {graph} | {script} | " + " | ".join(str(counts[script][k]) for k in kinds) + " |")
        for k in kinds:
            if counts["ours"][k] > counts["challenge"][k] and (k in HEAVY or k not in EXTRA):
                unexplained.append(f"{graph} {k}")
    extra = {k for k in EXTRA if any(sum(n for op, n in graphs["ours"][g].items() if kind(op) == k) >
                                     sum(n for op, n in graphs["challenge"][g].items() if kind(op) == k)
                                     for g in ("forward", "backward"))}
    for k in sorted(extra):
        print(f"more {k} ops: {EXTRA[k]}")
    if unexplained:
        sys.exit(f"step_ops: ours runs more {', '.join(unexplained)} ops than the challenge's script; a matmul, "
                 "attention or reduction is a kernel of its own: remove it, or name the reason in EXTRA")


if __name__ == "__main__":
    main()
