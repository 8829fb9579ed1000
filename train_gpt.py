"""train_gpt.py: the Parameter Golf speedrun in one file. It trains a small GPT (the field's levers as settings) with
Muon and Adam under a wallclock cap, exports low-bit compressed weights and scores their exact val_bpb.

    8xH100:  torchrun --standalone --nproc_per_node=8 train_gpt.py
    1 GPU:   torchrun --standalone --nproc_per_node=1 train_gpt.py  (8 // world_size micro-steps keep the math)
    CPU:     python train_gpt.py   or   torchrun --standalone --nproc_per_node=2 train_gpt.py  (gloo)

Every setting is an environment variable (NUM_LAYERS=11 torchrun ...; python train_gpt.py --help lists them).
Rank 0 writes logs/<RUN_ID>.txt: this file's source, versions, hardware, then every console line. Cap: 1500 lines.
"""

import ast
import base64
import copy
import difflib
import glob
import hashlib
import importlib.util
import io
import json
import lzma
import math
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
import uuid
import zlib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP

# ---- HYPERPARAMETERS ----
class ConfigError(ValueError):
    """A bad setting or input (raised before any work), or a run that cannot go on: no traceback."""

DATA_HINT = ("HINT: build the offline corpus with `python data/build_sotu.py` (DATA_PATH=./data/datasets/sotu_sp1024 "
             "TOKENIZER_PATH=./data/tokenizers/sotu_1024_bpe.model), or fetch the challenge's data with "
             "`python data/download_challenge.py --variant sp1024`")

@dataclass
class Hyperparameters:
    """Every setting; its env var is its name in upper case. --help prints each line's comment."""
    # data and run
    data_path: str = "./data/datasets/fineweb10B_sp1024"  # folder of fineweb_{train,val}_*.bin shards
    tokenizer_path: str = "./data/tokenizers/fineweb_1024_bpe.model"  # SentencePiece .model or byte tokenizer .json
    run_id: str = ""  # names logs/<RUN_ID>.txt, the artifact and the checkpoints; empty: a random uuid
    seed: int = 1337  # the initialization (data order and evaluation are fixed)
    log_dir: str = "logs"  # where the log and the artifact go
    # validation and logging
    val_batch_size: int = 524_288  # validation tokens per batch, over all ranks
    val_loss_every: int = 1000  # validate every N steps; 0: only at the end
    train_log_every: int = 200  # a step line every N steps (and the first 10)
    # schedule
    iterations: int = 20_000  # step cap
    warmdown_iters: int = 1200  # LR linear to 0 over the last N steps (or N x step time under a wallclock cap)
    warmup_steps: int = 20  # compile-priming steps, undone before training
    train_batch_tokens: int = 524_288  # tokens per optimizer step, over all ranks
    train_seq_len: int = 1024  # training (and plain validation) sequence length
    max_wallclock_seconds: float = 600.0  # training-time cap; 0: none
    grad_accum_steps: int = 0  # micro-steps per step; 0: 8 // world_size, so 1 and 8 GPUs take the same step
    # model
    vocab_size: int = 1024  # must equal the tokenizer's
    num_layers: int = 9  # blocks; the first half feed U-Net skips into the second
    num_kv_heads: int = 4  # key/value heads (GQA)
    model_dim: int = 512  # width
    num_heads: int = 8  # query heads
    mlp_mult: int = 2  # MLP hidden width = MLP_MULT x MODEL_DIM
    rope_base: float = 10_000.0  # RoPE frequency base
    logit_softcap: float = 30.0  # tanh cap on the logits
    qk_gain_init: float = 1.5  # initial per-head gain on the RMS-normed queries
    mlp_leaky_slope: float = 0.0  # MLP activation leaky_relu(x, slope)^2; 0: relu^2 (the field: 0.5)
    rope_dims: int = 0  # rotate only the first N dims of each head (partial RoPE); 0: all
    ln_scale: bool = False  # scale each block's normed inputs by 1/sqrt(layer index + 1)
    xsa_last_n: int = 0  # exclusive self-attention in the last N layers
    smear_gate: bool = False  # gated mix of the previous token's embedding into each token's, never across BOS
    bigram_buckets: int = 0  # hashed (previous, current) token-pair embedding with this many rows; 0: off
    bigram_dim: int = 128  # its width, projected to MODEL_DIM
    loop_start: int = 0  # depth recurrence: the first of the looped layers
    loop_end: int = 0  # the last of them (inclusive)
    loop_repeats: int = 0  # extra passes over LOOP_START..LOOP_END once LOOP_START_FRAC is reached; 0: off
    loop_start_frac: float = 0.5  # the fraction of the step or wallclock budget from which the loop runs
    parallel_from: int = 0  # from this layer on, two residual lanes (attention | MLP); 0: off
    skip_gates: bool = False  # U-Net skips as lerp(w * skip, x, sigmoid(g)), g zero-initialized
    ortho_init: bool = False  # orthogonal Q, K, V and MLP input matrices (output projections stay zero)
    attn_gate: bool = False  # each head's output times sigmoid(0.5 w_h . x[:12]) of the block's input; w zero
    # optimizer
    tied_embed_lr: float = 0.05  # Adam LR of the tied embedding
    tied_embed_init_std: float = 0.005  # init std of the tied embedding
    matrix_lr: float = 0.04  # Muon LR of the block matrices
    scalar_lr: float = 0.04  # Adam LR of vectors and control tensors
    muon_momentum: float = 0.95  # Muon momentum after its warmup
    muon_backend_steps: int = 5  # Newton-Schulz iterations
    muon_momentum_warmup_start: float = 0.85  # Muon momentum at step 0
    muon_momentum_warmup_steps: int = 500  # steps of linear momentum warmup
    beta1: float = 0.9  # Adam beta1
    beta2: float = 0.95  # Adam beta2
    adam_eps: float = 1e-8  # Adam epsilon
    grad_clip_norm: float = 0.0  # clip the global norm of the averaged gradients; 0: off
    muon_wd: float = 0.0  # decoupled weight decay p <- p * (1 - lr * wd) of Muon's matrices
    embed_wd: float = 0.0  # ... of the embedding(s) and an untied head (AdamW)
    scalar_wd: float = 0.0  # ... of the vectors and control tensors (AdamW)
    muon_row_norm: bool = False  # normalize each row of the update before orthogonalizing (MuonEq-R)
    muon_polar: bool = False  # Polar Express per-iteration coefficients instead of the fixed quintic
    warmdown_frac: float = 0.0  # LR linear to 0 over the last fraction of the step or wallclock budget; 0: by steps
    min_lr_scale: float = 0.0  # a floor under the LR multiplier: max(warmdown ramp, floor)
    ema_decay: float = 0.0  # the EMA of the weights is what validates and exports; 0: off
    # evaluation and export
    eval_seq_len: int = 0  # the sliding window's length; 0: TRAIN_SEQ_LEN
    eval_stride: int = 0  # sliding evaluation: each window scores its last STRIDE tokens; 0: off
    sliding_eval: bool = True  # with EVAL_STRIDE: the standalone sliding pass; 0 leaves it to TTT, which scores alike
    quant_bits: int = 8  # export width of the block matrices: 4 to 8 bits, one byte per integer
    embed_quant_bits: int = 8  # export width of the token embedding
    quant_sigmas: float = 0.0  # k: each row's step puts k of its stds at the top integer; 0: searched clip
    attn_quant_sigmas: float = 0.0  # ... for attention matrices; 0: QUANT_SIGMAS
    mlp_quant_sigmas: float = 0.0  # ... for MLP matrices; 0: QUANT_SIGMAS
    embed_quant_sigmas: float = 0.0  # ... for the embedding; 0: searched clip
    lqer_rank: int = 0  # LQER: a rank-R int2 x int4 correction of quantization errors; 0: off
    lqer_top_k: int = 3  # ... the matrices whose error is largest
    sidecar_bytes: str = "check"  # a byte sidecar's counts must match the decoded text; trust: as the field, unchecked
    compressor: str = "zlib"  # zlib, lzma, brotli or zpaq (the smallest and by far the slowest)
    pack_code: bool = False  # count the code at its packed size (minified, lzma, base85: records/make_record.py)
    gptq: bool = False  # full-Hessian GPTQ export; 0: round-to-nearest
    gptq_calib_seqs: int = 64  # calibration sequences of TRAIN_SEQ_LEN, over all ranks
    gptq_reserve_seconds: float = 0.0  # taken from MAX_WALLCLOCK_SECONDS for calibration on training data
    ttt: bool = False  # score-first test-time training after the round trip: its score is the run's
    ttt_chunk_tokens: int = 32_768  # each chunk of the validation stream is scored, then trained on
    ttt_lr: float = 0.002  # TTT's SGD learning rate, cosine-decayed over the chunks
    ttt_momentum: float = 0.9  # TTT's SGD momentum
    ttt_epochs: int = 1  # TTT steps per chunk, each on the whole chunk
    ttt_grad_clip: float = 1.0  # TTT's gradient-norm clip; 0: off
    # long runs
    save_every: int = 0  # checkpoint every N steps and at the end; 0: only on SIGTERM/SIGINT
    keep_checkpoints: int = 3  # keep the newest K checkpoints; 0: all
    checkpoint_dir: str = "checkpoints"  # checkpoints go to CHECKPOINT_DIR/<RUN_ID>/step_NNNNNN/
    resume: str = ""  # a checkpoint folder, or latest: the newest of RUN_ID
    # execution (auto: on for CUDA, off on CPU, where it is exact and never the slow choice)
    device: str = "auto"  # auto: CUDA if there is one, else the CPU; or cuda, cpu
    compile: str = "auto"  # torch.compile: auto, 0 or 1
    bf16: str = "auto"  # bf16 autocast and bf16 Muon updates: auto, 0 or 1
    optimize_ddp: bool = True  # dynamo's DDPOptimizer: graph split at gradient buckets (the field turns it off)

    @classmethod
    def from_env(cls, environ=os.environ) -> "Hyperparameters":
        environ = with_field_names(environ)
        hp = cls(**{f.name: _parse_env_value(f.name.upper(), environ[f.name.upper()], f.default)
                    for f in fields(cls) if f.name.upper() in environ})
        hp.validate()
        return hp

    @property
    def budget_ms(self) -> float:  # training's wallclock: the cap less GPTQ's reserve; inf: no cap
        return 1000.0 * (self.max_wallclock_seconds - self.gptq_reserve_seconds) if self.max_wallclock_seconds else math.inf

    def validate(self) -> None:  # what the settings alone can refuse; world size and files come later
        heads, window, values = max(self.num_heads, 1), self.eval_seq_len or self.train_seq_len, vars(self)
        head_dim = self.model_dim // heads
        choices = dict(device=("auto", "cuda", "cpu"), compile=("auto", "0", "1"), bf16=("auto", "0", "1"),
                       quant_bits=QUANT_BITS_CHOICES, embed_quant_bits=QUANT_BITS_CHOICES, compressor=tuple(COMPRESSORS),
                       sidecar_bytes=("check", "trust"))
        positive = ("train_batch_tokens", "logit_softcap", "rope_base", "train_seq_len", "val_batch_size", "vocab_size",
                    "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult", "muon_backend_steps",
                    "gptq_calib_seqs")
        checks = [(values[name] <= 0, f"{name.upper()}={values[name]} must be positive") for name in positive]
        checks += [(value < 0, f"{name.upper()}={value} must be >= 0")  # 0 turns many settings off
                   for name, value in values.items() if type(value) in (int, float)]
        checks += [(values[name] not in allowed, f"{name.upper()}={values[name]!r} must be one of "
                    f"{', '.join(map(str, allowed))}") for name, allowed in choices.items()]
        checks += [
            (self.num_layers < 2, f"NUM_LAYERS={self.num_layers}: the U-Net pairs blocks, so use 2 or more"),
            (self.vocab_size > 65_536, f"VOCAB_SIZE={self.vocab_size}: the uint16 shards hold at most 65536"),
            (self.model_dim % heads, f"MODEL_DIM={self.model_dim}: use a multiple of NUM_HEADS={self.num_heads}"),
            (self.num_heads % max(self.num_kv_heads, 1),
             f"NUM_HEADS={self.num_heads}: use a multiple of NUM_KV_HEADS={self.num_kv_heads} (GQA groups)"),
            (head_dim % 2, f"MODEL_DIM/NUM_HEADS = {head_dim} is odd; RoPE rotates pairs: use an even head dim"),
            (self.compressor in ("brotli", "zpaq") and importlib.util.find_spec(self.compressor) is None,
             f"COMPRESSOR={self.compressor} needs its package: pip install {self.compressor}"),
            (self.eval_stride > window, f"EVAL_STRIDE={self.eval_stride}: at most the eval window {window}"),
            (self.max_wallclock_seconds and self.gptq_reserve_seconds >= self.max_wallclock_seconds,
             f"GPTQ_RESERVE_SECONDS={self.gptq_reserve_seconds}: leaves no time of MAX_WALLCLOCK_SECONDS"),
            (bool(self.gptq_reserve_seconds) != (self.gptq and self.max_wallclock_seconds > 0),
             f"GPTQ_RESERVE_SECONDS={self.gptq_reserve_seconds}: calibration on training data must fit the wallclock "
             "budget: with GPTQ=1 and MAX_WALLCLOCK_SECONDS set, reserve seconds for it, else none"),
            (self.ema_decay >= 1.0, f"EMA_DECAY={self.ema_decay} must be in [0, 1); 0 is off, 0.997 typical"),
            *[(values[name] > 1.0, f"{name.upper()}={values[name]} must be in [0, 1]")
              for name in ("loop_start_frac", "warmdown_frac", "min_lr_scale")],
            (self.rope_dims % 2 or self.rope_dims > head_dim, f"ROPE_DIMS={self.rope_dims}: even, at most {head_dim}"),
            (self.loop_repeats and not self.loop_start <= self.loop_end < self.num_layers,
             f"LOOP_START={self.loop_start} LOOP_END={self.loop_end}: need 0 <= start <= end < NUM_LAYERS"),
            (self.parallel_from and self.loop_repeats and self.parallel_from <= self.loop_end,
             f"PARALLEL_FROM={self.parallel_from} must come after the looped layers (LOOP_END={self.loop_end})"),
            (self.xsa_last_n > self.num_layers or self.parallel_from >= self.num_layers,
             f"XSA_LAST_N={self.xsa_last_n} / PARALLEL_FROM={self.parallel_from}: layers among NUM_LAYERS"),
            (self.bigram_buckets == 1 or (self.bigram_buckets and not self.bigram_dim),
             f"BIGRAM_BUCKETS={self.bigram_buckets}: 0, or 2+ (one is 'no previous token') with BIGRAM_DIM > 0")]
        for bad, message in checks:
            if bad:
                raise ConfigError(message)

