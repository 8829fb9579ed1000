"""FLOPs per trained token and the peak bf16 rates that MFU is measured against (bench/ only: the trainer
logs tok/s, and MFU = flops_per_token x tok/s / (peak x GPUs))."""

import json
import math
from pathlib import Path

import numpy as np

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
    has this many targets: every row at every chunk, chunk c in a window of min((c + 1) x TTT_CHUNK_SIZE,
    TRAIN_SEQ_LEN). Each position costs a forward and the backward to the adapters: 2 forwards' FLOPs."""
    chunks = range(math.ceil(targets / hp.ttt_chunk_size))
    return hp.ttt_batch_size * sum(min((c + 1) * hp.ttt_chunk_size, hp.train_seq_len) for c in chunks)


LENGTHS = json.loads((Path(__file__).with_name("fineweb_val_doc_lengths.json")).read_text())


def fineweb_ttt_positions(hp) -> float:
    """Token positions lora_ttt() runs on FineWeb's validation documents, compiled: each group's rows (documents
    sorted by length) chunk by chunk until its longest ends, chunk c in a window of min((c + 1) x TTT_CHUNK_SIZE,
    TRAIN_SEQ_LEN). Lengths between the batches the field's logs name are interpolated, and a group's longest
    is read off the field's batches of 64 (an overestimate: 9.6% more tokens than the split has)."""
    known = np.array(LENGTHS["batches"], dtype=float)
    batches = -(-LENGTHS["documents"] // LENGTHS["batch_size"])
    longest = np.interp(np.arange(1, batches + 1), known[:, 0], known[:, 2])  # each field batch's longest
    per_group = max(1, hp.ttt_batch_size // LENGTHS["batch_size"])
    return sum(ttt_positions(length - 1, hp) for length in longest[per_group - 1::per_group])
