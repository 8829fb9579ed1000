"""train_gpt.py: a single-file GPT speedrun trainer for the Parameter Golf challenge.

Trains a small GPT (GQA, RoPE, relu^2 MLP, U-Net skips, tied embeddings; the field's levers as settings)
with Muon and Adam on sharded .bin tokens under a wallclock cap, scores exact tokenizer-agnostic val_bpb,
exports low-bit compressed weights (round-to-nearest or GPTQ), and scores the round-tripped model again,
optionally with score-first test-time training. That artifact plus this file is the submission.

    8xH100:  torchrun --standalone --nproc_per_node=8 train_gpt.py
    1 GPU:   torchrun --standalone --nproc_per_node=1 train_gpt.py  (8 // world_size micro-steps keep the math)
    CPU:     python train_gpt.py   or   torchrun --standalone --nproc_per_node=2 train_gpt.py  (gloo)

Every hyperparameter is an environment variable named after its attribute in upper case
(NUM_LAYERS=11 MLP_MULT=3 torchrun ...). Rank 0 writes logs/<RUN_ID>.txt: this file's source,
versions, hardware, then every console line. Hard cap: 1500 lines.
"""

from __future__ import annotations

import copy
import dataclasses
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
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zlib
from dataclasses import dataclass, fields
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
    # data and run
    data_path: str = "./data/datasets/fineweb10B_sp1024"
    tokenizer_path: str = "./data/tokenizers/fineweb_1024_bpe.model"
    run_id: str = ""  # empty: a random uuid
    seed: int = 1337
    log_dir: str = "logs"
    # validation and logging
    val_batch_size: int = 524_288
    val_loss_every: int = 1000
    train_log_every: int = 200
    # schedule
    iterations: int = 20_000
    warmdown_iters: int = 1200
    warmup_steps: int = 20
    train_batch_tokens: int = 524_288
    train_seq_len: int = 1024
    max_wallclock_seconds: float = 600.0
    grad_accum_steps: int = 0  # 0: 8 // world_size, so 1 and 8 GPUs take the same step
    # model
    vocab_size: int = 1024
    num_layers: int = 9
    num_kv_heads: int = 4
    model_dim: int = 512
    num_heads: int = 8
    mlp_mult: int = 2
    tie_embeddings: bool = True
    rope_base: float = 10_000.0
    logit_softcap: float = 30.0
    qk_gain_init: float = 1.5
    mlp_leaky_slope: float = 0.0  # MLP activation leaky_relu(x, slope)^2; 0: relu^2
    rope_dims: int = 0  # rotate only the first N dims of each head; 0: all
    ln_scale: bool = False  # scale each block's normed inputs by 1/sqrt(layer index + 1)
    xsa_last_n: int = 0  # exclusive self-attention in the last N layers
    smear_gate: bool = False  # gated mix of the previous token's embedding into each token's, never across BOS
    bigram_buckets: int = 0  # hashed (previous, current) token-pair embedding with this many rows; 0: off
    bigram_dim: int = 128
    loop_start: int = 0  # depth recurrence: layers LOOP_START..LOOP_END run 1 + LOOP_REPEATS times ...
    loop_end: int = 0
    loop_repeats: int = 0  # 0: off
    loop_start_frac: float = 0.5  # ... from this fraction of the training budget on
    parallel_from: int = 0  # two residual lanes from this layer on; 0: off
    # optimizer
    embed_lr: float = 0.6
    head_lr: float = 0.008
    tied_embed_lr: float = 0.05
    tied_embed_init_std: float = 0.005
    matrix_lr: float = 0.04
    scalar_lr: float = 0.04
    muon_momentum: float = 0.95
    muon_backend_steps: int = 5
    muon_momentum_warmup_start: float = 0.85
    muon_momentum_warmup_steps: int = 500
    beta1: float = 0.9
    beta2: float = 0.95
    adam_eps: float = 1e-8
    grad_clip_norm: float = 0.0  # 0: off
    muon_wd: float = 0.0  # decoupled weight decay p <- p * (1 - lr * wd) of Muon's matrices,
    embed_wd: float = 0.0  # ... of the embedding(s) (AdamW)
    scalar_wd: float = 0.0  # ... and of the vectors and control tensors (AdamW)
    muon_row_norm: bool = False  # normalize each row of the update before orthogonalizing (MuonEq-R)
    muon_polar: bool = False  # Polar Express per-iteration coefficients instead of the fixed quintic
    warmdown_frac: float = 0.0  # warm down over this fraction of the step or wallclock budget; 0: WARMDOWN_ITERS
    min_lr_scale: float = 0.0  # the LR multiplier's floor at the end of the warmdown
    ema_decay: float = 0.0  # 0: off; else the EMA of the weights is evaluated and exported
    qat_start_frac: float = 1.0  # late QAT from this fraction of the training budget on; 1: never
    # evaluation and export
    eval_seq_len: int = 0  # 0: TRAIN_SEQ_LEN
    eval_stride: int = 0  # 0: non-overlapping windows; else a sliding window scoring STRIDE tokens each
    quant_bits: int = 8  # block matrices
    embed_quant_bits: int = 8
    quant_sigmas: float = 0.0  # > 0: each row's step puts this many standard deviations at the top integer; 0: clip search
    embed_quant_sigmas: float = 0.0
    compressor: str = "zlib"
    gptq: bool = False  # full-Hessian GPTQ export; 0: round-to-nearest with the clip search
    gptq_calib: str = "train"  # calibration inputs: the next training batches, or "selfgen": the model's own samples
    gptq_calib_seqs: int = 64  # ... this many sequences of TRAIN_SEQ_LEN
    gptq_temperature: float = 0.8  # selfgen's sampling temperature
    gptq_damp: float = 0.01  # H += GPTQ_DAMP * mean(diag H) * I
    gptq_reserve_seconds: float = 0.0  # taken from MAX_WALLCLOCK_SECONDS for calibration, which uses training data
    ttt: bool = False  # score-first test-time training on the validation stream after the round trip
    ttt_chunk_tokens: int = 32_768  # each chunk is scored, then trained on
    ttt_lr: float = 0.002  # SGD, cosine-decayed over the chunks
    ttt_momentum: float = 0.9
    ttt_epochs: int = 1  # steps per chunk, each on the whole chunk
    ttt_grad_clip: float = 1.0  # 0: off
    ttt_params: str = "all"  # "all", or "blocks": embeddings and head stay as exported
    # long runs
    save_every: int = 0  # checkpoint every N steps and at the end; 0: only on SIGTERM/SIGINT
    keep_checkpoints: int = 3  # the newest K are kept; 0: all
    checkpoint_dir: str = "checkpoints"  # checkpoints go to CHECKPOINT_DIR/<RUN_ID>/step_NNNNNN/
    resume: str = ""  # a checkpoint folder, or "latest": the newest of RUN_ID
    sample_every: int = 0  # greedy samples of fixed prompts every N steps and at the end; 0: off
    # execution: auto = on for CUDA, off on CPU (exact, and never the slow choice: README, "Measurements")
    compile: str = "auto"
    bf16: str = "auto"

    @classmethod
    def from_env(cls, environ=os.environ) -> "Hyperparameters":
        hp = cls(**{f.name: _parse_env_value(f.name.upper(), environ[f.name.upper()], f.default)
                    for f in fields(cls) if f.name.upper() in environ})
        hp.validate()
        return hp

    @property
    def budget_ms(self) -> float:
        """Training's wallclock budget: the cap less what GPTQ reserves for calibration; inf: no cap."""
        return 1000.0 * (self.max_wallclock_seconds - self.gptq_reserve_seconds) if self.max_wallclock_seconds else math.inf

    @classmethod
    def env_names(cls) -> list[str]:
        return [f.name.upper() for f in fields(cls)]

    def validate(self) -> None:
        """Checks that need only the settings themselves; world size and files come later."""
        for name in ["train_batch_tokens", "logit_softcap", "rope_base", "train_seq_len", "val_batch_size", "vocab_size",
                     "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult", "muon_backend_steps"]:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.upper()}={getattr(self, name)} must be positive")
        for f in fields(self):  # no setting is meaningful below 0; for many, 0 turns them off
            if isinstance(getattr(self, f.name), (int, float)) and getattr(self, f.name) < 0:
                raise ConfigError(f"{f.name.upper()}={getattr(self, f.name)} must be >= 0")
        head_dim, window = self.model_dim // self.num_heads, self.eval_seq_len or self.train_seq_len
        choices = dict(compile=("auto", "0", "1"), bf16=("auto", "0", "1"), quant_bits=QUANT_BITS_CHOICES,
                       embed_quant_bits=QUANT_BITS_CHOICES, compressor=tuple(COMPRESSORS),
                       gptq_calib=("train", "selfgen"), ttt_params=("all", "blocks"))
        package = COMPRESSOR_PACKAGES.get(self.compressor)
        for bad, message in [(getattr(self, name) not in allowed, f"{name.upper()}={getattr(self, name)!r} must be one "
                              f"of {', '.join(map(str, allowed))}") for name, allowed in choices.items()] + [
            (self.num_layers < 2, f"NUM_LAYERS={self.num_layers}: the U-Net pairs encoder and decoder blocks; use at least 2"),
            (self.vocab_size > 65_536, f"VOCAB_SIZE={self.vocab_size} does not fit the uint16 shards; use at most 65536"),
            (self.model_dim % self.num_heads, f"MODEL_DIM={self.model_dim} is not divisible by NUM_HEADS={self.num_heads}; "
                                              f"pick NUM_HEADS among the divisors of {self.model_dim}"),
            (self.num_heads % self.num_kv_heads, f"NUM_HEADS={self.num_heads} is not divisible by NUM_KV_HEADS="
                                                 f"{self.num_kv_heads}; each KV head must serve a whole group of query heads"),
            (head_dim % 2, f"head dim MODEL_DIM/NUM_HEADS = {self.model_dim}/{self.num_heads} = {head_dim} is odd; RoPE "
                           "rotates pairs of channels, so choose an even head dim"),
            (package and importlib.util.find_spec(package) is None,
             f"COMPRESSOR={self.compressor} needs the {package} package: pip install {package}"),
            (self.eval_stride > window, f"EVAL_STRIDE={self.eval_stride} is longer than the eval window {window}; use a "
                                        "stride of at most EVAL_SEQ_LEN"),
            (self.max_wallclock_seconds and self.gptq_reserve_seconds >= self.max_wallclock_seconds,
             f"GPTQ_RESERVE_SECONDS={self.gptq_reserve_seconds} leaves no training time of MAX_WALLCLOCK_SECONDS="
             f"{self.max_wallclock_seconds}"),
            (bool(self.gptq_reserve_seconds) != (self.gptq and self.gptq_calib == "train" and self.max_wallclock_seconds > 0),
             f"GPTQ_RESERVE_SECONDS={self.gptq_reserve_seconds}: calibration on training data must fit the wallclock budget: "
             "with GPTQ=1 GPTQ_CALIB=train and MAX_WALLCLOCK_SECONDS set, reserve seconds for it (e.g. 20), else none"),
            (self.gptq and (not self.gptq_damp or not self.gptq_calib_seqs or not self.gptq_temperature), "GPTQ=1 needs "
             "GPTQ_DAMP > 0 (H must be invertible), GPTQ_CALIB_SEQS > 0, GPTQ_TEMPERATURE > 0 (greedy samples are alike)"),
            (self.ttt and (not self.ttt_chunk_tokens or self.ttt_chunk_tokens % window), f"TTT_CHUNK_TOKENS="
             f"{self.ttt_chunk_tokens} must be a positive multiple of the eval window {window}: chunks train on whole sequences"),
            (self.ema_decay >= 1.0, f"EMA_DECAY={self.ema_decay} must be in [0, 1); 0 turns the EMA off, 0.997 is typical"),
            *[(getattr(self, name) > 1.0, f"{name.upper()}={getattr(self, name)} must be in [0, 1]")
              for name in ("qat_start_frac", "loop_start_frac", "warmdown_frac", "min_lr_scale")],
            (self.rope_dims % 2 or self.rope_dims > head_dim,
             f"ROPE_DIMS={self.rope_dims} must be even and at most the head dim {head_dim}"),
            (self.loop_repeats and not self.loop_start <= self.loop_end < self.num_layers, f"LOOP_START={self.loop_start} "
             f"LOOP_END={self.loop_end}: need 0 <= LOOP_START <= LOOP_END < NUM_LAYERS={self.num_layers}"),
            (self.parallel_from and self.loop_repeats and self.parallel_from <= self.loop_end, f"PARALLEL_FROM="
             f"{self.parallel_from} must come after the looped layers (LOOP_END={self.loop_end}), so each block runs in "
             "one residual mode"),
            (self.xsa_last_n > self.num_layers or self.parallel_from >= self.num_layers, f"XSA_LAST_N={self.xsa_last_n} / "
             f"PARALLEL_FROM={self.parallel_from} must name layers among the NUM_LAYERS={self.num_layers}"),
            (self.bigram_buckets == 1 or (self.bigram_buckets and not self.bigram_dim), f"BIGRAM_BUCKETS="
             f"{self.bigram_buckets} BIGRAM_DIM={self.bigram_dim}: use at least 2 buckets (one is kept for 'no previous "
             "token') and a positive dim, or 0 buckets")]:
            if bad:
                raise ConfigError(message)