ENV_NAMES = [f.name.upper() for f in fields(Hyperparameters)]  # each setting's environment variable

# The field's names (its ten best entries') for settings that mean the same here, so a record's command runs
# as there; FIELD_AS_OURS: their switches at values that do what this file does; FIELD_LACKS: the rest (prefixes).
FIELD_NAMES = dict(
    TTT_ENABLED="TTT", NUM_LOOPS="LOOP_REPEATS", ENABLE_LOOPING_AT="LOOP_START_FRAC", MIN_LR="MIN_LR_SCALE",
    PARALLEL_START_LAYER="PARALLEL_FROM", MATRIX_BITS="QUANT_BITS", EMBED_BITS="EMBED_QUANT_BITS",
    MATRIX_CLIP_SIGMAS="QUANT_SIGMAS", ATTN_CLIP_SIGMAS="ATTN_QUANT_SIGMAS", MLP_CLIP_SIGMAS="MLP_QUANT_SIGMAS",
    EMBED_CLIP_SIGMAS="EMBED_QUANT_SIGMAS", MUON_ROW_NORMALIZE="MUON_ROW_NORM", ADAM_WD="SCALAR_WD",
    VAL_BATCH_TOKENS="VAL_BATCH_SIZE", SKIP_GATES_ENABLED="SKIP_GATES", SMEAR_GATE_ENABLED="SMEAR_GATE",
    SPARSE_ATTN_GATE_ENABLED="ATTN_GATE", ARTIFACT_DIR="LOG_DIR", DATASETS_DIR="DATA_PATH")
FIELD_AS_OURS = dict(GATE_WINDOW="12", SPARSE_ATTN_GATE_SCALE="0.5", GATED_ATTN_QUANT_GATE="1",
                     ROPE_YARN="0", PARALLEL_FINAL_LANE="mean", CASEOPS_ENABLED="1", FUSED_CE_ENABLED="1",
                     LQER_ASYM_GROUP="64", TIE_EMBEDDINGS="1", LQER_ASYM_ENABLED="1", LQER_FACTOR_BITS="4")
RETIRED = ("QAT_START_FRAC", "SAMPLE_EVERY", "TTT_PARAMS", "GPTQ_CALIB", "GPTQ_TEMPERATURE", "GPTQ_DAMP",
           "TIE_EMBEDDINGS", "EMBED_LR", "HEAD_LR")  # ours, retired 2026-11-24 (README): refused, never ignored
FIELD_LACKS = ("TTT_ PHASED_TTT_ GLOBAL_TTT_ GPTQ_CALIBRATION_BATCHES GATE ATTN_OUT_GATE SPARSE_ATTN_GATE_ WD_TAPER "
               "EMBEDDING_DIM ROPE_ PARALLEL_ LQER_ CASEOPS_ FUSED_CE_ SLIDING_WINDOW_ VAL_DOC_FRACTION PREQUANT_ONLY "
               "EVAL_ONLY TTT_ONLY SKIP_POST_TRAIN_EVAL TRAIN_FILES VAL_FILES").split() + list(RETIRED)

def with_field_names(environ) -> dict:
    """environ with the field's names as ours (DATA_DIR: two paths); refuses, at once, all we lack."""
    ours, refused = dict(environ), []
    if ours.get("LQER_ENABLED") in ("0", "1"):  # the field's switch: on at LQER_RANK (its default: 4), or off
        ours["LQER_RANK"] = environ.get("LQER_RANK", "4") if ours.pop("LQER_ENABLED") == "1" else "0"
    if "DATA_DIR" in environ:  # the two paths, as the field derives them
        root, vocab = environ["DATA_DIR"], environ.get("VOCAB_SIZE", "1024")
        ours.setdefault("DATA_PATH", f"{root}/datasets/fineweb10B_sp{vocab}")
        ours.setdefault("TOKENIZER_PATH", f"{root}/tokenizers/fineweb_{vocab}_bpe.model")
    for name, value in list(ours.items()):
        target, typo = FIELD_NAMES.get(name), difflib.get_close_matches(name, ENV_NAMES, 1, 0.9)
        if name in ENV_NAMES or FIELD_AS_OURS.get(name) == value.strip():
            continue
        if target and ours.setdefault(target, value) != value:
            refused.append(f"{name}={value} and {target}={ours[target]} disagree; set only one of them")
        elif typo and not target:  # else silently ignored
            refused.append(f"{name}={value}: not a setting; did you mean {typo[0]}?")
        elif not target and name.startswith(tuple(FIELD_LACKS)):
            refused.append(f"{name}={value}: " + ("retired (README, \"Retired settings\")" if name in RETIRED else
                           "document-LoRA and phased TTT are not here: TTT=1 is full-parameter SGD over chunks, as "
                           "the field's GLOBAL_TTT_*" if "TTT" in name else "not here at that value"))
    if refused:
        raise ConfigError("settings that this file does not honour (ours: python train_gpt.py "
                          "--help; the README's \"Commands from the field\"):\n  " + "\n  ".join(refused))
    return ours

def _parse_env_value(name: str, raw: str, default):
    text, kind = raw.strip(), type(default)
    try:
        if kind is bool:
            return {"1": True, "true": True, "0": False, "false": False}[text.lower()]
        return kind(text) if kind in (int, float) else text
    except (KeyError, ValueError):
        what, example = {bool: "0 or 1", int: "an integer", float: "a number"}[kind], int(default) if kind is bool else default
        raise ConfigError(f"{name}={raw!r} is not {what}; set it like {name}={example}") from None

@dataclass
class Layout:  # where this process sits: ranks, device, accumulation, numeric modes
    rank: int
    world_size: int
    local_rank: int
    distributed: bool
    device: torch.device
    grad_accum_steps: int
    use_compile: bool
    use_bf16: bool

def resolve_grad_accum(hp: Hyperparameters, world_size: int) -> int:
    if hp.grad_accum_steps == 0 and 8 % world_size:
        raise ConfigError(f"world size {world_size} does not divide 8; launch 1, 2, 4 or 8 processes "
                          "(--nproc_per_node), or set GRAD_ACCUM_STEPS explicitly")
    accum = hp.grad_accum_steps or 8 // world_size
    per_micro = world_size * accum * hp.train_seq_len
    if hp.train_batch_tokens % per_micro:
        raise ConfigError(f"TRAIN_BATCH_TOKENS={hp.train_batch_tokens} does not split into whole sequences: use a "
                          f"multiple of world_size*GRAD_ACCUM_STEPS*TRAIN_SEQ_LEN = {per_micro}")
    if hp.val_batch_size < per_micro:
        raise ConfigError(f"VAL_BATCH_SIZE={hp.val_batch_size} gives each rank less than one sequence per batch; "
                          f"use at least world_size*grad_accum_steps*TRAIN_SEQ_LEN = {per_micro}")
    window = hp.eval_seq_len or hp.train_seq_len
    if hp.ttt and (not hp.ttt_chunk_tokens or hp.ttt_chunk_tokens % (world_size * window)):
        raise ConfigError(f"TTT_CHUNK_TOKENS={hp.ttt_chunk_tokens} must split into as many eval windows of "
                          f"{window} tokens on each of the {world_size} ranks")
    return accum

# ---- DEVICE ----
def pick_device(local_rank: int, choice: str = "auto") -> torch.device:
    """The one place that chooses hardware: DEVICE, or (auto) CUDA if there is one, else the CPU."""
    cuda = choice == "cuda" or (choice == "auto" and torch.cuda.is_available())
    return torch.device("cuda", local_rank) if cuda else torch.device("cpu")

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":  # CPU work is already done when the call returns
        torch.cuda.synchronize()

# Dense bf16 peak per GPU, for MFU. Unknown GPUs get no MFU field rather than a made-up one.
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}

def peak_flops(device: torch.device) -> float | None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU"
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)

# ---- MUON OPTIMIZER ----
# One (a, b, c) per Newton-Schulz iteration, the last repeated. The fixed quintic leaves singular values in
# ~[0.7, 1.2] (Keller Jordan, modded-nanogpt); Polar Express (Amsel et al. 2025) narrows the band fastest.
QUINTIC_COEFFS = ((3.4445, -4.7750, 2.0315),)
POLAR_EXPRESS_COEFFS = ((8.1566, -22.4833, 15.8788), (4.0429, -2.8089, 0.5000), (3.8917, -2.7725, 0.5061),
                        (3.2858, -2.3681, 0.4645), (2.3465, -1.7098, 0.4232))

def zeropower_via_newtonschulz5(G: Tensor, steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16,
                                coeffs=QUINTIC_COEFFS) -> Tensor:
    """Approximately orthogonalize G (singular values to ~1): X <- aX + (bA + cA^2)X, A = XX^T."""
    X = G.to(dtype)
    transposed = X.size(0) > X.size(1)  # iterate on the wide orientation: X @ X.T is the smaller Gram matrix
    X = (X.T if transposed else X) / (X.norm() + eps)
    for i in range(steps):
        a, b, c = coeffs[min(i, len(coeffs) - 1)]
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if transposed else X

class Muon(torch.optim.Optimizer):
    """Nesterov momentum, then orthogonalized updates of 2-D matrices. Every rank keeps every momentum (a
    checkpoint needs rank 0's) but orthogonalizes every world_size-th matrix; one all-reduce shares them. bf16
    updates are fast; fp32 keeps 1 and N processes within float noise (bf16: ~1e-4, from summation order)."""
    def __init__(self, params, lr: float, momentum: float, backend_steps: int, update_dtype=torch.bfloat16,
                 weight_decay: float = 0.0, row_norm: bool = False, coeffs=QUINTIC_COEFFS):
        super().__init__(params, dict(lr=lr, momentum=momentum, backend_steps=backend_steps,
                                      weight_decay=weight_decay))
        self.orthogonalize = zeropower_via_newtonschulz5
        self.update_dtype, self.row_norm, self.coeffs = update_dtype, row_norm, coeffs

    @torch.no_grad()
    def step(self, closure=None):
        distributed = dist.is_available() and dist.is_initialized()
        world_size, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
        for group in self.param_groups:
            params = group["params"]
            updates = torch.zeros(sum(p.numel() for p in params), device=params[0].device, dtype=self.update_dtype)
            views = updates.split([p.numel() for p in params])  # one per matrix
            for i, p in enumerate(params):
                if p.grad is None:
                    continue
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = self.state[p]["momentum_buffer"].mul_(group["momentum"]).add_(p.grad)
                if i % world_size == rank:
                    g = p.grad.add(buf, alpha=group["momentum"])  # Nesterov
                    if self.row_norm:  # equal-norm rows, so no row dominates the orthogonalization
                        g = g / (g.norm(dim=1, keepdim=True) + 1e-7)
                    g = self.orthogonalize(g, steps=group["backend_steps"], dtype=self.update_dtype, coeffs=self.coeffs)
                    g = g * max(1.0, g.size(0) / g.size(1)) ** 0.5  # tall matrices' RMS update comparable
                    views[i].copy_(g.flatten())
            if distributed:
                dist.all_reduce(updates, op=dist.ReduceOp.SUM)
            for p, update in zip(params, views):
                if group["weight_decay"]:  # decoupled: shrinks the weights, so their compressed size too
                    p.mul_(1.0 - group["lr"] * group["weight_decay"])
                p.add_(update.view_as(p).to(p.dtype), alpha=-group["lr"])

