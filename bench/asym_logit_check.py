"""AsymLogit (`ASYM_LOGIT_RESCALE=1` in PRs #2014 and #2135): do its two logit caps ever train? Run on the field's
own file, on CPU.

    python bench/asym_logit_check.py --field path/to/pr2135     # a copy of a PR's record folder (its train_gpt.py)

The field's README says the caps are "adapted by global TTT once over the prefix pass". They are two scalars
(`softcap_pos`, `softcap_neg`, each 30.0 at init) that only `forward_logits` and `forward_ttt` read. This imports
the field's file on a CPU torch (Triton's kernels stubbed and kept off by FUSED_CE_ENABLED=0 and eager MLPs,
FlashAttention 3 by PyTorch's SDPA), builds a tiny model, and asks the three places a parameter could train:
- the training loss and the global phase's SGD loss, both `GPT.forward` (the SGD: `base_model(x, y, cu_seqlens)`):
  after its backward, which parameters have no gradient (SGD skips those);
- the training optimizers (`Optimizers`): whether any holds the caps;
- the per-document TTT step: the adapters' AdamW holds the LoRA's parameters only (the base model is frozen).
Printed: each answer. The caps never move, so the eval's s * tanh(z / s) is 30 * tanh(z / 30) on both signs: the
fixed cap of 30 that LOGIT_SOFTCAP already computes (its default). Exit status 1 if the caps could train.
"""

import argparse
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

TINY = dict(VOCAB_SIZE=64, NUM_LAYERS=4, MODEL_DIM=64, NUM_HEADS=4, NUM_KV_HEADS=2, MLP_MULT=2, ROPE_DIMS=8,
            NUM_LOOPS=1, LOOP_START=1, LOOP_END=2, PARALLEL_START_LAYER=3, XSA_LAST_N=4, EVAL_SEQ_LEN=32,
            TTT_EVAL_SEQ_LEN=32, FUSED_CE_ENABLED=0, ASYM_LOGIT_RESCALE=1, SPARSE_ATTN_GATE_ENABLED=1,
            SMEAR_GATE_ENABLED=1, RUN_ID="asym_logit_check")
CAPS = {"softcap_pos", "softcap_neg"}


def attention(q, k, v):
    """FlashAttention 3's (batch, time, heads, dim) causal attention, GQA, by SDPA."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    groups = q.size(1) // k.size(1)
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, causal=True,
                     **_):
    """FlashAttention 3's packed attention: causal within each [cu[i], cu[i + 1]) segment."""
    out = torch.zeros_like(q)
    bounds = cu_seqlens_q.tolist()
    for start, end in zip(bounds, bounds[1:]):
        if end > start:
            out[start:end] = attention(q[None, start:end], k[None, start:end], v[None, start:end])[0]
    return out