def _parse_env_value(name: str, raw: str, default):
    text, kind = raw.strip(), type(default)
    try:
        if kind is bool:
            return {"1": True, "true": True, "0": False, "false": False}[text.lower()]
        return kind(text) if kind in (int, float) else text
    except (KeyError, ValueError):
        what = {bool: "0 or 1", int: "an integer", float: "a number"}[kind]
        example = int(default) if kind is bool else default
        raise ConfigError(f"{name}={raw!r} is not {what}; set it like {name}={example}") from None

@dataclass
class Layout:
    """Where this process sits: ranks, device, accumulation, numeric modes."""
    rank: int
    world_size: int
    local_rank: int
    distributed: bool
    device: torch.device
    grad_accum_steps: int
    use_compile: bool
    use_bf16: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0

def resolve_grad_accum(hp: Hyperparameters, world_size: int) -> int:
    if hp.grad_accum_steps == 0 and 8 % world_size:
        raise ConfigError(f"world size {world_size} does not divide 8; launch 1, 2, 4 or 8 processes "
                          "(--nproc_per_node), or set GRAD_ACCUM_STEPS explicitly")
    accum = hp.grad_accum_steps or 8 // world_size
    per_micro = world_size * accum * hp.train_seq_len
    if hp.train_batch_tokens % per_micro:
        raise ConfigError(f"TRAIN_BATCH_TOKENS={hp.train_batch_tokens} does not split into whole sequences: it must "
                          f"be a multiple of world_size*grad_accum_steps*TRAIN_SEQ_LEN = {world_size}*{accum}*"
                          f"{hp.train_seq_len} = {per_micro}")
    if hp.val_batch_size < per_micro:
        raise ConfigError(f"VAL_BATCH_SIZE={hp.val_batch_size} gives each rank less than one sequence per batch; "
                          f"use at least world_size*grad_accum_steps*TRAIN_SEQ_LEN = {per_micro}")
    if hp.ttt and hp.ttt_chunk_tokens % (world_size * (hp.eval_seq_len or hp.train_seq_len)):
        raise ConfigError(f"TTT_CHUNK_TOKENS={hp.ttt_chunk_tokens} must split into as many eval windows of "
                          f"{hp.eval_seq_len or hp.train_seq_len} tokens on each of the {world_size} ranks")
    return accum