# ---- DATA ----
SHARD_MAGIC, SHARD_VERSION, SHARD_HEADER_INTS = 20240520, 1, 256  # the header: 256 little-endian int32
SHARD_HEADER_BYTES = SHARD_HEADER_INTS * 4
BOS_ID = 1  # every document starts with it (CHALLENGE.md, data format)

def shard_tokens(path, vocab_size: int | None = None) -> np.ndarray:
    """One shard (256 int32 header, uint16 tokens), memory-mapped; header, size, (vocab_size) ids checked."""
    path, fix = Path(path), "rebuild or re-download this shard (see data/README.md)"
    if not path.is_file():
        raise ConfigError(f"{path}: not a readable file; {fix}")
    size = path.stat().st_size
    if size < SHARD_HEADER_BYTES:
        raise ConfigError(f"{path}: {size} bytes is shorter than the {SHARD_HEADER_BYTES}-byte shard header; {fix}")
    header = np.fromfile(path, dtype="<i4", count=SHARD_HEADER_INTS)
    if header[0] != SHARD_MAGIC or header[1] != SHARD_VERSION:
        raise ConfigError(f"{path}: magic number {header[0]}, version {header[1]}: not a token shard ({SHARD_MAGIC}, "
                          f"{SHARD_VERSION}). HINT: shards are written by data/shards.py; {fix}")
    num_tokens, expected = int(header[2]), SHARD_HEADER_BYTES + 2 * int(header[2])
    if size != expected:
        raise ConfigError(f"{path}: file is {size} bytes but its header promises {num_tokens} tokens ({expected} bytes): "
                          f"it is {'truncated' if size < expected else 'has trailing bytes'}; {fix}")
    tokens = np.memmap(path, dtype="<u2", mode="r", offset=SHARD_HEADER_BYTES, shape=(num_tokens,))
    if vocab_size is not None and num_tokens and int(tokens.max()) >= vocab_size:
        bad = int(np.argmax(tokens >= vocab_size))
        raise ConfigError(f"{path}: token {bad} is id {int(tokens[bad])}, outside VOCAB_SIZE={vocab_size}: the shard "
                          "was made with another tokenizer; set TOKENIZER_PATH and VOCAB_SIZE to the ones that made it")
    return tokens

def load_shards(pattern: str, what: str, vocab_size: int | None = None, share=(0, 1)) -> list[np.ndarray]:
    """The shards matching pattern, checked (with vocab_size, the ids of share=(rank, world)'s shards)."""
    files = sorted(glob.glob(pattern))
    if not files:
        raise ConfigError(f"DATA_PATH: no {what} shards match {pattern}. {DATA_HINT}")
    shards = [shard_tokens(f, vocab_size if i % share[1] == share[0] else None) for i, f in enumerate(files)]
    if sum(map(len, shards)) == 0:
        raise ConfigError(f"DATA_PATH: the {what} shards matching {pattern} hold no tokens; rebuild the data")
    return shards

class DistributedTokenLoader:
    """The training shards in order, wrapping around; each rank keeps its span (+1) of each global chunk."""
    def __init__(self, pattern: str, rank: int = 0, world_size: int = 1, device=torch.device("cpu")):
        self.shards = load_shards(pattern, "training")
        self.rank, self.world_size, self.device = rank, world_size, device
        self.position = [0, 0]  # [shard, token]: what a checkpoint saves

    def take(self, n: int) -> Tensor:
        chunks = []
        while n > 0:  # ends: setup() checked that the shards hold tokens
            index, pos = self.position
            chunks.append(self.shards[index][pos:pos + n])
            pos, n = pos + len(chunks[-1]), n - len(chunks[-1])
            self.position = [index, pos] if pos < len(self.shards[index]) else [(index + 1) % len(self.shards), 0]
        return torch.from_numpy(np.concatenate(chunks).astype(np.int32))

    def next_batch(self, global_tokens: int, seq_len: int, grad_accum_steps: int) -> tuple[Tensor, Tensor]:
        span = global_tokens // (self.world_size * grad_accum_steps) + 1  # with the last target
        local = self.take(span * self.world_size)[self.rank * span:(self.rank + 1) * span].to(torch.int64)
        if self.device.type == "cuda":
            local = local.pin_memory()  # so the copy below is asynchronous and overlaps compute
        return tuple(t.view(-1, seq_len).to(self.device, non_blocking=True) for t in (local[:-1], local[1:]))  # (B, T)

# ---- TOKENIZER BYTE ACCOUNTING ----
SPACE = "\u2581"  # SentencePiece's space symbol: one byte of text

@dataclass
class Tokenizer:
    """A SentencePiece .model or the byte tokenizer's .json: a codec, per-id tables of the bytes behind."""
    encode: object  # str -> list[int]
    decode: object  # list[int] -> str, the tokenizer's own decoder
    piece_bytes: Tensor  # int64 [V]: bytes of the id's text, each space symbol counted as 1; -1: <unk>, text lost
    leading_space: Tensor  # bool [V]: the piece starts with the space symbol
    no_text: Tensor  # bool [V]: control ids (BOS...): a document starts after one
    dummy_prefix: bool  # the tokenizer adds a space in front of every document, which is not text

def load_tokenizer(tokenizer_path, vocab_size: int) -> Tokenizer:
    path = Path(tokenizer_path)
    if not path.is_file():
        raise ConfigError(f"TOKENIZER_PATH={tokenizer_path} is not a file. {DATA_HINT}")
    try:
        if path.suffix == ".json":  # the challenge's byte tokenizer: ids offset..offset+255 are bytes
            spec = json.loads(path.read_text())
            if spec.get("tokenizer_type") != "pure_byte":
                raise ValueError(f"tokenizer_type {spec.get('tokenizer_type')!r} is not 'pure_byte'")
            offset, size = int(spec["config"]["byte_offset"]), int(spec["vocab_size"])
            kinds, pieces, added = ["byte" if 0 <= i - offset < 256 else "control" for i in range(size)], [""] * size, ""
            encode = lambda text: [b + offset for b in text.encode("utf-8")]
            decode = lambda ids: bytes(i - offset for i in ids if 0 <= i - offset < 256).decode("utf-8", "replace")
        else:
            import sentencepiece as spm
            sp = spm.SentencePieceProcessor(model_file=str(path))
            pieces = [sp.id_to_piece(i) for i in range(sp.vocab_size())]
            kinds = ["control" if sp.is_control(i) else "byte" if sp.is_byte(i) else "unknown" if sp.is_unknown(i)
                     else "text" for i in range(len(pieces))]
            encode, decode, added = sp.encode, sp.decode, sp.normalize("a")  # "\u2581a": a space in front
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"TOKENIZER_PATH={tokenizer_path} cannot be read as a tokenizer ({type(e).__name__}: {e}); "
                          f"it must be a SentencePiece .model or a byte tokenizer .json. {DATA_HINT}") from None
    if len(pieces) != vocab_size:
        raise ConfigError(f"VOCAB_SIZE={vocab_size} does not match TOKENIZER_PATH={tokenizer_path}, which has "
                          f"{len(pieces)} ids; set VOCAB_SIZE={len(pieces)}")
    if kinds[BOS_ID:BOS_ID + 1] != ["control"]:
        raise ConfigError(f"TOKENIZER_PATH={tokenizer_path}: id {BOS_ID}, which starts every document in the shards, "
                          "is not a control id (BOS); train the tokenizer with bos_id=1")
    if added.endswith(SPACE):  # its decoder keeps that space: the bytes would count it as text
        raise ConfigError(f"TOKENIZER_PATH={tokenizer_path} adds a space after every document "
                          "(treat_whitespace_as_suffix), which val_bpb cannot count; train it without that option")
    def per_id(value) -> Tensor:
        return torch.tensor([value(kind, piece) for kind, piece in zip(kinds, pieces)])
    return Tokenizer(encode, decode, per_id(lambda k, p: len(p.encode("utf-8")) - 2 * p.count(SPACE) if k == "text"
                                            else {"byte": 1, "unknown": -1}.get(k, 0)),
                     per_id(lambda k, p: k == "text" and p.startswith(SPACE)), per_id(lambda k, p: k == "control"),
                     added == SPACE + "a")

def token_bytes(tokens: Tensor, tok: Tokenizer) -> Tensor:
    """Bytes of text behind each token: its id's, less the space the tokenizer adds before each document."""
    ids = tokens.long()
    n, control = tok.piece_bytes[ids], tok.no_text[ids]
    if tok.dummy_prefix:
        starts = torch.ones_like(control)
        starts[1:] = control[:-1]
        n -= (tok.leading_space[ids] & starts).long()
    return n

def check_token_bytes(tokens: Tensor, counted: Tensor, tok: Tokenizer, what: str, share=(0, 1), restore=None) -> None:
    """Refuse, naming the document, unless each one's counted bytes equal the UTF-8 bytes it decodes to (less
    an added space the decoder kept); share=(rank, world size) picks this rank's documents."""
    if (counted < 0).any():
        raise ConfigError(f"{what}: token {int((counted < 0).nonzero()[0])} is <unk>, text the tokenizer could not "
                          "write, so its bytes are unknown; use a tokenizer trained with byte_fallback=True")
    ids, sums = tokens.numpy(), np.concatenate(([0], counted.numpy().cumsum()))
    starts = [-1] * (not tok.no_text[tokens[0]]) + tok.no_text[tokens.long()].nonzero().flatten().tolist() + [len(ids)]
    for doc, (a, b) in list(enumerate(zip(starts, starts[1:])))[share[0]::share[1]]:
        text = tok.decode(ids[a + 1:b].tolist())
        text = restore(text) if restore else text
        expected = len(text.replace(SPACE, " ").encode("utf-8")) - (tok.dummy_prefix and text[:1] == SPACE)
        if sums[b] - sums[a + 1] != expected:
            raise ConfigError(f"{what}: document {doc} (tokens {a + 1}..{b}, {text[:40]!r}...) decodes to {expected} "
                              f"bytes but the byte tables count {sums[b] - sums[a + 1]}; this tokenizer writes text "
                              "in a way val_bpb cannot count exactly: please report it with the tokenizer")

# The field's lossless case transform (CaseOps v1) writes lower case, each ASCII word's case an operator before
# it (U+E001 title, U+E002 all caps) or a letter (U+E003 capital next); U+E004 escapes the next char.
CASE_OPERATORS = re.compile("\ue004(.)|\ue001([A-Za-z])|\ue002([A-Za-z]+)|\ue003([A-Za-z])", re.S)

def case_restore(text: str) -> str:  # the original of CaseOps text; text without operators as it is
    return CASE_OPERATORS.sub(lambda m: m[1] or (m[2] or m[3] or m[4]).upper(), text)

def load_validation(data_path: str, seq_len: int, tok: Tokenizer, share=(0, 1), sidecar: str = "check") -> tuple:
    """The validation tokens and the bytes behind each, cut to whole windows of seq_len. A byte sidecar
    (CaseOps) must match the decoded, case-restored text (SIDECAR_BYTES=trust: unchecked, as the field)."""
    pattern = os.path.join(data_path, "fineweb_val_[0-9]*.bin")
    tokens = torch.from_numpy(np.concatenate(load_shards(pattern, "validation", len(tok.piece_bytes))).astype(np.int32))
    files = sorted(glob.glob(os.path.join(data_path, "fineweb_val_bytes_*.bin")))
    counted = torch.from_numpy(np.concatenate([shard_tokens(f) for f in files]).astype(np.int64)) if files else \
        token_bytes(tokens, tok)
    if len(counted) != len(tokens):
        raise ConfigError(f"DATA_PATH={data_path}: the byte sidecar holds {len(counted)} values for {len(tokens)} "
                          "validation tokens; rebuild or re-download both")
    if not (files and sidecar == "trust"):
        check_token_bytes(tokens, counted, tok, f"DATA_PATH={data_path} validation split" + " (its byte sidecar; "
                          "SIDECAR_BYTES=trust scores by it unchecked)" * bool(files), share, files and case_restore)
    usable = ((tokens.numel() - 1) // seq_len) * seq_len  # seq_len: the longer of the train and eval windows
    if usable <= 0 or not counted[1:usable + 1].any():
        raise ConfigError(f"DATA_PATH: the validation split {pattern} holds {tokens.numel()} tokens ({int(counted.sum())} "
                          f"bytes of text), not one window of {seq_len} + 1 with text; lower TRAIN_SEQ_LEN/EVAL_SEQ_LEN "
                          "or build more validation data")
    return tokens[:usable + 1], counted[:usable + 1].to(torch.int16)

# ---- MODEL ----
CONTROL_PARAM_NAMES = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights", "skip_gates", "lane_mix",
                       "smear_gate", "attn_gate")