def import_field(script: Path, environ: dict):
    """The field's train_gpt.py as a module, its settings read from `environ` (its Hyperparameters reads them as
    the file is imported): Triton's kernels defined but never run, FA3 by SDPA, BOS_ID 1 (set at its startup)."""
    os.environ.update({key: str(value) for key, value in environ.items()})
    triton, language, tools, descriptor = (types.ModuleType(name) for name in
                                           ("triton", "triton.language", "triton.tools",
                                            "triton.tools.tensor_descriptor"))
    triton.jit = lambda fn=None, **_: fn if fn is not None else (lambda f: f)
    triton.cdiv = lambda a, b: -(-a // b)
    language.constexpr = object
    descriptor.TensorDescriptor = object
    triton.language, triton.tools, tools.tensor_descriptor = language, tools, descriptor
    stubs = {"triton": triton, "triton.language": language, "triton.tools": tools,
             "triton.tools.tensor_descriptor": descriptor}
    flash = types.ModuleType("flash_attn_interface")
    flash.flash_attn_func = lambda q, k, v, causal=True, **_: attention(q, k, v)
    flash.flash_attn_varlen_func = varlen_attention
    sys.modules.update(stubs, flash_attn_interface=flash)
    sys.path.insert(0, str(script.parent))  # #2135 imports its n-gram helper from its folder
    spec = importlib.util.spec_from_file_location("field_train_gpt", script)
    module = importlib.util.module_from_spec(spec)
    compile_ = torch.compile
    torch.compile = lambda fn=None, **_: fn if fn is not None else (lambda f: f)  # the import's @torch.compile
    try:
        spec.loader.exec_module(module)
    finally:
        torch.compile = compile_
        for name in stubs:
            sys.modules.pop(name)
    module.BOS_ID = 1
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--field", type=Path, required=True, help="a folder holding a field record's train_gpt.py")
    args = parser.parse_args()
    field = import_field(args.field / "train_gpt.py", TINY)
    h = field.Hyperparameters()
    torch.manual_seed(0)
    model = field.GPT(h)
    for block in model.blocks:
        block.mlp.use_fused = False  # the eager MLP: Triton's is stubbed
    named = dict(model.named_parameters())
    if not CAPS <= set(named):
        print(f"{args.field}: no {sorted(CAPS)} parameters: not AsymLogit's file, or ASYM_LOGIT_RESCALE is off")
        return 1
    with torch.no_grad():
        for name, p in named.items():
            if name not in CAPS:
                p.add_(0.05 * torch.randn_like(p))
    tokens = torch.randint(2, TINY["VOCAB_SIZE"], (2, 33))
    tokens[:, 0] = tokens[1, 17] = 1  # BOS: two documents in the second row
    x, y = tokens[:, :-1], tokens[:, 1:]
    model(x, y).backward()  # the training loss
    no_grad = sorted(name for name, p in named.items() if p.grad is None)
    print(f"training loss GPT.forward(x, y): parameters without a gradient: {no_grad}")
    model.zero_grad(set_to_none=True)
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    starts = (flat_x == 1).nonzero().flatten().tolist()
    cu = torch.tensor(starts + [flat_x.numel()], dtype=torch.int32)
    model(flat_x[None], flat_y[None], cu_seqlens=cu, max_seqlen=int(cu.diff().max())).backward()  # the SGD's loss
    sgd_no_grad = sorted(name for name, p in named.items() if p.grad is None)
    print(f"global SGD's loss GPT.forward(x, y, cu_seqlens): parameters without a gradient: {sgd_no_grad}")
    model.zero_grad(set_to_none=True)
    model.forward_logits(x).float().square().mean().backward()  # the eval's logits do read the caps
    live = CAPS <= {name for name, p in named.items() if p.grad is not None}
    print(f"the eval's forward_logits(x): the caps get a gradient there (the check can see one): {live}")
    try:
        optimizers = field.Optimizers(h, model)
        held = {id(p) for o in vars(optimizers).values() if isinstance(o, torch.optim.Optimizer)
                for group in o.param_groups for p in group["params"]}
        in_optimizers = sorted(name for name in CAPS if id(named[name]) in held)
        print(f"training optimizers ({type(optimizers).__name__}) holding a cap: {in_optimizers}")
    except Exception as error:  # it may need a process group; the gradients above already decide
        in_optimizers = []
        print(f"training optimizers: not built on CPU ({type(error).__name__}: {error}); the gradients decide")
    lora = field.BatchedTTTLoRA(2, model, 4) if hasattr(field, "BatchedTTTLoRA") else None
    lora_caps = lora is not None and any(p is named[name] for p in lora.parameters() for name in CAPS)
    print(f"per-document TTT: its AdamW holds the LoRA's {sum(1 for _ in lora.parameters()) if lora else 0} "
          f"parameters; a cap among them: {lora_caps}")
    trains = not (CAPS <= set(no_grad) and CAPS <= set(sgd_no_grad) and live) or in_optimizers or lora_caps
    caps = ", ".join(f"{name} = {named[name].item():g}" for name in sorted(CAPS))
    print(f"{caps}: the caps {'CAN' if trains else 'never'} train; the eval computes "
          f"{'a learned cap' if trains else '30 * tanh(z / 30), the fixed cap LOGIT_SOFTCAP=30 computes'}")
    return 1 if trains else 0


if __name__ == "__main__":
    sys.exit(main())