# ---- DEVICE ----
def pick_device(local_rank: int) -> torch.device:
    """The one place that chooses hardware: CUDA, then Apple MPS, then CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")

def synchronize(device: torch.device) -> None:
    if device.type in ("cuda", "mps"):  # CPU work is already done when the call returns
        getattr(torch, device.type).synchronize()

# Dense bf16 peak per GPU, for MFU. Unknown GPUs get no MFU field rather than a made-up one.
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}

def peak_flops(device: torch.device) -> float | None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU"
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)

# ---- MUON OPTIMIZER ----
# One (a, b, c) per Newton-Schulz iteration, the last repeated. The fixed quintic trades exactness for
# speed: singular values land in roughly [0.7, 1.2], which Muon tolerates (Keller Jordan, modded-nanogpt).
# Polar Express (Amsel et al. 2025) picks each iteration's coefficients to shrink the band fastest.
QUINTIC_COEFFS = ((3.4445, -4.7750, 2.0315),)
POLAR_EXPRESS_COEFFS = ((8.1566, -22.4833, 15.8788), (4.0429, -2.8089, 0.5000), (3.8917, -2.7725, 0.5061),
                        (3.2858, -2.3681, 0.4645), (2.3465, -1.7098, 0.4232))

def zeropower_via_newtonschulz5(G: Tensor, steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16,
                                coeffs=QUINTIC_COEFFS) -> Tensor:
    """Approximately orthogonalize G (singular values towards 1): X <- aX + (bA + cA^2)X, A = XX^T, in bf16."""
    X = G.to(dtype)
    transposed = X.size(0) > X.size(1)  # iterate on the wide orientation: X @ X.T is the smaller Gram matrix
    X = (X.T if transposed else X) / (X.norm() + eps)
    for i in range(steps):
        a, b, c = coeffs[min(i, len(coeffs) - 1)]
        A = X @ X.T
        X = a * X + (b * A + c * A @ A) @ X
    return X.T if transposed else X

class Muon(torch.optim.Optimizer):
    """Momentum + Nesterov, then orthogonalized updates for 2-D matrices. Every rank keeps every momentum (cheap;
    a checkpoint needs only rank 0's) but orthogonalizes only every world_size-th matrix; one all-reduce over a
    flat buffer gives every rank all updates. update_dtype bf16 is fast; fp32 keeps 1 and N processes within
    float noise, where bf16 rounding amplifies the different gradient summation order to ~1e-4 in loss."""
    def __init__(self, params, lr: float, momentum: float, backend_steps: int, nesterov: bool = True,
                 update_dtype=torch.bfloat16, weight_decay: float = 0.0, row_norm: bool = False,
                 coeffs=QUINTIC_COEFFS):
        super().__init__(params, dict(lr=lr, momentum=momentum, backend_steps=backend_steps, nesterov=nesterov,
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
                    g = p.grad.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
                    if self.row_norm:  # equal-norm rows, so no row dominates the orthogonalization
                        g = g / (g.norm(dim=1, keepdim=True) + 1e-7)
                    g = self.orthogonalize(g, steps=group["backend_steps"], dtype=self.update_dtype, coeffs=self.coeffs)
                    g = g * max(1.0, g.size(0) / g.size(1)) ** 0.5  # keep tall matrices' RMS update comparable
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
    """One token shard, memory-mapped: 256 little-endian int32 header, then uint16 tokens. Every
    header field and the exact file size are checked, and with vocab_size every token id."""
    path, fix = Path(path), "rebuild or re-download this shard (see data/README.md)"
    if not path.is_file():
        raise ConfigError(f"{path}: not a readable file; {fix}")
    size = path.stat().st_size
    if size < SHARD_HEADER_BYTES:
        raise ConfigError(f"{path}: {size} bytes is shorter than the {SHARD_HEADER_BYTES}-byte shard header; {fix}")
    header = np.fromfile(path, dtype="<i4", count=SHARD_HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise ConfigError(f"{path}: magic number {header[0]} != {SHARD_MAGIC}, so this is not a token shard. "
                          f"HINT: shards are written by data/shards.py; {fix}")
    if header[1] != SHARD_VERSION:
        raise ConfigError(f"{path}: shard version {header[1]} is not the supported version {SHARD_VERSION}; {fix}")
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
    """The shards matching pattern, memory-mapped and checked, with vocab_size every token id of share=(rank, world)."""
    files = sorted(glob.glob(pattern))
    if not files:
        raise ConfigError(f"DATA_PATH: no {what} shards match {pattern}. {DATA_HINT}")
    shards = [shard_tokens(f, vocab_size if i % share[1] == share[0] else None) for i, f in enumerate(files)]
    if sum(map(len, shards)) == 0:
        raise ConfigError(f"DATA_PATH: the {what} shards matching {pattern} hold no tokens; rebuild the data")
    return shards

class DistributedTokenLoader:
    """Walks the (memory-mapped) training shards in order, wrapping around. Every rank reads the same global
    chunk and keeps its own contiguous span of it; the extra token per span supplies the last target."""
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

    def next_span(self, local_tokens: int) -> Tensor:
        span = local_tokens + 1
        return self.take(span * self.world_size)[self.rank * span:(self.rank + 1) * span]

    def next_batch(self, global_tokens: int, seq_len: int, grad_accum_steps: int) -> tuple[Tensor, Tensor]:
        local = self.next_span(global_tokens // (self.world_size * grad_accum_steps)).to(torch.int64)
        if self.device.type == "cuda":
            local = local.pin_memory()  # so the copy below is asynchronous and overlaps compute
        return tuple(t.view(-1, seq_len).to(self.device, non_blocking=True) for t in (local[:-1], local[1:]))  # (B, T)

# ---- TOKENIZER BYTE ACCOUNTING ----
SPACE = "\u2581"  # SentencePiece's space symbol: one byte of text, however the tokenizer wrote it

@dataclass
class Tokenizer:
    """A SentencePiece .model or the 260-id byte tokenizer's .json: a text codec, and per-id tables
    of the UTF-8 bytes each token stands for, with what a document changes about them."""
    encode: object  # str -> list[int]
    decode: object  # list[int] -> str, the tokenizer's own decoder
    piece_bytes: Tensor  # int64 [V]: bytes of the id's text, each space symbol counted as 1; -1: <unk>, text lost
    leading_space: Tensor  # bool [V]: the piece starts with the space symbol
    trailing_space: Tensor  # bool [V]: ... or ends with it
    no_text: Tensor  # bool [V]: control ids (BOS...): a document starts after one
    space_bytes: list[int]  # the ids of the bytes E2 96 81, where a space symbol may arrive as them
    dummy_space: str  # "start" or "end": where the tokenizer adds a space to every document, which is not text

def load_tokenizer(tokenizer_path, vocab_size: int) -> Tokenizer:
    path = Path(tokenizer_path)
    if not path.is_file():
        raise ConfigError(f"TOKENIZER_PATH={tokenizer_path} is not a file. {DATA_HINT}")
    try:
        if path.suffix == ".json":  # the byte tokenizer: ids offset..offset+255 are the bytes, the rest control ids
            spec = json.loads(path.read_text())
            if spec.get("kind") != "byte":
                raise ValueError(f"kind {spec.get('kind')!r} is not 'byte'")
            offset, size = int(spec["byte_offset"]), int(spec["vocab_size"])
            kinds, pieces, added = ["byte" if 0 <= i - offset < 256 else "control" for i in range(size)], [""] * size, ""
            encode = lambda text: [b + offset for b in text.encode("utf-8")]
            decode = lambda ids: bytes(i - offset for i in ids if 0 <= i - offset < 256).decode("utf-8", "replace")
        else:
            import sentencepiece as spm

            sp = spm.SentencePieceProcessor(model_file=str(path))
            pieces = [sp.id_to_piece(i) for i in range(sp.vocab_size())]
            kinds = ["control" if sp.is_control(i) else "byte" if sp.is_byte(i) else "unknown" if sp.is_unknown(i)
                     else "text" for i in range(len(pieces))]
            encode, decode, added = sp.encode, sp.decode, sp.normalize("a")  # "\u2581a": a space added in front
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"TOKENIZER_PATH={tokenizer_path} cannot be read as a tokenizer ({type(e).__name__}: {e}); "
                          f"it must be a SentencePiece .model or a byte tokenizer .json. {DATA_HINT}") from None
    if len(pieces) != vocab_size:
        raise ConfigError(f"VOCAB_SIZE={vocab_size} does not match TOKENIZER_PATH={tokenizer_path}, which has "
                          f"{len(pieces)} ids; set VOCAB_SIZE={len(pieces)}")
    if kinds[BOS_ID:BOS_ID + 1] != ["control"]:
        raise ConfigError(f"TOKENIZER_PATH={tokenizer_path}: id {BOS_ID}, which starts every document in the shards, "
                          "is not a control id (BOS); train the tokenizer with bos_id=1")
    def per_id(value) -> Tensor:
        return torch.tensor([value(kind, piece) for kind, piece in zip(kinds, pieces)])
    byte_ids = {piece: i for i, (kind, piece) in enumerate(zip(kinds, pieces)) if kind == "byte"}
    space_bytes = [byte_ids.get(f"<0x{b:02X}>") for b in SPACE.encode("utf-8")]
    if None in space_bytes or ("text", SPACE) in zip(kinds, pieces):
        space_bytes = []  # then a space symbol is never written as bytes
    return Tokenizer(encode, decode, per_id(lambda k, p: len(p.encode("utf-8")) - 2 * p.count(SPACE) if k == "text"
                                            else {"byte": 1, "unknown": -1}.get(k, 0)),
                     per_id(lambda k, p: k == "text" and p.startswith(SPACE)),
                     per_id(lambda k, p: k == "text" and p.endswith(SPACE)), per_id(lambda k, p: k == "control"),
                     space_bytes, {SPACE + "a": "start", "a" + SPACE: "end"}.get(added, ""))

def token_bytes(tokens: Tensor, tok: Tokenizer) -> Tensor:
    """Bytes of text behind each position of a token stream: the id's, but a space symbol written as its 3
    UTF-8 bytes is 1 byte, and the space the tokenizer adds to each document (the decoder may keep it) 0."""
    ids = tokens.long()
    n, control = tok.piece_bytes[ids], tok.no_text[ids]
    starts, ends = torch.ones_like(control), torch.ones_like(control)
    starts[1:], ends[:-1] = control[:-1], control[1:]
    spaced = torch.zeros_like(control)  # the last of the bytes E2 96 81
    if tok.space_bytes:
        e2, x96, x81 = tok.space_bytes
        spaced[2:] = (ids[:-2] == e2) & (ids[1:-1] == x96) & (ids[2:] == x81)
        n[:-2] -= spaced[2:].long()
        n[1:-1] -= spaced[2:].long()
    if tok.dummy_space == "start":
        n -= (tok.leading_space[ids] & starts).long()
        n[2:] -= (spaced[2:] & starts[:-2]).long()
    elif tok.dummy_space == "end":
        n -= ((tok.trailing_space[ids] | spaced) & ends).long()
    return n

def check_token_bytes(tokens: Tensor, counted: Tensor, tok: Tokenizer, what: str, share=(0, 1)) -> None:
    """Refuse, naming the document, unless each one's counted bytes equal the UTF-8 bytes it decodes to
    (space symbols as spaces; undone: the decoder keeps an added space that bytes or a suffix wrote, and
    in suffix mode drops a real leading space). share=(rank, world size): this rank's part of the documents."""
    if (counted < 0).any():
        raise ConfigError(f"{what}: token {int((counted < 0).nonzero()[0])} is <unk>, text the tokenizer could not "
                          "write, so its bytes are unknown; use a tokenizer trained with byte_fallback=True")
    ids, sums = tokens.numpy(), np.concatenate(([0], counted.numpy().cumsum()))
    starts = [-1] * (not tok.no_text[tokens[0]]) + tok.no_text[tokens.long()].nonzero().flatten().tolist() + [len(ids)]
    for doc, (a, b) in list(enumerate(zip(starts, starts[1:])))[share[0]::share[1]]:
        text = tok.decode(ids[a + 1:b].tolist())
        expected = len(text.replace(SPACE, " ").encode("utf-8"))
        expected -= bool(text) and ((tok.dummy_space == "start" and text[0] == SPACE) or
                                    (tok.dummy_space == "end" and text[-1] in (SPACE, " ")))
        expected += tok.dummy_space == "end" and b > a + 1 and bool(tok.leading_space[ids[a + 1]])
        if sums[b] - sums[a + 1] != expected:
            raise ConfigError(f"{what}: document {doc} (tokens {a + 1}..{b}, {text[:40]!r}...) decodes to {expected} "
                              f"bytes but the byte tables count {sums[b] - sums[a + 1]}; this tokenizer writes text "
                              "in a way val_bpb cannot count exactly: please report it with the tokenizer")

def load_validation(pattern: str, seq_len: int, tok: Tokenizer, share=(0, 1)) -> tuple[Tensor, Tensor]:
    """The validation tokens and the bytes behind each, checked, cut to whole sequences of seq_len targets."""
    tokens = torch.from_numpy(np.concatenate(load_shards(pattern, "validation", len(tok.piece_bytes))).astype(np.int32))
    counted = token_bytes(tokens, tok)
    check_token_bytes(tokens, counted, tok, f"DATA_PATH={Path(pattern).parent} validation split", share)
    usable = ((tokens.numel() - 1) // seq_len) * seq_len  # seq_len: the longer of the train and eval windows
    if usable <= 0 or not counted[1:usable + 1].any():
        raise ConfigError(f"DATA_PATH: the validation split {pattern} holds {tokens.numel()} tokens ({int(counted.sum())} "
                          f"bytes of text), not one window of {seq_len} + 1 with text; lower TRAIN_SEQ_LEN/EVAL_SEQ_LEN "
                          "or build more validation data")
    return tokens[:usable + 1], counted[:usable + 1].to(torch.int16)

# ---- MODEL ----
CONTROL_PARAM_NAMES = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights", "lane_mix", "smear_gate")

class CastedLinear(nn.Linear):
    """Weights stay fp32 for the optimizer; the matmul runs in the activations' dtype. While qat_bits is set
    (late QAT), the weight passes through the export's fake quantization. A plain attribute: torch.compile
    guards on it and compiles a second graph, which warmup primes (set_phase)."""
    qat_bits, qat_sigmas = 0, 0.0

    def forward(self, x: Tensor) -> Tensor:
        w = fake_quantize(self.weight, self.qat_bits, self.qat_sigmas) if self.qat_bits else self.weight
        return F.linear(x, w.to(x.dtype))  # every layer here is bias-free

def rms_norm(x: Tensor) -> Tensor:
    return F.rms_norm(x, (x.size(-1),))

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
    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, rope_base: float, qk_gain_init: float,
                 rope_dims: int = 0, xsa: bool = False, max_seq_len: int = 1024):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.xsa = num_heads, num_kv_heads, xsa
        self.head_dim = dim // num_heads
        self.c_q = CastedLinear(dim, dim, bias=False)
        self.c_k = CastedLinear(dim, num_kv_heads * self.head_dim, bias=False)
        self.c_v = CastedLinear(dim, num_kv_heads * self.head_dim, bias=False)
        self.proj = CastedLinear(dim, dim, bias=False)
        nn.init.zeros_(self.proj.weight)
        # fp32 tables computed once, not per element inside the kernels; not saved, and not broadcast by DDP
        cos, sin = rotary_cos_sin(max_seq_len, rope_dims or self.head_dim, rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # q and k are RMS-normalized, so attention sharpness is learned here, per head
        self.q_gain = nn.Parameter(torch.full((num_heads,), qk_gain_init, dtype=torch.float32))

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.c_k(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.c_v(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        cos, sin = self.rope_cos[:, :, :T], self.rope_sin[:, :, :T]
        q, k = rms_norm(q), rms_norm(k)  # fp32 on CUDA (autocast runs rms_norm in fp32), as are cos, sin, q_gain
        q = apply_rotary(q, cos, sin) * self.q_gain.to(q.dtype)[None, :, None, None]
        k = apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.num_kv_heads != self.num_heads)  # (B, H, T, hd)
        if self.xsa:  # exclusive self-attention: drop each head's component along its token's own value
            y = y.view(B, self.num_kv_heads, self.num_heads // self.num_kv_heads, T, self.head_dim)
            v_hat = F.normalize(v, dim=-1)[:, :, None]  # (B, Hkv, 1, T, hd): one per query-head group
            y = (y - (y * v_hat).sum(-1, keepdim=True) * v_hat).view(B, self.num_heads, T, self.head_dim)
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
        self.attn = CausalSelfAttention(dim, hp.num_heads, hp.num_kv_heads, hp.rope_base, hp.qk_gain_init,
                                        hp.rope_dims, layer >= hp.num_layers - hp.xsa_last_n,
                                        max(hp.train_seq_len, hp.eval_seq_len))
        self.mlp = MLP(dim, hp.mlp_mult, hp.mlp_leaky_slope)
        self.attn_scale = nn.Parameter(torch.ones(dim))
        self.mlp_scale = nn.Parameter(torch.ones(dim))
        # row 0 weighs the residual stream, row 1 the first layer's input (starts as the plain stream)
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(dim), torch.zeros(dim))))
        self.norm_scale = (layer + 1) ** -0.5 if hp.ln_scale else 1.0  # deeper layers add less (LN scale)
        # parallel residuals: per lane, the weights of [its residual, attention out, MLP out]
        self.lane_mix = nn.Parameter(torch.ones(2, 3)) if 0 < hp.parallel_from <= layer else None

    def norm(self, x: Tensor) -> Tensor:
        return rms_norm(x) * self.norm_scale if self.norm_scale != 1.0 else rms_norm(x)

    def forward(self, x: Tensor, x0: Tensor) -> Tensor:
        mix = self.resid_mix.to(x.dtype)
        x = mix[0] * x + mix[1] * x0
        if self.lane_mix is None:
            x = x + self.attn_scale.to(x.dtype) * self.attn(self.norm(x))
            return x + self.mlp_scale.to(x.dtype) * self.mlp(self.norm(x))
        # two lanes x = (2, B, T, C): attention reads lane 0 and the MLP lane 1, side by side
        a = self.attn_scale.to(x.dtype) * self.attn(self.norm(x[0]))
        m = self.mlp_scale.to(x.dtype) * self.mlp(self.norm(x[1]))
        w = self.lane_mix.to(x.dtype)[:, :, None, None, None]  # (2, 3, 1, 1, 1)
        return w[:, 0] * x + w[:, 1] * a + w[:, 2] * m

def bigram_hash(idx: Tensor, buckets: int) -> Tensor:
    """(previous, current) token pairs -> rows 0..buckets-2 (hash from the field's BigramHash); the
    last row stands for 'no previous token': a row's first position, and BOS, so nothing crosses it."""
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
        if self.bigram is not None:
            nn.init.zeros_(self.bigram.weight)
        # [lambda, w_1..w_12] of x_t += lambda * sigmoid(w . x_t[:12]) * x_{t-1}; zero: starts as a no-op
        self.smear_gate = nn.Parameter(torch.zeros(1 + min(12, hp.model_dim))) if hp.smear_gate else None
        self.blocks = nn.ModuleList(Block(hp, layer) for layer in range(hp.num_layers))
        # depth recurrence: the order blocks run in once LOOP_START_FRAC of the budget is spent
        loop = list(range(hp.loop_start, hp.loop_end + 1)) * hp.loop_repeats
        self.looped_order = list(range(hp.loop_end + 1)) + loop + list(range(hp.loop_end + 1, hp.num_layers))
        self.looping = False  # a plain attribute, like CastedLinear.qat_bits
        if hp.loop_repeats:  # saved with the weights, so a reloaded artifact runs its layers as trained
            self.register_buffer("loop_on", torch.zeros((), dtype=torch.int8))
            self.register_load_state_dict_post_hook(lambda module, _: setattr(module, "looping", bool(module.loop_on)))
        self.parallel_from = hp.parallel_from
        # U-Net over the layers as run: the first half's outputs feed the second half, deepest first
        self.skip_weights = nn.Parameter(torch.ones(len(self.looped_order) // 2, hp.model_dim))
        self.final_norm = nn.RMSNorm(hp.model_dim, elementwise_affine=False)  # a module: GPTQ hooks the head's inputs
        self.lm_head = None if hp.tie_embeddings else CastedLinear(hp.model_dim, hp.vocab_size, bias=False)
        if hp.tie_embeddings:
            nn.init.normal_(self.tok_emb.weight, mean=0.0, std=hp.tied_embed_init_std)
        else:
            nn.init.zeros_(self.lm_head.weight)

    def layer_order(self) -> list[int]:
        return self.looped_order if self.looping else list(range(len(self.blocks)))

    def embed(self, idx: Tensor) -> Tensor:
        x = self.tok_emb(idx)  # (B, T, C)
        if self.bigram is not None:
            x = x + 0.05 * self.bigram_proj(self.bigram(bigram_hash(idx, self.bigram.num_embeddings)))
        if self.smear_gate is not None:  # a BOS takes nothing from the document before it
            lam, w = self.smear_gate[0], self.smear_gate[1:]
            gate = lam * torch.sigmoid(x[..., :w.numel()] @ w) * (idx != BOS_ID)  # (B, T)
            x = x + gate[..., None] * F.pad(x[:, :-1], (0, 0, 1, 0))
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        return rms_norm(x)

    def logits(self, idx: Tensor) -> Tensor:
        x = x0 = self.embed(idx)
        order = self.layer_order()
        num_encoder, skips = len(order) // 2, []
        for i, layer in enumerate(order):
            if i >= num_encoder and skips:  # U-Net: the deepest encoder output meets the first decoder block
                x = x + self.skip_weights[i - num_encoder].to(x.dtype) * skips.pop()
            if self.parallel_from and layer == self.parallel_from:
                x = torch.stack((x, x))  # (2, B, T, C): two residual lanes from here on
            x = self.blocks[layer](x, x0)
            if i < num_encoder:
                skips.append(x if x.dim() == 3 else x.mean(0))
        x = self.final_norm(x if x.dim() == 3 else x.mean(0))
        head = self.tok_emb if self.lm_head is None else self.lm_head
        logits = F.linear(x, head.weight.to(x.dtype)).float()  # (B, T, V)
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)

    def forward(self, idx: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
        logits = self.logits(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)

def set_phase(model: GPT, looping: bool, qat_bits: int, qat_sigmas: float = 0.0) -> None:
    """Turn depth recurrence and late QAT (fake quantization of the matrices the export quantizes) on or off."""
    model.looping = looping
    if hasattr(model, "loop_on"):
        model.loop_on.fill_(int(looping))
    for m in model.modules():
        if isinstance(m, CastedLinear):
            m.qat_bits, m.qat_sigmas = (qat_bits if is_quantized(m.weight) else 0), qat_sigmas

def count_flops_per_token(model: GPT, hp: Hyperparameters) -> float:
    """6 per weight of every matmul as run (looped blocks each time; the head, or the tied embedding once as
    the head; lookups are free), plus attention's QK^T and AV without a causal discount (PaLM appendix B)."""
    order, extra = model.layer_order(), [model.tok_emb] + ([model.bigram_proj] if model.bigram_proj else [])
    matmuls = sum(p.numel() for m in [model.blocks[i] for i in order] + extra for p in m.parameters())
    return 6 * matmuls + 12 * len(order) * hp.model_dim * hp.train_seq_len

# ---- EVALUATION ----
def evaluate(model: nn.Module, val_tokens: Tensor, val_bytes: Tensor, hp: Hyperparameters, layout: Layout,
             sliding: bool = False) -> tuple[float, float]:
    """val_loss (nats per token) and val_bpb of the validation split."""
    return metrics(score(model, val_tokens, val_bytes, hp, layout, sliding))

def metrics(sums: Tensor) -> tuple[float, float]:
    loss_sum, tokens, num_bytes = sums.tolist()
    return loss_sum / tokens, loss_sum / tokens / math.log(2.0) * tokens / num_bytes

@torch.no_grad()
def score(model: nn.Module, val_tokens: Tensor, val_bytes: Tensor, hp: Hyperparameters, layout: Layout,
          sliding: bool = False, span: tuple[int, int] | None = None) -> Tensor:
    """Summed loss, tokens and bytes (float64, over ranks) of the validation targets in span (default: all), in
    windows of seq_len tokens, each scoring the targets after the previous one's: every token once, with at least
    seq_len - stride tokens of context outside the first window (plain: stride = seq_len)."""
    seq_len = (hp.eval_seq_len or hp.train_seq_len) if sliding else hp.train_seq_len
    stride = (hp.eval_stride or seq_len) if sliding else seq_len
    start, stop = span or (0, val_tokens.numel() - 1)
    ends = list(range(max(start + stride, seq_len), stop, stride)) + [stop]  # window k scores ends[k-1]..ends[k]
    scored = torch.tensor([ends[0] - start] + [b - a for a, b in zip(ends, ends[1:])], device=layout.device)
    first, last = (len(ends) * r // layout.world_size for r in (layout.rank, layout.rank + 1))
    # one batch shape, so one compiled eval graph: the last batch is padded with windows that score nothing
    batch_windows = max(1, hp.val_batch_size // (layout.world_size * layout.grad_accum_steps) // seq_len)
    batch_windows = min(batch_windows, -(-(len(range(seq_len, val_tokens.numel() - 1, stride)) + 1) // layout.world_size))
    acc = torch.device("cpu") if layout.device.type == "mps" else layout.device  # MPS has no float64
    sums = torch.zeros(3, dtype=torch.float64, device=acc)  # loss, tokens, bytes
    was_training = model.training
    model.eval()
    for i in range(first, last, batch_windows):
        batch = [min(k, last - 1) for k in range(i, i + batch_windows)]
        windows = torch.stack([val_tokens[ends[k] - seq_len:ends[k] + 1] for k in batch]).to(layout.device, torch.int64)
        x, y = windows[:, :-1], windows[:, 1:]  # (B, T)
        num_bytes = torch.stack([val_bytes[ends[k] - seq_len + 1:ends[k] + 1] for k in batch])
        ks = torch.arange(i, i + batch_windows, device=layout.device)
        num_scored = torch.where(ks < last, scored[ks.clamp(max=last - 1)], 0)  # no host sync
        mask = torch.arange(seq_len, device=layout.device) >= seq_len - num_scored[:, None]  # (B, T): the last num_scored
        with autocast(layout):
            losses = model(x, y, reduction="none").detach().view_as(mask)
        losses, mask, num_bytes = (t.to(acc) for t in (losses, mask, num_bytes))
        sums[0] += torch.where(mask, losses.double(), 0.0).sum()
        sums[1] += mask.sum()
        sums[2] += (num_bytes * mask).sum()
    if layout.distributed:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    model.train(was_training)
    return sums.cpu()

def test_time_train(model: nn.Module, val_tokens: Tensor, val_bytes: Tensor, hp: Hyperparameters, layout: Layout,
                    trainer: nn.Module | None = None) -> Tensor:
    """Score-first TTT, one pass left to right over chunks of TTT_CHUNK_TOKENS: each chunk is scored as score()
    scores (sliding with EVAL_STRIDE), then the model takes TTT_EPOCHS SGD steps on the tokens just scored; the
    last chunk is never trained on. So every prediction depends only on the artifact and earlier tokens.
    trainer: the compiled, DDP-wrapped model (gradients averaged over ranks; no truth value). Returns sums (chunks, 3)."""
    seq_len, num_targets = hp.eval_seq_len or hp.train_seq_len, val_tokens.numel() - 1
    bounds = list(range(0, num_targets, hp.ttt_chunk_tokens)) + [num_targets]
    adapted = [p for name, p in model.named_parameters() if hp.ttt_params == "all" or "blocks." in name]
    sgd = torch.optim.SGD([dict(params=adapted, base_lr=hp.ttt_lr)], lr=hp.ttt_lr, momentum=hp.ttt_momentum)
    step_hp, step_layout = dataclasses.replace(hp, grad_clip_norm=hp.ttt_grad_clip), dataclasses.replace(layout,
                                                                                                        grad_accum_steps=1)
    sums = []
    for c, (a, b) in enumerate(zip(bounds, bounds[1:])):
        sums.append(score(model, val_tokens, val_bytes, hp, layout, hp.eval_stride > 0, (a, b)))
        if b == num_targets:
            break  # the last chunk: scored, never trained on
        chunk = val_tokens[a:b + 1].to(layout.device, torch.int64)
        x, y = (t.view(-1, seq_len)[layout.rank::layout.world_size] for t in (chunk[:-1], chunk[1:]))
        for _ in range(hp.ttt_epochs):  # cosine decay over the chunks trained on
            train_step(model if trainer is None else trainer, lambda: (x, y), [sgd], step_hp, step_layout,
                       0.5 * (1.0 + math.cos(math.pi * c / max(len(bounds) - 2, 1))))
    return torch.stack(sums)

def autocast(layout: Layout):
    return torch.autocast(device_type=layout.device.type, dtype=torch.bfloat16, enabled=layout.use_bf16)

# ---- EXPORT: LOW-BIT WEIGHTS + COMPRESSION ----
# Tensors up to this size stay in float. Every matrix of the 9x512 default is far larger; at width
# 256 the attention matrices (32k-65k) must be quantized too, or they dominate the artifact.
KEEP_FLOAT_MAX_NUMEL = 16_384
QUANT_BITS_CHOICES = (4, 5, 6, 7, 8)
# Each row's clip is the fraction of its max |w| below with the least reconstruction error: at low
# widths, clipping a few outliers buys finer steps for everything else (GPTQ-lite clip search). QUANT_SIGMAS=k
# clips at k row stds instead (the field's): at k ~ 12, wider than the max, so fewer bytes and more error.
CLIP_FRACTIONS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6)
COMPRESSORS = {  # name: (compress, decompress, the leading bytes by which the reader recognizes it)
    "zlib": (lambda raw: zlib.compress(raw, level=9), zlib.decompress, b"\x78"),
    "lzma": (lambda raw: lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME), lzma.decompress, b"\xfd7zXZ"),
    "zstd": (lambda raw: importlib.import_module("zstandard").ZstdCompressor(level=22).compress(raw),
             lambda blob: importlib.import_module("zstandard").ZstdDecompressor().decompress(blob), b"\x28\xb5\x2f\xfd"),
    "brotli": (lambda raw: b"BROTLI" + importlib.import_module("brotli").compress(raw, quality=11),  # no magic: a tag
               lambda blob: importlib.import_module("brotli").decompress(blob[6:]), b"BROTLI"),
}
COMPRESSOR_PACKAGES = {"zstd": "zstandard", "brotli": "brotli"}

def is_quantized(tensor: Tensor) -> bool:
    return tensor.is_floating_point() and tensor.ndim == 2 and tensor.numel() > KEEP_FLOAT_MAX_NUMEL

def round_to_fp16(x: Tensor) -> Tensor:
    """Positive fp32 values in fp16's normal range, rounded to the nearest fp16 (ties to even), kept in fp32.
    Integer ops: torch.compile drops a .half().float() round trip, and QAT must see the export's scales."""
    bits = x.float().view(torch.int32)
    return ((bits + 0x0FFF + ((bits >> 13) & 1)) & -0x2000).view(torch.float32)

def quantize_rows(w: Tensor, bits: int, sigmas: float = 0.0) -> tuple[Tensor, Tensor]:
    """Per-row symmetric integers in [-qmax, qmax] (as float) and fp16 scales (rows,): clip searched, or sigmas stds."""
    qmax, absmax = 2 ** (bits - 1) - 1, w.abs().amax(dim=1, keepdim=True)  # (R, 1)
    clips = [sigmas * w.std(dim=1, keepdim=True)] if sigmas else [absmax * f for f in CLIP_FRACTIONS]
    # fp16 scales floored at its smallest normal (no division by zero); float fractions: no host-to-device copy
    scales = round_to_fp16((torch.stack(clips) / qmax).clamp(2.0 ** -14, 65504.0))  # (K, R, 1)
    q = torch.clamp(torch.round(w / scales), -qmax, qmax)  # (K, R, C)
    best = (q * scales - w).square().sum(dim=2).argmin(dim=0)  # (R,)
    rows = torch.arange(w.size(0), device=w.device)
    return q[best, rows], scales[best, rows, 0]

def gptq_quantize(w: Tensor, H: Tensor, bits: int, damp: float, sigmas: float = 0.0, block=128) -> tuple[Tensor, Tensor]:
    """GPTQ (Frantar et al. 2022) with quantize_rows's scales: columns in descending order of H's diagonal
    (act order), each column's rounding error pushed onto the columns not yet quantized through the upper
    Cholesky factor of H^-1, in blocks. H = X^T X of the layer's inputs; H = I gives round-to-nearest."""
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

def fake_quantize(w: Tensor, bits: int, sigmas: float = 0.0) -> Tensor:
    """The export's round trip in the forward pass, with a straight-through gradient (late QAT)."""
    q, scale = quantize_rows(w.detach(), bits, sigmas)
    return w + (q * scale[:, None] - w).detach()

def quantize_state_dict(state_dict, bits: int, embed_bits: int, hessians=None, damp=0.01, sigmas=0.0, embed_sigmas=0.0) -> dict:
    """Large float matrices -> per-row integers, one byte each (packing the bits hides their distribution
    from the compressor: README, "Compressors"), with fp16 scales, by GPTQ where hessians has the matrix;
    small tensors -> fp16, but control tensors (gains, mixes) stay fp32: they are few and sensitive."""
    ints, scales, floats, dtypes = {}, {}, {}, {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().cpu()
        dtypes[name] = str(tensor.dtype).removeprefix("torch.")
        if not tensor.is_floating_point():
            floats[name] = tensor
        elif not is_quantized(tensor):
            floats[name] = tensor.float() if any(key in name for key in CONTROL_PARAM_NAMES) else tensor.half()
        else:
            width, k = (embed_bits, embed_sigmas) if name == "tok_emb.weight" else (bits, sigmas)
            q, scale = gptq_quantize(tensor, hessians[name].cpu(), width, damp, k) if name in (hessians or {}) else \
                quantize_rows(tensor.float(), width, k)
            ints[name], scales[name] = q.to(torch.int8), scale.half()
    return {"format": "int8_rows_v2", "ints": ints, "scales": scales, "floats": floats, "dtypes": dtypes}

def dequantize_state_dict(obj: dict) -> dict[str, Tensor]:
    ints, scales = obj["ints"], obj["scales"]
    return {name: (ints[name].float() * scales[name].float()[:, None] if name in ints else obj["floats"][name])
            .to(getattr(torch, dtype)) for name, dtype in obj["dtypes"].items()}

def save_artifact(state_dict: dict[str, Tensor], path: Path, hp: Hyperparameters, hessians=None) -> bytes:
    buffer = io.BytesIO()
    torch.save(quantize_state_dict(state_dict, hp.quant_bits, hp.embed_quant_bits, hessians, hp.gptq_damp,
                                   hp.quant_sigmas, hp.embed_quant_sigmas), buffer)
    blob = COMPRESSORS[hp.compressor][0](buffer.getvalue())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    return blob

def load_artifact(path) -> dict[str, Tensor]:
    """An artifact read back without executing pickled code (weights_only), its compressor told by its first bytes."""
    blob = Path(path).read_bytes()
    decompress = next((d for _, d, lead in COMPRESSORS.values() if blob.startswith(lead)), None)
    if decompress is None:
        raise ConfigError(f"{path}: its first bytes {blob[:6]!r} are those of no COMPRESSOR ({', '.join(COMPRESSORS)})")
    return dequantize_state_dict(torch.load(io.BytesIO(decompress(blob)), map_location="cpu", weights_only=True))

# ---- LOGGING ----
@dataclass
class RunLog:
    """Console lines from rank 0, mirrored into logs/<RUN_ID>.txt after the script's own source."""
    path: Path | None

    def write_header(self, source: bytes, hp: Hyperparameters, layout: Layout, command: str) -> None:
        with open(self.path, "xb") as f:  # "x": never overwrite an earlier run's log
            f.write(f"==== train_gpt.py source bytes:{len(source)} sha256:{hashlib.sha256(source).hexdigest()} ====\n"
                    .encode() + source + b"\n==== end of source ====\n")
        self(f"versions: python:{platform.python_version()} torch:{torch.__version__}", console=False)
        for line in describe_hardware(layout):
            self(line, console=False)
        self(f"command: {command}")
        self(f"hyperparameters: {json.dumps(dataclasses.asdict(hp))}")
        self(f"world_size:{layout.world_size} grad_accum_steps:{layout.grad_accum_steps} "
             f"device:{layout.device.type} compile:{layout.use_compile} bf16:{layout.use_bf16}")

    def __call__(self, message: str, console: bool = True) -> None:
        if self.path is None:
            return
        if console:
            print(message, flush=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(message + "\n")

def describe_hardware(layout: Layout) -> list[str]:
    if layout.device.type == "cuda":
        try:
            smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout.rstrip().splitlines()
        except (OSError, subprocess.SubprocessError):
            smi = []
        return [f"hardware: cuda: {layout.world_size}x {torch.cuda.get_device_name(layout.device)}"] + smi
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu_name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                    platform.processor() or platform.machine())
    return [f"hardware: {layout.device.type}: {cpu_name}, {os.cpu_count()} logical cores, "
            f"{torch.get_num_threads()} torch threads per process x {layout.world_size} processes"]

def misspelled_settings(environ=os.environ) -> list[str]:
    """Env vars a typo away from a setting: NUM_LAYER=11 would otherwise be silently ignored."""
    names = Hyperparameters.env_names()
    return [f"{key} (did you mean {match[0]}?)" for key in environ
            if key not in names and (match := difflib.get_close_matches(key, names, n=1, cutoff=0.9))]

def launch_command(environ=os.environ) -> str:
    """The command that reproduces this run: the env vars it set, then the launcher."""
    settings = [f"{name}={shlex.quote(environ[name])}" for name in sorted(Hyperparameters.env_names())
                if name in environ]
    launcher = f"torchrun --standalone --nproc_per_node={environ['LOCAL_WORLD_SIZE']}" if "LOCAL_WORLD_SIZE" in \
        environ else "python"  # torchrun sets LOCAL_WORLD_SIZE
    return " ".join(settings + [f"{launcher} {Path(__file__).name}"])

# ---- CHECKPOINTS AND SAMPLES ----
MODEL_SHAPE_SETTINGS = ("vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult",
                        "tie_embeddings", "rope_base", "logit_softcap", "mlp_leaky_slope", "rope_dims", "ln_scale",
                        "xsa_last_n", "smear_gate", "bigram_buckets", "bigram_dim", "loop_start", "loop_end",
                        "loop_repeats", "parallel_from")
SAMPLE_PROMPTS = ("The President", "Congress shall", "In the year 1850,")

@dataclass
class LoopState:
    """Where training stands: with the weights, optimizer states and data position, all a resume needs."""
    step: int = 0
    training_time_ms: float = 0.0  # training only: validation, checkpoints and samples are excluded
    elapsed_ms: float = 0.0  # the clock all ranks agreed on after the last step
    qat_active: bool = False
    loop_active: bool = False

def barrier(layout: Layout) -> None:
    if layout.distributed:
        dist.barrier()

def checkpoint_folders(root: Path) -> list[Path]:
    """Finished checkpoints, oldest first; a .tmp folder is a write that never completed."""
    return sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))

def resolve_resume(hp: Hyperparameters) -> dict | None:
    """Turn RESUME into a checkpoint folder and read its meta, refusing one of another model shape."""
    if not hp.resume:
        return None
    folder = Path(hp.resume)
    if hp.resume == "latest":
        if not hp.run_id:
            raise ConfigError("RESUME=latest needs RUN_ID, the run whose newest checkpoint to resume")
        found = checkpoint_folders(Path(hp.checkpoint_dir) / hp.run_id)
        if not found:
            raise ConfigError(f"RESUME=latest: no checkpoint in {Path(hp.checkpoint_dir) / hp.run_id}")
        folder = found[-1]
    if not (folder / "meta.json").is_file():
        raise ConfigError(f"RESUME={hp.resume}: {folder / 'meta.json'} does not exist; point RESUME at a "
                          "step_NNNNNN folder of a checkpoint, or use RESUME=latest with the run's RUN_ID")
    defaults = dataclasses.asdict(Hyperparameters())  # a checkpoint older than a setting ran its default
    try:  # the tensors are mapped, not read: this finds a damaged file, not a flipped bit
        meta = json.loads((folder / "meta.json").read_text())
        shape = {name: meta["hyperparameters"].get(name, defaults[name]) for name in MODEL_SHAPE_SETTINGS}
        saved = torch.load(folder / "state.pt", map_location="cpu", weights_only=True, mmap=True)
        (index, pos), shards = meta["loader"], sorted(glob.glob(os.path.join(hp.data_path, "fineweb_train_*.bin")))
        if {"model", "adam", "muon", "ema"} - saved.keys() or {"run_id", "source_sha256"} - meta.keys():
            raise ValueError(f"its state.pt holds {sorted(saved)} and its meta.json {sorted(meta)}" + (" (an older "
                             "train_gpt.py wrote it)" if (folder / "muon_rank0.pt").exists() else ""))
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
    """Rank 0 (every rank holds the same weights and optimizer states) writes step_N.tmp/, renamed to step_N/
    once complete, so a write killed halfway leaves the earlier checkpoints as they were. Tensors and JSON only."""
    root = Path(hp.checkpoint_dir) / hp.run_id
    folder, tmp = root / f"step_{state.step:06d}", root / f"step_{state.step:06d}.tmp"
    if layout.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        torch.save({"model": model.state_dict(), "adam": adam.state_dict(), "muon": muon.state_dict(),
                    "ema": ema.params if ema else None, "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state(layout.device) if layout.device.type == "cuda" else None},
                   tmp / "state.pt")
        meta = dict(run_id=hp.run_id, source_sha256=source_sha256, world_size=layout.world_size,
                    loader=loader.position, hyperparameters=dataclasses.asdict(hp), **dataclasses.asdict(state))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        stale = [p for p in root.glob("step_*.tmp") if p != tmp]  # writes that were killed halfway
        for old in stale + (checkpoint_folders(root)[:-hp.keep_checkpoints] if hp.keep_checkpoints else []):
            shutil.rmtree(old)
    barrier(layout)
    return folder

def load_checkpoint(folder: Path, layout: Layout, model: GPT, adam, muon: Muon, ema,
                    loader: DistributedTokenLoader) -> LoopState:
    """Restore a checkpoint into this run, whatever its world size."""
    meta = json.loads((folder / "meta.json").read_text())
    saved = torch.load(folder / "state.pt", map_location=layout.device, weights_only=True)
    model.load_state_dict(saved["model"])
    for opt, key in ((adam, "adam"), (muon, "muon")):  # only the states: the LRs and such are this run's settings
        opt.load_state_dict({"state": saved[key]["state"], "param_groups": opt.state_dict()["param_groups"]})
    if ema:  # a run that turns the EMA on at the resume starts it from the resumed weights
        torch._foreach_copy_(ema.params, saved["ema"] or [p.detach() for p in model.parameters()])
    torch.set_rng_state(saved["rng"].cpu())
    if saved["cuda_rng"] is not None and layout.device.type == "cuda":
        torch.cuda.set_rng_state(saved["cuda_rng"].cpu(), layout.device)
    loader.position = list(meta["loader"])
    return LoopState(**{f.name: meta.get(f.name, f.default) for f in fields(LoopState)})

@torch.no_grad()
def generate(model: GPT, ids: Tensor, new_tokens: int, hp: Hyperparameters, layout: Layout,
             temperature: float = 0.0) -> Tensor:
    """Each row of ids (B, T) continued by new_tokens: greedy, or sampled at this temperature (seeded per rank)."""
    was_training, rng = model.training, torch.Generator(layout.device).manual_seed(hp.seed + layout.rank)
    model.eval()
    for _ in range(new_tokens):
        with autocast(layout):
            logits = model.logits(ids[:, -hp.train_seq_len:])[:, -1].float()
        probs = torch.softmax(logits / max(temperature, 1e-6), dim=-1)
        ids = torch.cat((ids, logits.argmax(-1, keepdim=True) if temperature == 0 else
                         torch.multinomial(probs, 1, generator=rng)), dim=1)
    model.train(was_training)
    return ids

def sample(model: GPT, tok: Tokenizer, hp: Hyperparameters, layout: Layout, log, new_tokens: int = 32) -> list[str]:
    """Greedy continuations of fixed prompts, logged, so a user sees what the model learned."""
    texts = []
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([[BOS_ID] + tok.encode(prompt)], device=layout.device)
        texts.append(tok.decode(generate(model, ids, new_tokens, hp, layout)[0, 1:].tolist()))
        log(f"sample: {texts[-1]!r}")
    return texts

class StopSignal:
    """The first SIGTERM or SIGINT asks the loop to finish its step, checkpoint and exit; a second exits at once."""
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
def training_progress(step: int, elapsed_ms: float, hp: Hyperparameters) -> float:
    """The spent part of the budget: of ITERATIONS or of MAX_WALLCLOCK_SECONDS, whichever is further."""
    return max(step / max(hp.iterations, 1), elapsed_ms / hp.budget_ms)

def lr_schedule(step: int, elapsed_ms: float, hp: Hyperparameters) -> float:
    """LR multiplier: 1, then linear down to MIN_LR_SCALE over the last WARMDOWN_FRAC of the budget, or (0) over
    the last WARMDOWN_ITERS steps or, under a wallclock cap, WARMDOWN_ITERS * (average step time), if sooner."""
    if hp.warmdown_frac > 0:
        left = min(1.0, max(1.0 - training_progress(step, elapsed_ms, hp), 0.0) / hp.warmdown_frac)
    elif hp.warmdown_iters <= 0:
        left = 1.0
    else:
        left = min(1.0, max(hp.iterations - step, 0) / hp.warmdown_iters)
        if hp.budget_ms < math.inf:
            warmdown_ms = hp.warmdown_iters * elapsed_ms / max(step, 1)
            remaining_ms = max(hp.budget_ms - elapsed_ms, 0.0)
            left = min(left, remaining_ms / warmdown_ms if remaining_ms < warmdown_ms else 1.0)
    return hp.min_lr_scale + (1.0 - hp.min_lr_scale) * left

def muon_momentum(step: int, hp: Hyperparameters) -> float:
    frac = min(step / hp.muon_momentum_warmup_steps, 1.0) if hp.muon_momentum_warmup_steps > 0 else 1.0
    return (1 - frac) * hp.muon_momentum_warmup_start + frac * hp.muon_momentum

class EMA:
    """The weights' moving average, updated on device every step; swap() exchanges it with the live weights."""
    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.params = [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        torch._foreach_lerp_(self.params, [p.detach() for p in model.parameters()], 1.0 - self.decay)

    @torch.no_grad()
    def swap(self, model: nn.Module) -> None:
        live = [p.detach().clone() for p in model.parameters()]
        torch._foreach_copy_([p.detach() for p in model.parameters()], self.params)
        self.params = live

def build_optimizers(model: GPT, hp: Hyperparameters, layout: Layout) -> tuple[list[torch.optim.Optimizer], Muon]:
    """Muon for the blocks' and bigram projection's matrices; AdamW for embeddings, head, vectors and controls."""
    embeddings = [model.tok_emb.weight] + ([model.bigram.weight] if model.bigram is not None else [])
    head = [model.lm_head.weight] if model.lm_head is not None else []
    matrices, scalars = [], []
    for name, p in model.named_parameters():
        if not any(p is e for e in embeddings + head):
            (matrices if p.ndim == 2 and not any(key in name for key in CONTROL_PARAM_NAMES) else scalars).append(p)
    adam_groups = [
        dict(params=embeddings, lr=hp.tied_embed_lr if hp.tie_embeddings else hp.embed_lr, weight_decay=hp.embed_wd),
        dict(params=scalars, lr=hp.scalar_lr, weight_decay=hp.scalar_wd),
    ]
    if head:
        adam_groups.append(dict(params=head, lr=hp.head_lr, weight_decay=hp.embed_wd))
    adam = torch.optim.AdamW(adam_groups, betas=(hp.beta1, hp.beta2), eps=hp.adam_eps, weight_decay=0.0,
                             fused=layout.device.type == "cuda")
    muon = Muon(matrices, lr=hp.matrix_lr, momentum=hp.muon_momentum, backend_steps=hp.muon_backend_steps,
                update_dtype=torch.bfloat16 if layout.use_bf16 else torch.float32, weight_decay=hp.muon_wd,
                row_norm=hp.muon_row_norm, coeffs=POLAR_EXPRESS_COEFFS if hp.muon_polar else QUINTIC_COEFFS)
    optimizers = [adam, muon]
    for opt in optimizers:
        for group in opt.param_groups:
            group["base_lr"] = group["lr"]
    return optimizers, muon

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
class Run:
    """What setup() read and checked, and what the stages of main() share."""
    hp: Hyperparameters
    layout: Layout
    tokenizer: Tokenizer
    val_tokens: Tensor
    val_bytes: Tensor  # the bytes of text behind each validation token
    log: RunLog | None = None
    model: GPT | None = None  # the plain module: its weights are trained, exported and sampled
    compiled: nn.Module | None = None  # the same weights, compiled on CUDA: what evaluates
    trainer: nn.Module | None = None  # the compiled model as DDP wraps it: what trains

def setup(environ=os.environ) -> Run:
    """Every check that can fail, on every rank, before any process group, model or file: settings, paths,
    the tokenizer, every shard's header and ids, the validation split's bytes against decoding."""
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
    val = load_validation(os.path.join(hp.data_path, "fineweb_val_*.bin"), max(hp.train_seq_len, hp.eval_seq_len),
                          tokenizer, (rank, world_size))  # each rank decodes its share of the documents
    meta = resolve_resume(hp)
    log_path = Path(hp.log_dir) / f"{hp.run_id}.txt"
    if hp.run_id and log_path.exists():  # a resume continues its own log, if the script is still the log's
        same_script = meta and meta["source_sha256"] == hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
        if not (meta and meta["run_id"] == hp.run_id and same_script):
            raise ConfigError(f"RUN_ID={hp.run_id}: {log_path} already exists; choose another RUN_ID or move the "
                              "old log away" + (" (the script changed since the checkpoint)" if meta else ""))
    device = pick_device(local_rank)
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
            getattr(torch.backends.cuda, f"enable_{kind}_sdp")(on)  # flash takes only 16-bit inputs: math for fp32
    if layout.distributed:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    run_id = [hp.run_id or str(uuid.uuid4())]
    if layout.distributed:  # every rank must name the same log and artifact
        dist.broadcast_object_list(run_id, src=0)
    hp.run_id = run_id[0]
    if not layout.is_main:
        return RunLog(None)
    Path(hp.log_dir).mkdir(parents=True, exist_ok=True)
    log = RunLog(Path(hp.log_dir) / f"{hp.run_id}.txt")
    if log.path.exists():  # setup() let it through: a resume continues its own run's log
        log(f"command: {launch_command()}")
    else:
        log.write_header(source, hp, layout, launch_command())
    for typo in misspelled_settings():
        log(f"WARNING: env var {typo} is not a setting and was ignored")
    print(f"logfile: {log.path}")
    return log

def phase_at(progress: float, hp: Hyperparameters) -> tuple[bool, int]:
    """(looping, QAT bits) once this fraction of the training budget is spent."""
    qat_on = hp.qat_start_frac < 1.0 and progress >= hp.qat_start_frac
    looping = hp.loop_repeats > 0 and hp.loop_start_frac < 1.0 and progress >= hp.loop_start_frac
    return looping, hp.quant_bits if qat_on else 0

def compiled_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]

def warmup(run: Run, model: nn.Module, next_batch, optimizers) -> None:
    """Prime compilation and the allocator in every phase training will reach (WARMUP_STEPS >= the number of
    phases primes them all: no switch recompiles in the timed loop); then weights, optimizer states and data
    restart: these steps cost time but do not change the run."""
    hp = run.hp
    phases = list(dict.fromkeys(phase_at(f, hp) for f in sorted({0.0, hp.loop_start_frac, hp.qat_start_frac})))
    initial_model = copy.deepcopy(run.model.state_dict())
    initial_optimizers = [copy.deepcopy(opt.state_dict()) for opt in optimizers]
    for step in range(hp.warmup_steps):
        set_phase(run.model, *phases[step * len(phases) // hp.warmup_steps], hp.quant_sigmas)
        train_step(model, next_batch, optimizers, hp, run.layout, lr_scale=1.0)
        if step + 1 in (1, hp.warmup_steps):
            run.log(f"warmup_step:{step + 1}/{hp.warmup_steps}")
    set_phase(run.model, *phases[0], hp.quant_sigmas)
    run.model.load_state_dict(initial_model)
    for opt, state in zip(optimizers, initial_optimizers):
        opt.load_state_dict(state)
    if run.layout.use_compile:
        run.log(f"compile: {compiled_graphs()} graphs after warmup, {len(phases)} training phases")

def calibrate(run: Run, loader: DistributedTokenLoader) -> dict[str, Tensor]:
    """GPTQ's H = X^T X of every quantized matrix's inputs (summed over ranks) on GPTQ_CALIB_SEQS sequences:
    the next training tokens, or the model's own samples; never validation tokens. The output head's inputs
    (the final norm's output) stand for the tied embedding's."""
    hp, layout, model = run.hp, run.layout, run.model
    t0, seqs = time.perf_counter(), max(1, hp.gptq_calib_seqs // layout.world_size)  # this rank's
    if hp.gptq_calib == "train":
        x = loader.next_batch(seqs * hp.train_seq_len * layout.world_size, hp.train_seq_len, 1)[0]
    else:
        bos = torch.full((seqs, 1), BOS_ID, device=layout.device)
        x = generate(model, bos, hp.train_seq_len - 1, hp, layout, hp.gptq_temperature)
    modules = {f"{name}.weight": m for name, m in model.named_modules()
               if isinstance(m, CastedLinear) and is_quantized(m.weight)}
    modules["tok_emb.weight" if model.lm_head is None else "lm_head.weight"] = model.final_norm
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
    run.log(f"gptq: matrices:{len(hessians)} calib:{hp.gptq_calib} sequences:{seqs * layout.world_size} "
            f"calibration_time:{1000 * (time.perf_counter() - t0):.0f}ms reserved:{1000 * hp.gptq_reserve_seconds:.0f}ms")
    return hessians

def export_and_score(run: Run, source: bytes, hessians=None) -> None:
    """Export, then score what was exported (what counts): plain, sliding and with score-first TTT, as set."""
    hp, layout, log = run.hp, run.layout, run.log
    tag = f"int{hp.quant_bits}_{hp.compressor}"  # names the log lines: final_int6_lzma_roundtrip_exact
    artifact_path = Path(hp.log_dir) / f"{hp.run_id}_model.{tag}.ptz"
    if layout.is_main:
        blob = save_artifact(run.model.state_dict(), artifact_path, hp, hessians)
        total_bytes = len(source) + artifact_path.stat().st_size
        log(f"Serialized model {tag.replace('_', '+')}: {len(blob)} bytes")
        log(f"Code size: {len(source)} bytes")
        log(f"Total submission size {tag.replace('_', '+')}: {total_bytes} bytes")
        log(f"artifact: {artifact_path.as_posix()} bytes:{len(blob)} sha256:{hashlib.sha256(blob).hexdigest()}")
        if total_bytes > 16_000_000:
            log(f"WARNING: submission is {total_bytes} bytes, over the 16,000,000-byte cap by "
                f"{total_bytes - 16_000_000} bytes; it cannot be a record")
    barrier(layout)
    run.model.load_state_dict(load_artifact(artifact_path), strict=True)  # its loop phase too; QAT is off
    if hp.sample_every > 0 and layout.is_main:  # what the exported model writes
        sample(run.model, run.tokenizer, hp, layout, log)
    for name in ["roundtrip"] + ["sliding_window"] * (hp.eval_stride > 0) + ["ttt"] * hp.ttt:
        synchronize(layout.device)
        t_eval, scored = time.perf_counter(), (run.compiled, run.val_tokens, run.val_bytes, hp, layout)
        sums = test_time_train(*scored, run.trainer).sum(0) if name == "ttt" else score(*scored, name != "roundtrip")
        val_loss, val_bpb = metrics(sums)
        synchronize(layout.device)
        log(f"final_{tag}_{name} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} "
            f"eval_time:{1000.0 * (time.perf_counter() - t_eval):.0f}ms")
        log(f"final_{tag}_{name}_exact val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f}")

def main() -> None:
    run = setup()
    hp, layout, device, val_tokens = run.hp, run.layout, run.layout.device, run.val_tokens
    val_bytes = run.val_bytes = run.val_bytes.to(device)  # on the device: no blocking copy per eval batch
    source = Path(__file__).read_bytes()  # read once: the logged and the counted code are the same bytes
    log = run.log = init_runtime(hp, layout, source)
    torch.manual_seed(hp.seed)
    train_pattern = os.path.join(hp.data_path, "fineweb_train_*.bin")
    log(f"val_tokens:{val_tokens.numel() - 1} val_bytes:{int(val_bytes[1:].sum())} "
        f"train_shards:{len(glob.glob(train_pattern))}")
    base_model = run.model = GPT(hp).to(device)
    log(f"model_params:{sum(p.numel() for p in base_model.parameters())}")
    optimizers, muon = build_optimizers(base_model, hp, layout)
    compiled = run.compiled = base_model
    if layout.use_compile:
        # training phases x eval shapes; fullgraph fails past the limit (named cache_size_limit before torch 2.7)
        torch._dynamo.config.cache_size_limit = 64
        compiled = run.compiled = torch.compile(base_model, dynamic=False, fullgraph=True)
        muon.orthogonalize = torch.compile(zeropower_via_newtonschulz5)
    # DDP without buffer broadcast: every rank holds the same RoPE tables and phase flags
    model = run.trainer = DDP(compiled, device_ids=[layout.local_rank] if device.type == "cuda" else None,
                              broadcast_buffers=False) if layout.distributed else compiled
    batches = lambda loader: lambda: loader.next_batch(hp.train_batch_tokens, hp.train_seq_len, layout.grad_accum_steps)
    if hp.warmup_steps > 0:
        warmup(run, model, batches(DistributedTokenLoader(train_pattern, layout.rank, layout.world_size, device)),
               optimizers)
    loader = DistributedTokenLoader(train_pattern, layout.rank, layout.world_size, device)
    ema = EMA(base_model, hp.ema_decay) if hp.ema_decay > 0 else None
    state, stop_after_step = LoopState(), None
    if hp.resume:
        state = load_checkpoint(Path(hp.resume), layout, base_model, optimizers[0], muon, ema, loader)
        log(f"resume: from {hp.resume} at step:{state.step} train_time:{state.training_time_ms:.0f}ms")
        if state.elapsed_ms >= hp.budget_ms:
            stop_after_step = state.step  # the budget was spent before the checkpoint
    if not hp.resume:  # a phase that starts at 0 is on from the first step
        looping, qat_bits = phase_at(0.0, hp)
        state.loop_active, state.qat_active = looping, bool(qat_bits)
    set_phase(base_model, state.loop_active, hp.quant_bits if state.qat_active else 0, hp.quant_sigmas)
    stop_signal, peak = StopSignal(), peak_flops(device)
    source_sha256, first_step = hashlib.sha256(source).hexdigest(), state.step

    def pause_clock():  # validation, checkpoints and samples do not count as training time
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
            val_loss, val_bpb = evaluate(compiled, val_tokens, val_bytes, hp, layout)
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
        # one clock, signal and health verdict for all ranks: the same LR, phase, stop and checkpoint everywhere
        agreed = torch.tensor([state.elapsed_ms, stop_signal.signum], dtype=torch.float64,
                              device="cpu" if device.type == "mps" else device)  # MPS has no float64
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
        looping, qat_bits = phase_at(training_progress(step, state.elapsed_ms, hp), hp)
        run_ends = step >= hp.iterations or stop_after_step is not None  # no phase the model never trained in
        if (looping, bool(qat_bits)) != (state.loop_active, state.qat_active) and not run_ends:
            set_phase(base_model, looping, qat_bits, hp.quant_sigmas)
            log(f"phase: from step:{step} depth_recurrence:{'on' if looping else 'off'} "
                f"late_qat:{f'int{qat_bits}' if qat_bits else 'off'}")
            state.loop_active, state.qat_active = looping, bool(qat_bits)
        periodic_save = hp.save_every > 0 and (step % hp.save_every == 0 or step in (hp.iterations, stop_after_step))
        periodic_sample = hp.sample_every > 0 and step % hp.sample_every == 0 and step < hp.iterations
        if signum or periodic_save or periodic_sample:
            pause_clock()
            if periodic_sample and layout.is_main:
                sample(base_model, run.tokenizer, hp, layout, log)
            if signum or periodic_save:
                folder = save_checkpoint(hp, layout, base_model, optimizers[0], muon, ema, state, loader, source_sha256)
                log(f"checkpoint: {folder} step:{state.step} ({signal.Signals(signum).name if signum else 'periodic'})")
            if signum:
                resume = launch_command({**os.environ, "RESUME": str(folder), "RUN_ID": hp.run_id})
                log(f"stopped by {signal.Signals(signum).name} after step:{step}; resume with: {resume}")
                barrier(layout)
                if layout.distributed:
                    dist.destroy_process_group()
                sys.exit(128 + signum)
            barrier(layout)  # rank 0's sampling must not reach the other ranks' clocks
            synchronize(device)
            t0 = time.perf_counter()

    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # nothing can be checkpointed now: a signal stops the export
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if layout.use_compile:
        log(f"compile: {compiled_graphs()} graphs after training")
    if device.type == "cuda":
        log(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 2**20} MiB "
            f"reserved: {torch.cuda.max_memory_reserved() // 2**20} MiB")
    if ema:
        ema.swap(base_model)
    set_phase(base_model, state.loop_active, 0)  # calibration and export see the model as trained, without QAT
    export_and_score(run, source, calibrate(run, loader) if hp.gptq else None)
    if layout.use_compile:
        log(f"compile: {compiled_graphs()} graphs after the final evaluations")
    if layout.distributed:
        dist.barrier()  # without it, gloo tears down while a peer is still in its last collective
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except ConfigError as e:
        sys.exit(f"train_gpt.py: error: {e}")
