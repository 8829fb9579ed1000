"""FLOPs per trained token and the peak bf16 rates that MFU is measured against (bench/ only: the trainer
logs tok/s, and MFU = flops_per_token x tok/s / (peak x GPUs))."""

import math

# Dense bf16 peak per GPU. Unknown GPUs get no MFU rather than a made-up one.
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


def peak_flops(gpu_name: str) -> float | None:
    return next((flops for gpu, flops in PEAK_BF16_FLOPS.items() if gpu in gpu_name), None)


def count_flops_per_token(model, hp) -> float:
    """6 per matmul weight as run (loops each time, lookups free) + QK^T and AV, no causal discount (PaLM)."""
    order = model.layer_order()
    modules = [model.blocks[i] for i in order] + [model.tok_emb]
    if model.bigram_proj is not None:
        modules.append(model.bigram_proj)
    matmuls = sum(p.numel() for m in modules for p in m.parameters())
    return 6 * matmuls + 12 * len(order) * hp.model_dim * hp.train_seq_len


def ttt_positions(targets: float, hp) -> int:
    """Token positions train_gpt.lora_ttt() runs, compiled, for a group of TTT_BATCH_SIZE documents whose longest
    has this many targets: every row at every chunk, chunk c in a window of min((c + 1) x TTT_CHUNK_SIZE, the eval
    window). Each position costs a forward and the backward to the adapters: 2 forwards' FLOPs."""
    chunks = range(math.ceil(targets / hp.ttt_chunk_size))
    return hp.ttt_batch_size * sum(min((c + 1) * hp.ttt_chunk_size, hp.eval_window) for c in chunks)