class CastedLinear(nn.Linear):  # fp32 weights for the optimizer; the matmul in the activations' dtype
    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x.dtype))  # every layer here is bias-free

def rms_norm(x: Tensor) -> Tensor:
    return F.rms_norm(x, (x.size(-1),))

def input_gate(x: Tensor, weight: Tensor, scale: float = 1.0) -> Tensor:
    """sigmoid(scale * w . x[:k]) per row w (width k) of weight: the field's cheap gates. (..., R)"""
    return torch.sigmoid(scale * (x[..., :weight.size(-1)] @ weight.to(x.dtype).T))

def rotary_cos_sin(seq_len: int, rope_dims: int, base: float) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, rope_dims, 2, dtype=torch.float32) / rope_dims))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (T, rope_dims/2)
    return freqs.cos()[None, None], freqs.sin()[None, None]  # (1, 1, T, rope_dims/2)

def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first 2 * cos.size(-1) channels of each head (partial RoPE); the rest pass through."""
    rotated = 2 * cos.size(-1)
    x1, x2 = x[..., :rotated].chunk(2, dim=-1)
    out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out if rotated == x.size(-1) else torch.cat((out, x[..., rotated:]), dim=-1)

class CausalSelfAttention(nn.Module):
    def __init__(self, hp: Hyperparameters, layer: int):
        super().__init__()
        dim, self.num_heads, self.num_kv_heads = hp.model_dim, hp.num_heads, hp.num_kv_heads
        self.head_dim, self.xsa = dim // hp.num_heads, layer >= hp.num_layers - hp.xsa_last_n
        self.c_q = CastedLinear(dim, dim, bias=False)
        self.c_k = CastedLinear(dim, hp.num_kv_heads * self.head_dim, bias=False)
        self.c_v = CastedLinear(dim, hp.num_kv_heads * self.head_dim, bias=False)
        self.proj = CastedLinear(dim, dim, bias=False)
        nn.init.zeros_(self.proj.weight)
        # fp32 tables computed once, not per element inside the kernels; not saved, and not broadcast by DDP
        cos, sin = rotary_cos_sin(max(hp.train_seq_len, hp.eval_seq_len), hp.rope_dims or self.head_dim, hp.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # q and k are RMS-normalized, so attention sharpness is learned here, per head
        self.q_gain = nn.Parameter(torch.full((hp.num_heads,), hp.qk_gain_init, dtype=torch.float32))
        self.attn_gate = nn.Parameter(torch.zeros(hp.num_heads, min(12, dim))) if hp.attn_gate else None  # (H, 12)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.c_k(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.c_v(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        cos, sin = self.rope_cos[:, :, :T], self.rope_sin[:, :, :T]
        q, k = rms_norm(q), rms_norm(k)  # fp32 on CUDA (autocast's rms_norm), as are cos, sin, q_gain
        q = apply_rotary(q, cos, sin) * self.q_gain.to(q.dtype)[None, :, None, None]
        k = apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.num_kv_heads != self.num_heads)  # (B, H, T, hd)
        if self.xsa:  # exclusive self-attention: drop each head's component along its token's own value
            y = y.view(B, self.num_kv_heads, self.num_heads // self.num_kv_heads, T, self.head_dim)
            v_hat = F.normalize(v, dim=-1)[:, :, None]  # (B, Hkv, 1, T, hd): one per query-head group
            y = (y - (y * v_hat).sum(-1, keepdim=True) * v_hat).view(B, self.num_heads, T, self.head_dim)
        if self.attn_gate is not None:  # each head's output times a gate on the token (the field's)
            y = y * input_gate(x, self.attn_gate, 0.5).transpose(1, 2)[..., None].to(y.dtype)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

class MLP(nn.Module):
    def __init__(self, dim: int, mlp_mult: int, leaky_slope: float = 0.0):
        super().__init__()
        self.fc = CastedLinear(dim, mlp_mult * dim, bias=False)
        self.proj = CastedLinear(mlp_mult * dim, dim, bias=False)
        nn.init.zeros_(self.proj.weight)
        self.leaky_slope = leaky_slope

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.leaky_relu(self.fc(x), self.leaky_slope).square())  # slope 0: relu^2

class Block(nn.Module):
    def __init__(self, hp: Hyperparameters, layer: int):
        super().__init__()
        dim = hp.model_dim
        self.attn = CausalSelfAttention(hp, layer)
        self.mlp = MLP(dim, hp.mlp_mult, hp.mlp_leaky_slope)
        self.attn_scale, self.mlp_scale = nn.Parameter(torch.ones(dim)), nn.Parameter(torch.ones(dim))
        # row 0 weighs the residual stream, row 1 the first layer's input (starts as the plain stream)
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(dim), torch.zeros(dim))))
        self.norm_scale = (layer + 1) ** -0.5 if hp.ln_scale else 1.0  # deeper layers add less (LN scale)
        # parallel residuals: per lane, weights of [its residual, attention out, MLP out] (the field's init)
        self.lane_mix = nn.Parameter(torch.tensor([[1.1, 1.0, 1.0]] * 2)) if 0 < hp.parallel_from <= layer else None

    def norm(self, x: Tensor) -> Tensor:
        return rms_norm(x) * self.norm_scale if self.norm_scale != 1.0 else rms_norm(x)

    def forward(self, x: Tensor, x0: Tensor) -> Tensor:
        mix = self.resid_mix.to(x.dtype)
        if self.lane_mix is None:
            x = mix[0] * x + mix[1] * x0
            x = x + self.attn_scale.to(x.dtype) * self.attn(self.norm(x))
            return x + self.mlp_scale.to(x.dtype) * self.mlp(self.norm(x))
        # two lanes x = (2, B, T, C): attention reads lane 0 mixed with x0, the MLP lane 1; each keeps itself
        # (unmixed) and adds both outputs with learned weights (the field's lanes)
        a = self.attn_scale.to(x.dtype) * self.attn(self.norm(mix[0] * x[0] + mix[1] * x0))
        m = self.mlp_scale.to(x.dtype) * self.mlp(self.norm(x[1]))
        w = self.lane_mix.to(x.dtype)[:, :, None, None, None]  # (2, 3, 1, 1, 1)
        return w[:, 0] * x + w[:, 1] * a + w[:, 2] * m

def bigram_hash(idx: Tensor, buckets: int) -> Tensor:
    """(previous, current) -> rows 0..buckets-2 (the field's BigramHash); last row: no previous, or BOS."""
    prev = F.pad(idx[:, :-1], (1, 0))
    rows = torch.bitwise_xor(36313 * idx, 27191 * prev) % (buckets - 1)
    first = torch.arange(idx.size(1), device=idx.device) == 0
    return torch.where(first | (idx == BOS_ID), buckets - 1, rows)

class GPT(nn.Module):
    def __init__(self, hp: Hyperparameters):
        super().__init__()
        self.logit_softcap = hp.logit_softcap
        self.tok_emb = nn.Embedding(hp.vocab_size, hp.model_dim)
        self.bigram = nn.Embedding(hp.bigram_buckets, hp.bigram_dim) if hp.bigram_buckets else None
        self.bigram_proj = CastedLinear(hp.bigram_dim, hp.model_dim, bias=False) if hp.bigram_buckets else None
        if self.bigram is not None:  # ours: a fixed scale, Muon (the field's learned scale, orthogonal
            nn.init.zeros_(self.bigram.weight)  # projection and Adam lost 0.010 bpb in 3 seeds)
        # [lambda, w_1..w_12] of x_t += lambda * sigmoid(w . x_t[:12]) * x_{t-1}; zero: starts as a no-op
        self.smear_gate = nn.Parameter(torch.zeros(1 + min(12, hp.model_dim))) if hp.smear_gate else None
        self.blocks = nn.ModuleList(Block(hp, layer) for layer in range(hp.num_layers))
        # depth recurrence: the order blocks run in once LOOP_START_FRAC of the budget is spent
        loop = list(range(hp.loop_start, hp.loop_end + 1)) * hp.loop_repeats
        self.looped_order = list(range(hp.loop_end + 1)) + loop + list(range(hp.loop_end + 1, hp.num_layers))
        self.looping = False  # plain attribute: torch.compile guards on it (a second graph, primed in warmup)
        if hp.loop_repeats:  # saved with the weights, so a reloaded artifact runs its layers as trained
            self.register_buffer("loop_on", torch.zeros((), dtype=torch.int8))
            self.register_load_state_dict_post_hook(lambda module, _: setattr(module, "looping", bool(module.loop_on)))
        self.parallel_from = hp.parallel_from
        # U-Net over the layers as run: the first half's outputs feed the second half, deepest first
        self.skip_weights = nn.Parameter(torch.ones(len(self.looped_order) // 2, hp.model_dim))
        self.skip_gates = nn.Parameter(torch.zeros_like(self.skip_weights)) if hp.skip_gates else None
        for block in self.blocks if hp.ortho_init else []:  # the field's init; output projections stay zero
            for linear in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.fc):
                nn.init.orthogonal_(linear.weight)
        self.final_norm = nn.RMSNorm(hp.model_dim, elementwise_affine=False)  # GPTQ hooks its output
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=hp.tied_embed_init_std)  # it is the output head too

    def layer_order(self) -> list[int]:
        return self.looped_order if self.looping else list(range(len(self.blocks)))

    def embed(self, idx: Tensor) -> Tensor:
        x = self.tok_emb(idx)  # (B, T, C)
        if self.bigram is not None:
            x = x + 0.05 * self.bigram_proj(self.bigram(bigram_hash(idx, self.bigram.num_embeddings)))
        if self.smear_gate is not None:  # a BOS takes nothing from the document before it
            gate = self.smear_gate[0] * input_gate(x, self.smear_gate[None, 1:])[..., 0] * (idx != BOS_ID)  # (B, T)
            x = x + gate[..., None].to(x.dtype) * F.pad(x[:, :-1], (0, 0, 1, 0))
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        return rms_norm(x)

    def logits(self, idx: Tensor) -> Tensor:
        x = x0 = self.embed(idx)
        order = self.layer_order()
        num_encoder, skips = len(order) // 2, []
        for i, layer in enumerate(order):
            if self.parallel_from and layer == self.parallel_from and x.dim() == 3:
                x = torch.stack((x, x))  # (2, B, T, C): two residual lanes from here on
            if i >= num_encoder and skips:  # U-Net: the deepest encoder output meets the first decoder block
                x = self.add_skip(x, i - num_encoder, skips.pop())
            x = self.blocks[layer](x, x0)
            if i < num_encoder:
                skips.append(x if x.dim() == 3 else x.mean(0))
        x = self.final_norm(x if x.dim() == 3 else x.mean(0))
        logits = F.linear(x, self.tok_emb.weight.to(x.dtype)).float()  # (B, T, V): the tied head
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)

    def add_skip(self, x: Tensor, k: int, skip: Tensor) -> Tensor:
        """x + w * skip, or (SKIP_GATES) lerp(w * skip, x, sigmoid(g)); with two lanes, into lane 0."""
        lane = x[0] if x.dim() == 4 else x
        skip = self.skip_weights[k].to(x.dtype) * skip
        lane = lane + skip if self.skip_gates is None else torch.lerp(skip, lane, torch.sigmoid(self.skip_gates[k]).to(x.dtype))
        return torch.stack((lane, x[1])) if x.dim() == 4 else lane

    def forward(self, idx: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
        logits = self.logits(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)

def set_phase(model: GPT, looping: bool) -> None:  # depth recurrence on or off, also in the artifact's flag
    model.looping = looping
    if hasattr(model, "loop_on"):
        model.loop_on.fill_(int(looping))

def count_flops_per_token(model: GPT, hp: Hyperparameters) -> float:
    """6 per matmul weight as run (loops each time, lookups free) + QK^T and AV, no causal discount (PaLM)."""
    order, extra = model.layer_order(), [model.tok_emb] + ([model.bigram_proj] if model.bigram_proj else [])
    matmuls = sum(p.numel() for m in [model.blocks[i] for i in order] + extra for p in m.parameters())
    return 6 * matmuls + 12 * len(order) * hp.model_dim * hp.train_seq_len

# ---- EVALUATION ----
def metrics(sums: Tensor) -> tuple[float, float]:  # val_loss (nats per token) and val_bpb of score()'s sums
    loss_sum, tokens, num_bytes = sums.tolist()
    return loss_sum / tokens, loss_sum / tokens / math.log(2.0) * tokens / num_bytes

class Progress:
    """A log line at most every `every_s` seconds of a long pass: how far, tokens/s, the time left."""
    def __init__(self, name: str, log, every_s: float = 30.0):
        self.name, self.log, self.every_s = name, log, every_s
        self.t0 = self.last = time.perf_counter()

    def __call__(self, done: int, total: int, tokens: int) -> None:
        now = time.perf_counter()
        if now - self.last >= self.every_s and done:
            self.last, spent, left = now, now - self.t0, (now - self.t0) * (total - done) / done
            self.log(f"progress: {self.name} {done}/{total} tokens/s:{tokens / spent:.0f} left:{left:.0f}s")

@torch.no_grad()
def score(model: nn.Module, val_tokens: Tensor, val_bytes: Tensor, hp: Hyperparameters, layout: Layout,
          sliding: bool = False, span: tuple[int, int] | None = None, progress: Progress | None = None) -> Tensor:
    """Summed loss, tokens and bytes (float64, over ranks) of the targets in span (default: all), in windows
    of seq_len that each score their last stride targets: each once, after seq_len - stride of context."""
    seq_len = (hp.eval_seq_len or hp.train_seq_len) if sliding else hp.train_seq_len
    stride = (hp.eval_stride or seq_len) if sliding else seq_len
    start, stop = span or (0, val_tokens.numel() - 1)
    ends = list(range(max(start + stride, seq_len), stop, stride)) + [stop]  # window k scores ends[k-1]:ends[k]
    scored = torch.tensor([ends[0] - start] + [b - a for a, b in zip(ends, ends[1:])], device=layout.device)
    first, last = (len(ends) * r // layout.world_size for r in (layout.rank, layout.rank + 1))
    # one batch shape per window length, so one compiled graph: the last batch is padded with empty windows
    batch_windows = max(1, hp.val_batch_size // (layout.world_size * layout.grad_accum_steps) // seq_len)
    sums = torch.zeros(3, dtype=torch.float64, device=layout.device)  # loss, tokens, bytes
    for i in range(first, last, batch_windows):
        batch = [min(k, last - 1) for k in range(i, i + batch_windows)]
        windows = torch.stack([val_tokens[ends[k] - seq_len:ends[k] + 1] for k in batch]).to(layout.device, torch.int64)
        x, y = windows[:, :-1], windows[:, 1:]  # (B, T)
        num_bytes = torch.stack([val_bytes[ends[k] - seq_len + 1:ends[k] + 1] for k in batch])
        ks = torch.arange(i, i + batch_windows, device=layout.device)
        num_scored = torch.where(ks < last, scored[ks.clamp(max=last - 1)], 0)  # no host sync
        mask = torch.arange(seq_len, device=layout.device) >= seq_len - num_scored[:, None]  # (B, T)
        with autocast(layout):
            losses = model(x, y, reduction="none").detach().view_as(mask)
        sums += torch.stack([torch.where(mask, losses.double(), 0.0).sum(), mask.sum(), (num_bytes * mask).sum()])
        if progress:  # windows are this rank's; tokens are estimated for all ranks
            done = min(i + batch_windows, last) - first
            progress(done, last - first, done * stride * layout.world_size)
    if layout.distributed:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    return sums.cpu()

def test_time_train(model: nn.Module, val_tokens: Tensor, val_bytes: Tensor, hp: Hyperparameters, layout: Layout,
                    trainer: nn.Module | None = None, progress: Progress | None = None) -> Tensor:
    """Score-first TTT over chunks of TTT_CHUNK_TOKENS: each is scored (sliding with EVAL_STRIDE), then
    trained on for TTT_EPOCHS SGD steps: every prediction depends only on the artifact and earlier tokens.
    trainer: the compiled, DDP-wrapped model (gradients averaged over ranks). Returns sums (chunks, 3)."""
    seq_len, num_targets = hp.eval_seq_len or hp.train_seq_len, val_tokens.numel() - 1
    bounds = list(range(0, num_targets, hp.ttt_chunk_tokens)) + [num_targets]
    sgd = torch.optim.SGD([dict(params=list(model.parameters()), base_lr=hp.ttt_lr)], lr=hp.ttt_lr,
                          momentum=hp.ttt_momentum)
    sums = []
    for c, (a, b) in enumerate(zip(bounds, bounds[1:])):
        sums.append(score(model, val_tokens, val_bytes, hp, layout, hp.eval_stride > 0, (a, b)))
        if progress:
            progress(c + 1, len(bounds) - 1, b)
        if b == num_targets:
            break  # the last chunk: scored, never trained on
        cosine = 0.5 * (1.0 + math.cos(math.pi * c / max(len(bounds) - 2, 1)))  # decays over the chunks trained on
        for _ in range(hp.ttt_epochs):
            train_step(model if trainer is None else trainer, lambda: ttt_rows(val_tokens[a:b + 1], seq_len, layout),
                       [sgd], replace(hp, grad_clip_norm=hp.ttt_grad_clip), replace(layout, grad_accum_steps=1), cosine)
    return torch.stack(sums)

def ttt_rows(chunk: Tensor, seq_len: int, layout: Layout) -> tuple[Tensor, Tensor]:
    """This rank's contiguous block of a chunk's rows: the shape and strides the graph was primed with."""
    chunk = chunk.to(layout.device, torch.int64)
    return tuple(t.view(layout.world_size, -1, seq_len)[layout.rank] for t in (chunk[:-1], chunk[1:]))

def autocast(layout: Layout):
    return torch.autocast(device_type=layout.device.type, dtype=torch.bfloat16, enabled=layout.use_bf16)

# ---- EXPORT: LOW-BIT WEIGHTS + COMPRESSION ----
# Tensors up to this size stay in float: at width 256 the attention matrices (32k-65k) must be quantized too.
KEEP_FLOAT_MAX_NUMEL = 16_384
QUANT_BITS_CHOICES = (4, 5, 6, 7, 8)
# Each row's clip: the fraction of its max |w| with the least error (GPTQ-lite clip search); at low widths,
# clipping outliers buys finer steps. QUANT_SIGMAS=k clips at k row stds (the field's: k ~ 12, fewer bytes).
CLIP_FRACTIONS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6)
COMPRESSORS = {  # name: (compress, decompress, the leading bytes by which the reader recognizes it)
    "zlib": (lambda raw: zlib.compress(raw, level=9), zlib.decompress, b"\x78"),
    "lzma": (lambda raw: lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME), lzma.decompress, b"\xfd7zXZ"),
    "brotli": (lambda raw: b"BROTLI" + importlib.import_module("brotli").compress(raw, quality=11),  # a tag
               lambda blob: importlib.import_module("brotli").decompress(blob[6:]), b"BROTLI"),
    "zpaq": (lambda raw: importlib.import_module("zpaq").compress(raw, level=5, threads=1),  # same bytes
             lambda blob: importlib.import_module("zpaq").decompress(blob), b"7kSt"),
}

def is_quantized(name: str, tensor: Tensor) -> bool:
    """Stored as integers: the large matrices, and the attention gates (int8 rows, as the field's)."""
    big = tensor.ndim == 2 and tensor.numel() > KEEP_FLOAT_MAX_NUMEL
    return tensor.is_floating_point() and (big or name.endswith("attn_gate"))

def quant_spec(name: str, hp: Hyperparameters) -> tuple[int, float]:
    """(bits, clip in row stds; 0: searched clip) of a matrix stored as integers, by its kind."""
    if name == "tok_emb.weight":
        return hp.embed_quant_bits, hp.embed_quant_sigmas
    if name.endswith("attn_gate"):
        return 8, 0.0
    kind = hp.attn_quant_sigmas if ".attn." in name else hp.mlp_quant_sigmas if ".mlp." in name else 0.0
    return hp.quant_bits, kind or hp.quant_sigmas

def quantize_rows(w: Tensor, bits: int, sigmas: float = 0.0) -> tuple[Tensor, Tensor]:
    """Per-row integers in [-qmax, qmax] (as float), fp16 scales (R,): clip searched, or sigmas stds."""
    qmax, absmax = 2 ** (bits - 1) - 1, w.abs().amax(dim=1, keepdim=True)  # (R, 1)
    clips = [sigmas * w.std(dim=1, keepdim=True)] if sigmas else [absmax * f for f in CLIP_FRACTIONS]
    # fp16 scales floored at its smallest normal (no division by 0); float fractions: no host-to-device copy
    scales = (torch.stack(clips) / qmax).clamp(min=2.0 ** -14).half().float()  # (K, R, 1); inf over fp16's
    q = torch.clamp(torch.round(w / scales), -qmax, qmax)  # (K, R, C)
    best = (q * scales - w).square().sum(dim=2).argmin(dim=0)  # (R,)
    rows = torch.arange(w.size(0), device=w.device)
    return q[best, rows], scales[best, rows, 0]

def gptq_quantize(w: Tensor, H: Tensor, bits: int, damp=0.01, sigmas: float = 0.0, block=128) -> tuple[Tensor, Tensor]:
    """GPTQ (Frantar et al. 2022) with quantize_rows's scales, in act order (descending diag H): each
    column's rounding error goes onto later columns via the upper Cholesky factor of H^-1, H damped by damp *
    mean(diag H), as the field does. H = I gives round-to-nearest."""
    qmax, (_, scale) = 2 ** (bits - 1) - 1, quantize_rows(w, bits, sigmas)
    W, H = w.double().clone(), H.double().clone()
    dead = H.diagonal() == 0  # inputs that were always zero: their weights do not matter
    H[dead, dead], W[:, dead] = 1.0, 0.0
    order = torch.argsort(H.diagonal(), descending=True)
    W, H = W[:, order], H[order][:, order]
    H += damp * H.diagonal().mean() * torch.eye(len(H), dtype=H.dtype, device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    s, Q = scale.double()[:, None], torch.zeros_like(W)
    for a in range(0, W.size(1), block):
        b, err = min(a + block, W.size(1)), torch.zeros_like(W[:, a:a + block])  # (R, b - a)
        for j in range(a, b):
            Q[:, j] = torch.clamp(torch.round(W[:, j] / s[:, 0]), -qmax, qmax)
            err[:, j - a] = (W[:, j] - Q[:, j] * s[:, 0]) / U[j, j]
            W[:, j + 1:b] -= err[:, j - a:j - a + 1] @ U[j:j + 1, j + 1:b]
        W[:, b:] -= err @ U[a:b, b:]
    return Q[:, torch.argsort(order)].float(), scale

def quantize_state_dict(state_dict, hp: Hyperparameters, hessians=None) -> dict:
    """Matrices -> per-row integers (quant_spec), a byte each (packed bits hide their distribution from the compressor),
    fp16 scales, GPTQ where hessians has it; other floats fp16, controls fp32. What it cannot hold stops the export."""
    ints, scales, floats, dtypes = {}, {}, {}, {}
    for name, tensor in state_dict.items():
        tensor = stored = tensor.detach().cpu()
        dtypes[name] = str(tensor.dtype).removeprefix("torch.")
        if not tensor.is_floating_point():
            floats[name] = tensor
        elif not is_quantized(name, tensor):
            control = any(key in name for key in CONTROL_PARAM_NAMES)
            stored = floats[name] = tensor.float() if control else tensor.half()
        else:
            bits, sigmas = quant_spec(name, hp)
            q, scale = gptq_quantize(tensor, hessians[name].cpu(), bits, sigmas=sigmas) if name in (hessians or {}) \
                else quantize_rows(tensor.float(), bits, sigmas)
            ints[name], scales[name] = q.to(torch.int8), scale.half()
            stored = scales[name]  # a scale beyond fp16's range is inf
        if not (torch.isfinite(tensor).all() and torch.isfinite(stored).all()):
            raise ConfigError(f"export: {name} holds |w| up to {tensor.abs().max():.4g}: not finite, or beyond fp16's "
                              "65504 in its stored form; no artifact can hold this model: lower the learning rates")
    def field_ints(x: Tensor, bits: int) -> tuple[Tensor, Tensor]:  # LQER's: [-top, top - 1], one scale a row
        top = 2 ** (bits - 1)
        scale = (x.abs().amax(dim=1) / (top - 0.5)).clamp(2.0 ** -14, 65504.0).half()  # absmax / 1.5 or 7.5
        return torch.clamp(torch.round(x / scale.float()[:, None]), -top, top - 1).to(torch.int8), scale
    errors = {name: state_dict[name].detach().cpu().float() - q * scales[name].float()[:, None]
              for name, q in ints.items() if hp.lqer_rank}
    for name in sorted(errors, key=lambda name: -errors[name].norm())[:hp.lqer_top_k]:  # LQER (Zhang et al.)
        U, S, Vh = torch.linalg.svd(errors[name].double(), full_matrices=False)  # error ~ A B: U_r S_r, V_r^T
        A, B = (U[:, :hp.lqer_rank] * S[:hp.lqer_rank]).float(), Vh[:hp.lqer_rank].float().flatten()
        for part, x, bits in (("a", A.reshape(1, -1), 2), ("b", F.pad(B, (0, -len(B) % 64)).view(-1, 64), 4)):
            ints[f"{name}.lqer_{part}"], scales[f"{name}.lqer_{part}"] = field_ints(x, bits)
    return {"format": "int8_rows_v2", "ints": ints, "scales": scales, "floats": floats, "dtypes": dtypes}

def dequantize_state_dict(obj: dict) -> dict[str, Tensor]:
    weights = {name: q.float() * obj["scales"][name].float()[:, None] for name, q in obj["ints"].items()}
    for name in [name for name in weights if name.endswith(".lqer_a")]:  # + A B, LQER's error correction
        W = weights[name.removesuffix(".lqer_a")]
        A, B = weights.pop(name).view(len(W), -1), weights.pop(name[:-1] + "b").flatten()
        W += A @ B[:A.size(1) * W.size(1)].view(A.size(1), W.size(1))
    return {name: weights.get(name, obj["floats"].get(name)).to(getattr(torch, dtype))
            for name, dtype in obj["dtypes"].items()}

def save_artifact(state_dict: dict[str, Tensor], path: Path | None, hp: Hyperparameters, hessians=None) -> bytes:
    """The artifact's bytes, also written to path unless None (whole or not at all: via a renamed temp)."""
    buffer = io.BytesIO()
    torch.save(quantize_state_dict(state_dict, hp, hessians), buffer)
    blob = COMPRESSORS[hp.compressor][0](buffer.getvalue())
    if path is not None:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # nodes sharing the folder rename their own
        tmp.write_bytes(blob)
        os.replace(tmp, path)
    return blob

def load_artifact(source: Path | str | bytes) -> dict[str, Tensor]:
    """An artifact (file or bytes), its compressor told by its first bytes; weights_only: no pickled code."""
    blob = source if isinstance(source, bytes) else Path(source).read_bytes()
    decompress = next((d for _, d, lead in COMPRESSORS.values() if blob.startswith(lead)), None)
    if decompress is None:
        raise ConfigError(f"{'artifact' if isinstance(source, bytes) else source}: its first bytes {blob[:6]!r} are "
                          f"those of no COMPRESSOR ({', '.join(COMPRESSORS)})")
    return dequantize_state_dict(torch.load(io.BytesIO(decompress(blob)), map_location="cpu", weights_only=True))

# ---- LOGGING ----
@dataclass
class RunLog:
    """Console lines from rank 0, mirrored into logs/<RUN_ID>.txt after the script's own source."""
    path: Path | None
    is_main: bool = True  # the other ranks write only their errors

    def write_header(self, source: bytes, hp: Hyperparameters, layout: Layout, command: str) -> None:
        with open(self.path, "xb") as f:  # "x": never overwrite an earlier run's log
            f.write(f"==== train_gpt.py source bytes:{len(source)} sha256:{hashlib.sha256(source).hexdigest()} ====\n"
                    .encode() + source + b"\n==== end of source ====\n")
        for line in [f"versions: python:{platform.python_version()} torch:{torch.__version__}"] + describe_hardware(layout):
            self(line, console=False)
        self(f"command: {command}")
        self(f"hyperparameters: {json.dumps(asdict(hp))}")
        self(f"world_size:{layout.world_size} grad_accum_steps:{layout.grad_accum_steps} "
             f"device:{layout.device.type} compile:{layout.use_compile} bf16:{layout.use_bf16}")

    def __call__(self, message: str, console: bool = True) -> None:
        if self.path is None or not self.is_main:
            return
        if console:
            print(message, flush=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(message + "\n")

    def failure(self, error: BaseException, rank: int) -> None:
        """Whatever ends a run goes into the log with its traceback, from any rank: no log just stops."""
        if self.path is not None and not isinstance(error, SystemExit):  # SystemExit: a stop that said why
            text = f"train_gpt.py: error: {error}" if isinstance(error, ConfigError) else traceback.format_exc()
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(f"error: rank {rank}: {text.rstrip()}\n")

def describe_hardware(layout: Layout) -> list[str]:
    if layout.device.type == "cuda":
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout if shutil.which("nvidia-smi") else ""
        return [f"hardware: cuda: {layout.world_size}x {torch.cuda.get_device_name(layout.device)}"] + smi.splitlines()
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu_name = re.findall(r"^model name\s*: (.*)", cpuinfo, flags=re.M)[:1] or [platform.processor() or platform.machine()]
    return [f"hardware: {layout.device.type}: {cpu_name[0]}, {os.cpu_count()} logical cores, "
            f"{torch.get_num_threads()} torch threads per process x {layout.world_size} processes"]

PACKED_HEAD = b'import lzma as L,base64 as B\nexec(L.decompress(B.b85decode("'

def pack_source(source: bytes) -> bytes:
    """This file as the field counts code: minified, lzma, base85, in a two-line self-extractor."""
    if source.startswith(PACKED_HEAD):
        return source
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node) is not None:
            node.body = node.body[1:] or [ast.Pass()]
    return PACKED_HEAD + base64.b85encode(lzma.compress(ast.unparse(tree).encode(), preset=9 | lzma.PRESET_EXTREME)) + b'")))\n'

def settings_help(markdown: bool = False) -> str:
    """Every setting, its default and meaning: Hyperparameters' own lines, the one copy there is."""
    try:
        source = Path(__file__).read_text().split("class Hyperparameters:", 1)[1].split("    @classmethod", 1)[0]
    except (OSError, IndexError):  # a packed copy has no comments: the readable train_gpt.py has them
        return "this train_gpt.py is packed: run --help with the readable one"
    rows = [m.groups("") for m in re.finditer(r"^    (\w+): \w+ = (.+?)(?:  # (.*))?$", source, flags=re.M)]
    form = "| `{}` | {} | {} |" if markdown else "{:<27} {:<13} {}"
    head = ["| variable | default | meaning |", "|---|---|---|"] if markdown else []
    return "\n".join(head + [form.format(name.upper(), default, meaning) for name, default, meaning in rows])

def launch_command(environ=os.environ) -> str:
    """The command that reproduces this run: the env vars it set (ours and the field's), then the launcher."""
    settings = [f"{name}={shlex.quote(environ[name])}" for name in sorted(environ)
                if name in ENV_NAMES or name in FIELD_NAMES or name == "DATA_DIR"]
    launcher = "python"
    if "LOCAL_WORLD_SIZE" in environ:  # torchrun's; several nodes meet at a c10d rendezvous on the first one
        nodes, per_node = int(environ["WORLD_SIZE"]) // int(environ["LOCAL_WORLD_SIZE"]), environ["LOCAL_WORLD_SIZE"]
        launcher = (f"torchrun --standalone --nproc_per_node={per_node}" if nodes == 1 else f"torchrun --nnodes={nodes} "
                    f"--nproc_per_node={per_node} --rdzv_backend=c10d --rdzv_endpoint=<first node>:29500")
    return " ".join(settings + [f"{launcher} {Path(__file__).name}"])

# ---- CHECKPOINTS ----
MODEL_SHAPE_SETTINGS = ("vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult", "rope_base",
                        "logit_softcap", "mlp_leaky_slope", "rope_dims", "ln_scale", "xsa_last_n", "smear_gate",
                        "bigram_buckets", "bigram_dim", "loop_start", "loop_end", "loop_repeats", "parallel_from",
                        "skip_gates", "attn_gate")

@dataclass
class LoopState:  # where training stands: with weights, optimizer states, data position, all a resume needs
    step: int = 0
    training_time_ms: float = 0.0  # training only: validation and checkpoints are excluded
    elapsed_ms: float = 0.0  # the clock all ranks agreed on after the last step
    loop_active: bool = False

def checkpoint_folders(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first; a .tmp folder is a write that never completed."""
    return sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))

def resolve_resume(hp: Hyperparameters) -> dict | None:
    """Turn RESUME into a checkpoint folder and read its meta, refusing one of another model shape."""
    if not hp.resume:
        return None
    folder = Path(hp.resume)
    if hp.resume == "latest":
        found = checkpoint_folders(Path(hp.checkpoint_dir) / hp.run_id) if hp.run_id else []
        if not found:
            raise ConfigError(f"RESUME=latest: no checkpoint of RUN_ID={hp.run_id!r} in {hp.checkpoint_dir}; set RUN_ID "
                              "to the run to resume")
        folder = found[-1]
    if not (folder / "meta.json").is_file():
        raise ConfigError(f"RESUME={hp.resume}: {folder / 'meta.json'} does not exist; point RESUME at a "
                          "step_NNNNNN folder of a checkpoint, or use RESUME=latest with the run's RUN_ID")
    defaults = asdict(Hyperparameters())  # a checkpoint older than a setting ran its default
    try:  # the tensors are mapped, not read: this finds a damaged file, not a flipped bit
        meta = json.loads((folder / "meta.json").read_text())
        shape = {name: meta["hyperparameters"].get(name, defaults[name]) for name in MODEL_SHAPE_SETTINGS}
        saved = torch.load(folder / "state.pt", map_location="cpu", weights_only=True, mmap=True)
        (index, pos), shards = meta["loader"], sorted(glob.glob(os.path.join(hp.data_path, "fineweb_train_*.bin")))
        if {"model", "adam", "muon", "ema"} - saved.keys() or {"run_id", "source_sha256"} - meta.keys():
            raise ValueError(f"its state.pt holds {sorted(saved)} and its meta.json {sorted(meta)}")
        if not (0 <= index < len(shards) and 0 <= pos <= len(shard_tokens(shards[index]))):
            raise ValueError(f"its data position {meta['loader']} is not in DATA_PATH's training shards")
    except Exception as e:
        raise ConfigError(f"RESUME={folder}: the checkpoint is damaged ({type(e).__name__}: {e}); resume an earlier "
                          "one") from None
    for name, saved in shape.items():
        if saved != getattr(hp, name):
            raise ConfigError(f"RESUME={folder}: the checkpoint has {name.upper()}={saved} "
                              f"but this run has {name.upper()}={getattr(hp, name)}; set it to match")
    newer = [p for p in checkpoint_folders(Path(hp.checkpoint_dir) / hp.run_id) if p.name > folder.name]
    if meta["run_id"] == hp.run_id and newer:  # its next checkpoints would interleave with another history
        raise ConfigError(f"RESUME={folder}: RUN_ID={hp.run_id} already has later checkpoints ({newer[-1].name}); "
                          "resume the newest with RESUME=latest, or continue this one under a new RUN_ID")
    hp.resume = str(folder)
    return meta

def save_checkpoint(hp: Hyperparameters, layout: Layout, model: GPT, adam, muon: Muon, ema, state: LoopState,
                    loader: DistributedTokenLoader, source_sha256: str) -> Path:
    """Rank 0 writes step_N.tmp/, renamed to step_N/ once complete (a killed write leaves the others as
    they were); then local rank 0 of each node that cannot see it writes a copy. Tensors and JSON only."""
    root = Path(hp.checkpoint_dir) / hp.run_id
    folder, tmp = root / f"step_{state.step:06d}", root / f"step_{state.step:06d}.tmp"
    for turn in ("rank 0", "other nodes"):  # the second looks for the folder only after the first wrote it
        if layout.rank == 0 if turn == "rank 0" else layout.local_rank == 0 and layout.rank and not folder.exists():
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            torch.save({"model": model.state_dict(), "adam": adam.state_dict(), "muon": muon.state_dict(),
                        "ema": ema.params if ema else None}, tmp / "state.pt")  # training draws no random numbers
            meta = dict(run_id=hp.run_id, source_sha256=source_sha256, world_size=layout.world_size,
                        loader=loader.position, hyperparameters=asdict(hp), **asdict(state))
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
            stale = [p for p in root.glob("step_*.tmp") if p != tmp]  # writes that were killed halfway
            for old in stale + (checkpoint_folders(root)[:-hp.keep_checkpoints] if hp.keep_checkpoints else []):
                shutil.rmtree(old)
        if layout.distributed:
            dist.barrier()
    return folder

def load_checkpoint(folder: Path, layout: Layout, model: GPT, adam, muon: Muon, ema,
                    loader: DistributedTokenLoader) -> LoopState:
    """Restore a checkpoint into this run, whatever its world size."""
    meta = json.loads((folder / "meta.json").read_text())
    saved = torch.load(folder / "state.pt", map_location=layout.device, weights_only=True)
    model.load_state_dict(saved["model"])
    for opt, key in ((adam, "adam"), (muon, "muon")):  # the states; the LRs are this run's
        opt.load_state_dict({"state": saved[key]["state"], "param_groups": opt.state_dict()["param_groups"]})
    if ema:  # a run that turns the EMA on at the resume starts it from the resumed weights
        torch._foreach_copy_(ema.params, saved["ema"] or [p.detach() for p in model.parameters()])
    loader.position = list(meta["loader"])
    return LoopState(**{f.name: meta.get(f.name, f.default) for f in fields(LoopState)})

class StopSignal:  # a first SIGTERM or SIGINT: finish the step, checkpoint and exit; a second: exit at once
    def __init__(self):
        self.signum, self.first_at = 0, 0.0
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self)

    def __call__(self, signum, frame):
        now = time.monotonic()
        if not self.signum:
            self.signum, self.first_at = signum, now
        elif now - self.first_at > 2.0:  # a scheduler and torchrun may both deliver the first one
            os._exit(128 + signum)

# ---- TRAINING ----
def training_progress(step: int, elapsed_ms: float, hp: Hyperparameters) -> float:  # the budget spent, 0..1
    return max(step / max(hp.iterations, 1), elapsed_ms / hp.budget_ms)

def lr_schedule(step: int, elapsed_ms: float, hp: Hyperparameters) -> float:
    """LR multiplier: 1, then linear to 0 over the last WARMDOWN_FRAC of the budget, or last WARMDOWN_ITERS
    steps (or, under a wallclock cap, their average time, if sooner); floored at MIN_LR_SCALE."""
    if hp.warmdown_frac > 0:
        left = min(1.0, max(1.0 - training_progress(step, elapsed_ms, hp), 0.0) / hp.warmdown_frac)
    else:
        left = min(1.0, max(hp.iterations - step, 0) / hp.warmdown_iters) if hp.warmdown_iters > 0 else 1.0
        if hp.budget_ms < math.inf:  # or over WARMDOWN_ITERS steps' time at the mean step, if sooner
            warmdown_ms = max(hp.warmdown_iters * elapsed_ms / max(step, 1), 1e-9)
            left = min(left, max(hp.budget_ms - elapsed_ms, 0.0) / warmdown_ms)
    return max(left, hp.min_lr_scale)

def muon_momentum(step: int, hp: Hyperparameters) -> float:
    frac = min(step / hp.muon_momentum_warmup_steps, 1.0) if hp.muon_momentum_warmup_steps > 0 else 1.0
    return (1 - frac) * hp.muon_momentum_warmup_start + frac * hp.muon_momentum

class EMA:  # the weights' moving average, updated on device each step; swap() trades it for the live weights
    def __init__(self, model: nn.Module, decay: float):
        self.decay, self.params = decay, [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        torch._foreach_lerp_(self.params, [p.detach() for p in model.parameters()], 1.0 - self.decay)

    @torch.no_grad()
    def swap(self, model: nn.Module) -> None:
        live = [p.detach().clone() for p in model.parameters()]
        torch._foreach_copy_([p.detach() for p in model.parameters()], self.params)
        self.params = live

def build_optimizers(model: GPT, hp: Hyperparameters, layout: Layout) -> tuple[list[torch.optim.Optimizer], Muon]:
    """Muon for the blocks' and bigram projection's matrices; AdamW for the embeddings, vectors and controls."""
    embeddings = [model.tok_emb.weight] + ([model.bigram.weight] if model.bigram is not None else [])
    matrices, scalars = [], []
    for name, p in model.named_parameters():
        if not any(p is e for e in embeddings):
            (matrices if p.ndim == 2 and not any(key in name for key in CONTROL_PARAM_NAMES) else scalars).append(p)
    adam_groups = [dict(params=embeddings, lr=hp.tied_embed_lr, weight_decay=hp.embed_wd),
                   dict(params=scalars, lr=hp.scalar_lr, weight_decay=hp.scalar_wd)]
    adam = torch.optim.AdamW(adam_groups, betas=(hp.beta1, hp.beta2), eps=hp.adam_eps, weight_decay=0.0,
                             fused=layout.device.type == "cuda")
    muon = Muon(matrices, lr=hp.matrix_lr, momentum=hp.muon_momentum, backend_steps=hp.muon_backend_steps,
                update_dtype=torch.bfloat16 if layout.use_bf16 else torch.float32, weight_decay=hp.muon_wd,
                row_norm=hp.muon_row_norm, coeffs=POLAR_EXPRESS_COEFFS if hp.muon_polar else QUINTIC_COEFFS)
    for group in adam.param_groups + muon.param_groups:
        group["base_lr"] = group["lr"]
    return [adam, muon], muon

def train_step(model: nn.Module, next_batch, optimizers, hp: Hyperparameters, layout: Layout, lr_scale: float) -> Tensor:
    """One optimizer step over GRAD_ACCUM_STEPS micro-batches (x, y) = next_batch(); returns the mean loss."""
    total = torch.zeros((), device=layout.device)
    for micro in range(layout.grad_accum_steps):
        if layout.distributed:  # all-reduce gradients only once, after the last micro-step
            model.require_backward_grad_sync = micro == layout.grad_accum_steps - 1
        x, y = next_batch()
        with autocast(layout):
            loss = model(x, y)
        (loss / layout.grad_accum_steps).backward()
        total += loss.detach()
    if hp.grad_clip_norm > 0:
        torch.nn.utils.clip_grad_norm_([p for opt in optimizers for g in opt.param_groups for p in g["params"]],
                                       hp.grad_clip_norm)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * lr_scale
        opt.step()
        opt.zero_grad(set_to_none=True)
    return total / layout.grad_accum_steps

@dataclass
class Run:  # what setup() read and checked, and what the stages of main() share
    hp: Hyperparameters
    layout: Layout
    tokenizer: Tokenizer
    val_tokens: Tensor
    val_bytes: Tensor  # the bytes of text behind each validation token
    log: RunLog | None = None
    model: GPT | None = None  # the plain module: its weights are trained and exported
    compiled: nn.Module | None = None  # the same weights, compiled on CUDA: what evaluates
    trainer: nn.Module | None = None  # the compiled model as DDP wraps it: what trains

def setup(environ=os.environ) -> Run:
    """Every check that can fail (settings, paths, tokenizer, shards, bytes), on every rank, first."""
    hp = Hyperparameters.from_env(environ)
    world_size, rank, local_rank = (int(environ.get(name, default)) for name, default in
                                    (("WORLD_SIZE", 1), ("RANK", 0), ("LOCAL_RANK", 0)))
    accum = resolve_grad_accum(hp, world_size)
    if hp.run_id and (Path(hp.run_id).name != hp.run_id or hp.run_id.startswith(".") or len(hp.run_id) > 200):
        raise ConfigError(f"RUN_ID={hp.run_id!r} names files in LOG_DIR and CHECKPOINT_DIR, so it must be a plain "
                          "name: no '/', not starting with '.', at most 200 characters")
    for name in ("log_dir", "checkpoint_dir"):
        folder = Path(getattr(hp, name))
        existing = next(p for p in (folder, *folder.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            raise ConfigError(f"{name.upper()}={folder}: {existing} is not a writable directory; choose another folder")
    if not Path(hp.data_path).is_dir():
        raise ConfigError(f"DATA_PATH={hp.data_path} is not a directory. {DATA_HINT}")
    tokenizer = load_tokenizer(hp.tokenizer_path, hp.vocab_size)
    load_shards(os.path.join(hp.data_path, "fineweb_train_*.bin"), "training", hp.vocab_size, (rank, world_size))
    val = load_validation(hp.data_path, max(hp.train_seq_len, hp.eval_seq_len), tokenizer, (rank, world_size),
                          hp.sidecar_bytes)  # each rank decodes its share of the documents
    meta = resolve_resume(hp)
    log_path = Path(hp.log_dir) / f"{hp.run_id}.txt"
    if hp.run_id and log_path.exists():  # a resume continues its own log, if the script is still the log's
        same_script = meta and meta["source_sha256"] == hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
        if not (meta and meta["run_id"] == hp.run_id and same_script):
            raise ConfigError(f"RUN_ID={hp.run_id}: {log_path} already exists; choose another RUN_ID or move the "
                              "old log away" + (" (the script changed since the checkpoint)" if meta else ""))
    device = pick_device(local_rank, hp.device)
    layout = Layout(rank, world_size, local_rank, world_size > 1, device, accum,
                    *(setting == "1" if setting != "auto" else device.type == "cuda" for setting in (hp.compile, hp.bf16)))
    return Run(hp, layout, tokenizer, *val)

def init_runtime(hp: Hyperparameters, layout: Layout, source: bytes) -> RunLog:
    """CUDA backends, the process group, one RUN_ID for every rank, and rank 0's log."""
    device = layout.device
    if device.type == "cuda":
        if layout.use_bf16 and hp.model_dim // hp.num_heads > 256:
            raise ConfigError(f"head dim MODEL_DIM/NUM_HEADS = {hp.model_dim // hp.num_heads} is over flash "
                              "attention's 256; use more NUM_HEADS, or BF16=0 (math attention, slow)")
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        for kind, on in (("flash", True), ("cudnn", False), ("mem_efficient", False), ("math", not layout.use_bf16)):
            getattr(torch.backends.cuda, f"enable_{kind}_sdp")(on)  # flash is 16-bit only: math for fp32
    run_id = [hp.run_id or str(uuid.uuid4())]
    if layout.distributed:  # every rank must name the same log and artifact
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
        dist.broadcast_object_list(run_id, src=0)
    hp.run_id = run_id[0]
    Path(hp.log_dir).mkdir(parents=True, exist_ok=True)
    log = RunLog(Path(hp.log_dir) / f"{hp.run_id}.txt", layout.rank == 0)
    if layout.rank != 0:
        return log
    if log.path.exists():  # setup() let it through: a resume continues its own run's log
        log(f"command: {launch_command()}")
    else:
        log.write_header(source, hp, layout, launch_command())
    print(f"logfile: {log.path}")
    return log

def looping_at(progress: float, hp: Hyperparameters) -> bool:  # progress: the spent fraction of the budget
    return hp.loop_repeats > 0 and hp.loop_start_frac < 1.0 and progress >= hp.loop_start_frac

def compiled_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]

def warmup(run: Run, model: nn.Module, next_batch, optimizers) -> None:
    """Compile every phase training reaches, then restore weights and optimizer states: no change."""
    hp = run.hp
    phases = list(dict.fromkeys(looping_at(f, hp) for f in (0.0, hp.loop_start_frac)))
    initial = copy.deepcopy([run.model.state_dict()] + [opt.state_dict() for opt in optimizers])
    for step in range(hp.warmup_steps):
        set_phase(run.model, phases[step * len(phases) // hp.warmup_steps])
        train_step(model, next_batch, optimizers, hp, run.layout, lr_scale=1.0)
        if step + 1 in (1, hp.warmup_steps):
            run.log(f"warmup_step:{step + 1}/{hp.warmup_steps}")
    set_phase(run.model, phases[0])
    for target, state in zip([run.model] + optimizers, initial):
        target.load_state_dict(state)
    if run.layout.use_compile:
        run.log(f"compile: {compiled_graphs()} graphs after warmup, {len(phases)} training phases")

def calibrate(run: Run, loader: DistributedTokenLoader) -> dict[str, Tensor]:
    """GPTQ's H = X^T X of each quantized matrix's inputs (summed over ranks) on GPTQ_CALIB_SEQS rows of the
    next training tokens, never validation's; the head's inputs stand for the tied embedding's."""
    hp, layout, model = run.hp, run.layout, run.model
    t0, seqs = time.perf_counter(), max(1, hp.gptq_calib_seqs // layout.world_size)  # this rank's
    x = loader.next_batch(seqs * hp.train_seq_len * layout.world_size, hp.train_seq_len, 1)[0]
    modules = {f"{name}.weight": m for name, m in model.named_modules()
               if isinstance(m, CastedLinear) and is_quantized(f"{name}.weight", m.weight)}
    modules["tok_emb.weight"] = model.final_norm
    hessians = {}
    def accumulate(module, inputs, output, name):  # a module run twice (depth recurrence) adds both inputs
        x = (output if module is model.final_norm else inputs[0]).flatten(0, -2).double()
        hessians[name] = hessians.get(name, 0) + x.T @ x
    hooks = [m.register_forward_hook(lambda *a, name=name: accumulate(*a, name)) for name, m in modules.items()]
    with torch.no_grad(), autocast(layout):
        for batch in x.split(8):
            model.logits(batch)
    for hook in hooks:
        hook.remove()
    for H in hessians.values() if layout.distributed else []:
        dist.all_reduce(H)
    synchronize(layout.device)  # the clock reads the work done, not the work queued
    run.log(f"gptq: matrices:{len(hessians)} calib:train sequences:{seqs * layout.world_size} "
            f"calibration_time:{1000 * (time.perf_counter() - t0):.0f}ms reserved:{1000 * hp.gptq_reserve_seconds:.0f}ms")
    return hessians

def export_and_score(run: Run, source: bytes, hessians=None) -> None:
    """Export (every rank the same bytes: none waits in a collective), then score what was exported."""
    hp, layout, log = run.hp, run.layout, run.log
    tag = f"int{hp.quant_bits}_{hp.compressor}"  # names the log lines: final_int6_lzma_roundtrip_exact
    path, t_export = Path(hp.log_dir) / f"{hp.run_id}_model.{tag}.ptz", time.perf_counter()
    blob = save_artifact(run.model.state_dict(), path if layout.local_rank == 0 else None, hp, hessians)
    code = pack_source(source) if hp.pack_code else source  # what the record folder's train_gpt.py will be
    log(f"Serialized model {tag.replace('_', '+')}: {len(blob)} bytes")
    log(f"Code size: {len(code)} bytes" + f" (packed from {len(source)}: PACK_CODE=1)" * (code != source))
    log(f"Total submission size {tag.replace('_', '+')}: {len(code) + len(blob)} bytes")
    log(f"artifact: {path.as_posix()} bytes:{len(blob)} sha256:{hashlib.sha256(blob).hexdigest()} "
        f"export_time:{1000 * (time.perf_counter() - t_export):.0f}ms")
    if len(code) + len(blob) > 16_000_000:
        log(f"WARNING: submission is {len(code) + len(blob)} bytes, over the 16,000,000-byte cap: it cannot be a record")
    run.model.load_state_dict(load_artifact(blob), strict=True)  # its loop phase too
    prime_final_graphs(run)
    passes = ["roundtrip"] + ["sliding_window"] * (hp.eval_stride > 0 and (hp.sliding_eval or not hp.ttt))
    times_ms, graphs, scored = {}, compiled_graphs(), (run.compiled, run.val_tokens, run.val_bytes, hp, layout)
    for name in passes + ["ttt"] * hp.ttt:
        synchronize(layout.device)
        t_eval, progress = time.perf_counter(), Progress(f"final_{tag}_{name}", log)
        sums = (test_time_train(*scored, run.trainer, progress).sum(0) if name == "ttt" else
                score(*scored, name != "roundtrip", progress=progress))
        val_loss, val_bpb = metrics(sums)
        synchronize(layout.device)
        times_ms[name] = 1000.0 * (time.perf_counter() - t_eval)
        if not math.isfinite(val_loss):
            raise ConfigError(f"final_{tag}_{name}: val_loss is {val_loss}: the exported model does not score, so the "
                              "run is no submission; lower the learning rates")
        log(f"final_{tag}_{name} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} eval_time:{times_ms[name]:.0f}ms")
        log(f"final_{tag}_{name}_exact val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f}")
    passes_ms = ",".join(f"{name}:{ms:.0f}ms" for name, ms in times_ms.items())
    log(f"final_eval_total eval_time:{sum(times_ms.values()):.0f}ms limit:600000ms passes:{passes_ms}"
        + f" graphs_compiled_inside:{compiled_graphs() - graphs}" * layout.use_compile)

def prime_final_graphs(run: Run) -> None:
    """Compile the final passes' graphs (scoring, TTT's step) before their clocks start, on random tokens."""
    hp, layout, window = run.hp, run.layout, max(run.hp.train_seq_len, run.hp.eval_seq_len)
    if not layout.use_compile:
        return
    tokens = torch.randint(hp.vocab_size, (max(window, hp.ttt_chunk_tokens) + 1,), device=layout.device).int()
    for sliding in {False, hp.eval_stride > 0}:
        score(run.compiled, tokens[:window + 1], torch.zeros_like(tokens[:window + 1]), hp, layout, sliding)
    if hp.ttt:
        rows = lambda: ttt_rows(tokens[:hp.ttt_chunk_tokens + 1], hp.eval_seq_len or hp.train_seq_len, layout)
        train_step(run.trainer, rows, [], replace(hp, grad_clip_norm=0), replace(layout, grad_accum_steps=1), 0)
        run.model.zero_grad(set_to_none=True)

def main() -> None:
    run = setup()
    source = Path(__file__).read_bytes()  # read once: the logged and the counted code are the same bytes
    run.log = init_runtime(run.hp, run.layout, source)
    try:
        train_and_score(run, source)
    except BaseException as error:
        run.log.failure(error, run.layout.rank)
        raise

def train_and_score(run: Run, source: bytes) -> None:
    hp, layout, device, log = run.hp, run.layout, run.layout.device, run.log
    val_tokens, val_bytes = run.val_tokens, run.val_bytes = run.val_tokens.to(device), run.val_bytes.to(device)
    torch.manual_seed(hp.seed)
    train_pattern = os.path.join(hp.data_path, "fineweb_train_*.bin")
    log(f"val_tokens:{val_tokens.numel() - 1} val_bytes:{int(val_bytes[1:].sum())} "
        f"train_shards:{len(glob.glob(train_pattern))}")
    base_model = run.model = GPT(hp).to(device)
    log(f"model_params:{sum(p.numel() for p in base_model.parameters())}")
    optimizers, muon = build_optimizers(base_model, hp, layout)
    compiled = run.compiled = base_model
    if layout.use_compile:
        # training phases x eval shapes; fullgraph fails past it (named cache_size_limit before torch 2.7)
        torch._dynamo.config.cache_size_limit = 64
        torch._dynamo.config.optimize_ddp = hp.optimize_ddp
        compiled = run.compiled = torch.compile(base_model, dynamic=False, fullgraph=True)
        muon.orthogonalize = torch.compile(zeropower_via_newtonschulz5)
    # DDP without buffer broadcast: every rank holds the same RoPE tables and phase flags
    model = run.trainer = DDP(compiled, device_ids=[layout.local_rank] if device.type == "cuda" else None,
                              broadcast_buffers=False) if layout.distributed else compiled
    new_loader = lambda: DistributedTokenLoader(train_pattern, layout.rank, layout.world_size, device)
    batches = lambda loader: lambda: loader.next_batch(hp.train_batch_tokens, hp.train_seq_len, layout.grad_accum_steps)
    warmup(run, model, batches(new_loader()), optimizers)
    loader, state = new_loader(), LoopState()
    ema = EMA(base_model, hp.ema_decay) if hp.ema_decay > 0 else None
    if hp.resume:
        state = load_checkpoint(Path(hp.resume), layout, base_model, optimizers[0], muon, ema, loader)
        log(f"resume: from {hp.resume} at step:{state.step} train_time:{state.training_time_ms:.0f}ms")
    else:  # a phase that starts at 0 is on from the first step
        state.loop_active = looping_at(0.0, hp)
    stop_after_step = state.step if state.elapsed_ms >= hp.budget_ms else None  # spent before the checkpoint
    set_phase(base_model, state.loop_active)
    stop_signal, peak = StopSignal(), peak_flops(device)
    source_sha256, first_step = hashlib.sha256(source).hexdigest(), state.step

    def pause_clock():  # validation and checkpoints do not count as training time
        synchronize(device)
        state.training_time_ms += 1000.0 * (time.perf_counter() - t0)

    synchronize(device)
    t0 = time.perf_counter()
    while True:
        step = state.step
        last_step = step >= hp.iterations or (stop_after_step is not None and step >= stop_after_step)
        validate = hp.val_loss_every > 0 and step % hp.val_loss_every == 0 and (step > first_step or step == 0)
        if last_step or validate:
            pause_clock()
            if ema:
                ema.swap(base_model)  # score the weights that will be exported
            val_loss, val_bpb = metrics(score(compiled, val_tokens, val_bytes, hp, layout))
            if ema:
                ema.swap(base_model)
            log(f"step:{step}/{hp.iterations} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} "
                f"train_time:{state.training_time_ms:.0f}ms step_avg:{state.training_time_ms / max(step, 1):.2f}ms")
            synchronize(device)
            t0 = time.perf_counter()
        if last_step:
            if stop_after_step is not None and step < hp.iterations:
                log(f"stopping_early: wallclock_cap train_time:{state.training_time_ms:.0f}ms step:{step}/{hp.iterations}")
            break
        for group in muon.param_groups:
            group["momentum"] = muon_momentum(step, hp)
        lr_scale = lr_schedule(step, state.elapsed_ms, hp)
        train_loss = train_step(model, batches(loader), optimizers, hp, layout, lr_scale)
        if ema:
            ema.update(base_model)
        state.step = step = step + 1
        state.elapsed_ms = state.training_time_ms + 1000.0 * (time.perf_counter() - t0)
        if hp.train_log_every > 0 and (step <= 10 or step % hp.train_log_every == 0):
            tokens_per_s = hp.train_batch_tokens * step / (state.elapsed_ms / 1000.0)
            mfu = count_flops_per_token(base_model, hp) * tokens_per_s / (peak * layout.world_size) if peak else None
            log(f"step:{step}/{hp.iterations} train_loss:{train_loss.item():.4f} train_time:{state.elapsed_ms:.0f}ms "
                f"step_avg:{state.elapsed_ms / step:.2f}ms tok/s:{tokens_per_s:.0f}" + (f" mfu:{100 * mfu:.1f}%" if mfu else ""))
        # one clock, signal and health verdict for all ranks: the same LR, phase, stop and checkpoints
        agreed = torch.tensor([state.elapsed_ms, stop_signal.signum], dtype=torch.float64, device=device)
        agreed = torch.cat((agreed, (~torch.isfinite(train_loss)).to(agreed)[None]))
        if layout.distributed:
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        state.elapsed_ms, signum, diverged = agreed.tolist()
        signum = int(signum)
        if diverged:
            lrs = ", ".join(f"{g['lr']:.4g}" for opt in optimizers for g in opt.param_groups)
            raise ConfigError(f"training diverged: train_loss is not finite at step:{step} (LR multiplier {lr_scale:.4f}; "
                              f"learning rates {lrs} for the embedding, scalars, [head,] matrices). No artifact was written; "
                              "lower MATRIX_LR / TIED_EMBED_LR / SCALAR_LR or set GRAD_CLIP_NORM, and resume a checkpoint if any")
        if stop_after_step is None and state.elapsed_ms >= hp.budget_ms:
            stop_after_step = step
        looping = looping_at(training_progress(step, state.elapsed_ms, hp), hp)
        run_ends = step >= hp.iterations or stop_after_step is not None  # no phase the model never trained in
        if looping != state.loop_active and not run_ends:
            set_phase(base_model, looping)
            log(f"phase: from step:{step} depth_recurrence:{'on' if looping else 'off'}")
            state.loop_active = looping
        periodic_save = hp.save_every > 0 and (step % hp.save_every == 0 or step in (hp.iterations, stop_after_step))
        if signum or periodic_save:
            pause_clock()
            folder = save_checkpoint(hp, layout, base_model, optimizers[0], muon, ema, state, loader, source_sha256)
            log(f"checkpoint: {folder} step:{state.step} ({signal.Signals(signum).name if signum else 'periodic'})")
            if signum:
                resume = launch_command({**os.environ, "RESUME": str(folder), "RUN_ID": hp.run_id})
                log(f"stopped by {signal.Signals(signum).name} after step:{step}; resume with: {resume}")
                shutdown(layout)
                sys.exit(128 + signum)
            synchronize(device)
            t0 = time.perf_counter()

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # no checkpoint now: a signal stops the export
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if layout.use_compile:
        log(f"compile: {compiled_graphs()} graphs after training")
    if device.type == "cuda":
        log(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 2**20} MiB "
            f"reserved: {torch.cuda.max_memory_reserved() // 2**20} MiB")
    if ema:
        ema.swap(base_model)  # calibration and export see the weights the last validation scored
    export_and_score(run, source, calibrate(run, loader) if hp.gptq else None)
    shutdown(layout)

def shutdown(layout: Layout) -> None:
    if layout.distributed:
        dist.barrier()  # without it, gloo tears down while a peer is still in its last collective
        dist.destroy_process_group()

if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):  # every setting is an environment variable; no other arguments
        print(settings_help(markdown="--markdown" in sys.argv))
        sys.exit(0)
    try:
        main()
    except ConfigError as e:
        sys.exit(f"train_gpt.py: error: {e}")
