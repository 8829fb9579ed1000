"""
train_gpt.py: a single-file GPT speedrun trainer for the Parameter Golf challenge.

Trains a small GPT (GQA, RoPE, relu^2 MLP, U-Net skips, tied embeddings) with Muon and Adam on
sharded .bin tokens under a wallclock cap, scores exact tokenizer-agnostic val_bpb, then exports
int8+zlib weights and scores the round-tripped model again. That artifact plus this file is the
submission.

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
    """A bad setting or input; raised before any training work, printed without a traceback."""


DATA_HINT = (
    "HINT: build the offline corpus with `python data/build_sotu.py` (DATA_PATH=./data/datasets/sotu_sp1024 "
    "TOKENIZER_PATH=./data/tokenizers/sotu_1024_bpe.model), or fetch the challenge's data with "
    "`python data/download_challenge.py --variant sp1024`"
)


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
    ema_decay: float = 0.0  # 0: off; else the EMA of the weights is evaluated and exported
    qat_start_frac: float = 1.0  # late QAT from this fraction of the training budget on; 1: never
    # evaluation and export
    eval_seq_len: int = 0  # 0: TRAIN_SEQ_LEN
    eval_stride: int = 0  # 0: non-overlapping windows; else a sliding window scoring STRIDE tokens each
    quant_bits: int = 8  # block matrices
    embed_quant_bits: int = 8
    compressor: str = "zlib"
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
    def from_env(cls, environ=None) -> "Hyperparameters":
        environ = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            name = f.name.upper()
            if name in environ:
                values[f.name] = _parse_env_value(name, environ[name], f.default)
        hp = cls(**values)
        hp.validate()
        return hp

    @classmethod
    def env_names(cls) -> list[str]:
        return [f.name.upper() for f in fields(cls)]

    def validate(self) -> None:
        """Checks that need only the settings themselves; world size and files come later."""
        positive = ["train_batch_tokens", "logit_softcap", "rope_base", "train_seq_len", "val_batch_size", "vocab_size",
                    "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult", "muon_backend_steps"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name.upper()}={getattr(self, name)} must be positive")
        for name in ["iterations", "warmdown_iters", "warmup_steps", "val_loss_every", "train_log_every", "grad_accum_steps",
                     "muon_momentum_warmup_steps", "max_wallclock_seconds", "grad_clip_norm", "eval_seq_len",
                     "eval_stride", "save_every", "keep_checkpoints", "sample_every"]:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.upper()}={getattr(self, name)} must be >= 0 (0 turns it off)")
        if self.num_layers < 2:
            raise ConfigError(f"NUM_LAYERS={self.num_layers}: the U-Net pairs encoder and decoder blocks; use at least 2")
        if self.vocab_size > 65_536:
            raise ConfigError(f"VOCAB_SIZE={self.vocab_size} does not fit the uint16 shards; use at most 65536")
        if self.model_dim % self.num_heads:
            raise ConfigError(f"MODEL_DIM={self.model_dim} is not divisible by NUM_HEADS={self.num_heads}; "
                              f"pick NUM_HEADS among the divisors of {self.model_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"NUM_HEADS={self.num_heads} is not divisible by NUM_KV_HEADS={self.num_kv_heads}; "
                              "each KV head must serve a whole group of query heads")
        head_dim = self.model_dim // self.num_heads
        if head_dim % 2:
            raise ConfigError(f"head dim MODEL_DIM/NUM_HEADS = {self.model_dim}/{self.num_heads} = {head_dim} is odd; "
                              "RoPE rotates pairs of channels, so choose an even head dim")
        choices = dict(compile=("auto", "0", "1"), bf16=("auto", "0", "1"), quant_bits=QUANT_BITS_CHOICES,
                       embed_quant_bits=QUANT_BITS_CHOICES, compressor=tuple(COMPRESSORS))
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name.upper()}={getattr(self, name)!r} must be one of {', '.join(map(str, allowed))}")
        if self.eval_stride > (self.eval_seq_len or self.train_seq_len):
            raise ConfigError(f"EVAL_STRIDE={self.eval_stride} is longer than the eval window "
                              f"{self.eval_seq_len or self.train_seq_len}; use a stride of at most EVAL_SEQ_LEN")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"EMA_DECAY={self.ema_decay} must be in [0, 1); 0 turns the EMA off, 0.997 is typical")
        if not 0.0 <= self.qat_start_frac <= 1.0:
            raise ConfigError(f"QAT_START_FRAC={self.qat_start_frac} must be in [0, 1]; 1 turns late QAT off")


def _parse_env_value(name: str, raw: str, default):
    text = raw.strip()
    try:
        if isinstance(default, bool):
            if text.lower() in ("1", "true"):
                return True
            if text.lower() in ("0", "false"):
                return False
            raise ValueError
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
    except ValueError:
        kind = {bool: "0 or 1", int: "an integer", float: "a number"}[type(default)]
        example = int(default) if isinstance(default, bool) else default
        raise ConfigError(f"{name}={raw!r} is not {kind}; set it like {name}={example}") from None
    return text


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
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def resolve_mode(setting: str, device: torch.device) -> bool:
    return setting == "1" if setting != "auto" else device.type == "cuda"


# Dense bf16 peak per GPU, for MFU. Unknown GPUs get no MFU field rather than a made-up one.
PEAK_BF16_FLOPS = {"H100 PCIe": 756e12, "H100 NVL": 835e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)


# ---- MUON OPTIMIZER ----


def zeropower_via_newtonschulz5(G: Tensor, steps: int = 5, eps: float = 1e-7, dtype=torch.bfloat16) -> Tensor:
    """Approximately orthogonalize G (push its singular values towards 1) with a quintic
    Newton-Schulz iteration, in bf16 by default. The coefficients trade exactness for speed:
    singular values land in roughly [0.7, 1.2], which Muon tolerates (Keller Jordan, modded-nanogpt)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G.to(dtype)
    X = X / (X.norm() + eps)
    transposed = X.size(0) > X.size(1)
    if transposed:  # iterate on the wide orientation: X @ X.T is the smaller Gram matrix
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.T if transposed else X


class Muon(torch.optim.Optimizer):
    """Momentum + Nesterov, then orthogonalized updates for 2-D matrices. Each rank orthogonalizes
    every world_size-th matrix; one all-reduce over a flat buffer gives every rank all updates.
    update_dtype is bf16 for speed; fp32 keeps 1 and N processes within float noise of each other,
    where bf16 rounding amplifies the different gradient summation order to ~1e-4 in loss."""

    def __init__(self, params, lr: float, momentum: float, backend_steps: int, nesterov: bool = True,
                 update_dtype=torch.bfloat16):
        super().__init__(params, dict(lr=lr, momentum=momentum, backend_steps=backend_steps, nesterov=nesterov))
        self.orthogonalize = zeropower_via_newtonschulz5
        self.update_dtype = update_dtype

    @torch.no_grad()
    def step(self, closure=None):
        distributed = dist.is_available() and dist.is_initialized()
        world_size = dist.get_world_size() if distributed else 1
        rank = dist.get_rank() if distributed else 0
        for group in self.param_groups:
            params = group["params"]
            if not params:
                continue
            updates = torch.zeros(sum(p.numel() for p in params), device=params[0].device,
                                  dtype=self.update_dtype)
            offset = 0
            for i, p in enumerate(params):
                if i % world_size == rank and p.grad is not None:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p.grad)
                    buf = state["momentum_buffer"]
                    buf.mul_(group["momentum"]).add_(p.grad)
                    g = p.grad.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
                    g = self.orthogonalize(g, steps=group["backend_steps"], dtype=self.update_dtype)
                    g = g * max(1.0, g.size(0) / g.size(1)) ** 0.5  # keep tall matrices' RMS update comparable
                    updates[offset:offset + p.numel()] = g.flatten()
                offset += p.numel()
            if distributed:
                dist.all_reduce(updates, op=dist.ReduceOp.SUM)
            offset = 0
            for p in params:
                p.add_(updates[offset:offset + p.numel()].view_as(p).to(p.dtype), alpha=-group["lr"])
                offset += p.numel()


# ---- DATA ----

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
SHARD_HEADER_INTS = 256
SHARD_HEADER_BYTES = SHARD_HEADER_INTS * 4


def load_data_shard(path) -> Tensor:
    """Read one token shard: 256 little-endian int32 header, then uint16 tokens. Every header
    field and the exact file size are checked, so a truncated download fails here, not mid-run."""
    path = Path(path)
    size = path.stat().st_size
    fix = "rebuild or re-download this shard (see data/README.md)"
    if size < SHARD_HEADER_BYTES:
        raise ValueError(f"{path}: {size} bytes is shorter than the {SHARD_HEADER_BYTES}-byte shard header; {fix}")
    header = np.fromfile(path, dtype="<i4", count=SHARD_HEADER_INTS)
    if header[0] != SHARD_MAGIC:
        raise ValueError(f"{path}: magic number {header[0]} != {SHARD_MAGIC}, so this is not a token shard. "
                         f"HINT: shards are written by data/shards.py; {fix}")
    if header[1] != SHARD_VERSION:
        raise ValueError(f"{path}: shard version {header[1]} is not the supported version {SHARD_VERSION}; {fix}")
    num_tokens = int(header[2])
    expected = SHARD_HEADER_BYTES + 2 * num_tokens
    if size != expected:
        what = "truncated" if size < expected else "has trailing bytes"
        raise ValueError(f"{path}: file is {size} bytes but its header promises {num_tokens} tokens "
                         f"({expected} bytes): it is {what}; {fix}")
    return torch.from_numpy(np.fromfile(path, dtype="<u2", count=num_tokens, offset=SHARD_HEADER_BYTES))


def shard_files(pattern: str, what: str) -> list[str]:
    files = sorted(glob.glob(pattern))
    if not files:
        raise ConfigError(f"DATA_PATH: no {what} shards match {pattern}. {DATA_HINT}")
    return files


class TokenStream:
    """Walks the shards in order, one at a time, wrapping around at the end."""

    def __init__(self, pattern: str):
        self.files = shard_files(pattern, "training")
        self.file_index = 0
        self.tokens = load_data_shard(self.files[0])
        self.pos = 0

    def take(self, n: int) -> Tensor:
        chunks, remaining, empty_in_a_row = [], n, 0
        while remaining > 0:
            available = self.tokens.numel() - self.pos
            if available <= 0:
                empty_in_a_row += 1
                if empty_in_a_row > len(self.files):
                    raise ValueError(f"every shard matching {self.files[0]}... is empty; rebuild the data")
                self.file_index = (self.file_index + 1) % len(self.files)
                self.tokens, self.pos = load_data_shard(self.files[self.file_index]), 0
                continue
            k = min(remaining, available)
            chunks.append(self.tokens[self.pos:self.pos + k])
            self.pos += k
            remaining -= k
            empty_in_a_row = 0
        return chunks[0] if len(chunks) == 1 else torch.cat(chunks)

    def position(self) -> list[int]:
        return [self.file_index, self.pos]

    def seek(self, position: list[int]) -> None:
        self.file_index, self.pos = position
        self.tokens = load_data_shard(self.files[self.file_index])


class DistributedTokenLoader:
    """Every rank reads the same global chunk and keeps its own contiguous span of it; the extra
    token per span supplies the last target."""

    def __init__(self, pattern: str, rank: int, world_size: int, device: torch.device):
        self.stream = TokenStream(pattern)
        self.rank, self.world_size, self.device = rank, world_size, device

    def next_span(self, local_tokens: int) -> Tensor:
        span = local_tokens + 1
        chunk = self.stream.take(span * self.world_size)
        return chunk[self.rank * span:(self.rank + 1) * span]

    def next_batch(self, global_tokens: int, seq_len: int, grad_accum_steps: int) -> tuple[Tensor, Tensor]:
        local = self.next_span(global_tokens // (self.world_size * grad_accum_steps)).to(torch.int64)
        if self.device.type == "cuda":
            local = local.pin_memory()  # so the copy below is asynchronous and overlaps compute
        x = local[:-1].view(-1, seq_len).to(self.device, non_blocking=True)  # (B, T)
        y = local[1:].view(-1, seq_len).to(self.device, non_blocking=True)  # (B, T)
        return x, y


def load_validation_tokens(pattern: str, seq_len: int) -> Tensor:
    tokens = torch.cat([load_data_shard(f) for f in shard_files(pattern, "validation")])
    usable = ((tokens.numel() - 1) // seq_len) * seq_len
    if usable <= 0:
        raise ConfigError(f"DATA_PATH: the validation split {pattern} holds {tokens.numel()} tokens, fewer than one "
                          f"sequence of TRAIN_SEQ_LEN={seq_len} + 1; lower TRAIN_SEQ_LEN or build more validation data")
    return tokens[:usable + 1]


# ---- TOKENIZER BYTE ACCOUNTING ----


@dataclass
class ByteLuts:
    """Per-token-id tables that turn scored tokens into the UTF-8 bytes they stand for."""
    base_bytes: Tensor  # int64 [V]: UTF-8 bytes of the piece without its leading "▁"
    has_leading_space: Tensor  # bool [V]: the piece starts with "▁", one more byte unless after a boundary
    is_boundary: Tensor  # bool [V]: control/unknown/unused ids (BOS...), which stand for no text

    def to(self, device) -> "ByteLuts":
        return ByteLuts(*(t.to(device) for t in dataclasses.astuple(self)))


def load_tokenizer_luts(tokenizer_path, vocab_size: int) -> ByteLuts:
    """Byte tables for a SentencePiece .model or the 260-id byte tokenizer's .json."""
    path = Path(tokenizer_path)
    if not path.is_file():
        raise ConfigError(f"TOKENIZER_PATH={tokenizer_path} does not exist. {DATA_HINT}")
    if path.suffix == ".json":
        spec = json.loads(path.read_text())
        if spec.get("kind") != "byte":
            raise ConfigError(f"TOKENIZER_PATH={tokenizer_path}: kind {spec.get('kind')!r} is not 'byte'")
        size, offset = int(spec["vocab_size"]), int(spec["byte_offset"])
        base = torch.zeros(size, dtype=torch.int64)
        base[offset:offset + 256] = 1
        luts = ByteLuts(base, torch.zeros(size, dtype=torch.bool), base == 0)
    else:
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor(model_file=str(path))
        size = sp.vocab_size()
        base = torch.zeros(size, dtype=torch.int64)
        space = torch.zeros(size, dtype=torch.bool)
        boundary = torch.zeros(size, dtype=torch.bool)
        for i in range(size):
            if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
                boundary[i] = True
            elif sp.is_byte(i):
                base[i] = 1  # <0xAB> stands for exactly one byte, not the 6 characters of its name
            else:
                piece = sp.id_to_piece(i)
                space[i] = piece.startswith("▁")
                base[i] = len(piece.removeprefix("▁").encode("utf-8"))
        luts = ByteLuts(base, space, boundary)
    if size != vocab_size:
        raise ConfigError(f"VOCAB_SIZE={vocab_size} does not match TOKENIZER_PATH={tokenizer_path}, which has "
                          f"{size} ids; set VOCAB_SIZE={size}")
    return luts


def count_target_bytes(prev_ids: Tensor, target_ids: Tensor, luts: ByteLuts) -> Tensor:
    """Bytes each target token stands for. A leading "▁" is a real space except right after a
    boundary token, where the decoder drops it (documents start after BOS)."""
    return luts.base_bytes[target_ids] + (luts.has_leading_space[target_ids] & ~luts.is_boundary[prev_ids])


# ---- MODEL ----

CONTROL_PARAM_NAMES = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights")


class CastedLinear(nn.Linear):
    """Weights stay fp32 for the optimizer; the matmul runs in the activations' dtype. With late
    QAT configured (qat_bits > 0), the weight passes through the export's fake quantization once
    the qat_on buffer is 1. A buffer, not a Python flag: torch.compile would constant-fold a flag
    and QAT would silently never run."""

    qat_bits = 0

    def enable_qat(self, bits: int) -> None:
        self.qat_bits = bits
        self.register_buffer("qat_on", torch.zeros((), device=self.weight.device), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        if self.qat_bits:
            w = torch.lerp(w, fake_quantize(w, self.qat_bits), self.qat_on)
        return F.linear(x, w.to(x.dtype))  # every layer here is bias-free


def rms_norm(x: Tensor) -> Tensor:
    return F.rms_norm(x, (x.size(-1),))


def rotary_cos_sin(seq_len: int, head_dim: int, base: float, device, dtype) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)  # (T, hd/2)
    return freqs.cos().to(dtype)[None, None], freqs.sin().to(dtype)[None, None]  # (1, 1, T, hd/2)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, num_kv_heads: int, rope_base: float, qk_gain_init: float):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = dim // num_heads
        kv_dim = num_kv_heads * self.head_dim
        self.c_q = CastedLinear(dim, dim, bias=False)
        self.c_k = CastedLinear(dim, kv_dim, bias=False)
        self.c_v = CastedLinear(dim, kv_dim, bias=False)
        self.proj = CastedLinear(dim, dim, bias=False)
        nn.init.zeros_(self.proj.weight)
        self.rope_base = rope_base
        # q and k are RMS-normalized, so attention sharpness is learned here, per head
        self.q_gain = nn.Parameter(torch.full((num_heads,), qk_gain_init, dtype=torch.float32))

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q = self.c_q(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, T, hd)
        k = self.c_k(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.c_v(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)  # (B, Hkv, T, hd)
        cos, sin = rotary_cos_sin(T, self.head_dim, self.rope_base, x.device, q.dtype)
        q = apply_rotary(rms_norm(q), cos, sin) * self.q_gain.to(q.dtype)[None, :, None, None]
        k = apply_rotary(rms_norm(k), cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.num_kv_heads != self.num_heads)  # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, dim: int, mlp_mult: int):
        super().__init__()
        self.fc = CastedLinear(dim, mlp_mult * dim, bias=False)
        self.proj = CastedLinear(mlp_mult * dim, dim, bias=False)
        nn.init.zeros_(self.proj.weight)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.relu(self.fc(x)).square())


class Block(nn.Module):
    def __init__(self, hp: Hyperparameters):
        super().__init__()
        dim = hp.model_dim
        self.attn = CausalSelfAttention(dim, hp.num_heads, hp.num_kv_heads, hp.rope_base, hp.qk_gain_init)
        self.mlp = MLP(dim, hp.mlp_mult)
        self.attn_scale = nn.Parameter(torch.ones(dim))
        self.mlp_scale = nn.Parameter(torch.ones(dim))
        # row 0 weighs the residual stream, row 1 the first layer's input (starts as the plain stream)
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(dim), torch.zeros(dim))))

    def forward(self, x: Tensor, x0: Tensor) -> Tensor:
        mix = self.resid_mix.to(x.dtype)
        x = mix[0] * x + mix[1] * x0
        x = x + self.attn_scale.to(x.dtype) * self.attn(rms_norm(x))
        return x + self.mlp_scale.to(x.dtype) * self.mlp(rms_norm(x))


class GPT(nn.Module):
    def __init__(self, hp: Hyperparameters):
        super().__init__()
        self.logit_softcap = hp.logit_softcap
        self.tok_emb = nn.Embedding(hp.vocab_size, hp.model_dim)
        self.num_encoder_layers = hp.num_layers // 2
        self.num_decoder_layers = hp.num_layers - self.num_encoder_layers
        num_skips = min(self.num_encoder_layers, self.num_decoder_layers)
        self.skip_weights = nn.Parameter(torch.ones(num_skips, hp.model_dim))
        self.blocks = nn.ModuleList(Block(hp) for _ in range(hp.num_layers))
        self.lm_head = None if hp.tie_embeddings else CastedLinear(hp.model_dim, hp.vocab_size, bias=False)
        if hp.tie_embeddings:
            nn.init.normal_(self.tok_emb.weight, mean=0.0, std=hp.tied_embed_init_std)
        else:
            nn.init.zeros_(self.lm_head.weight)

    def logits(self, idx: Tensor) -> Tensor:
        x = self.tok_emb(idx)  # (B, T, C)
        if torch.is_autocast_enabled(x.device.type):  # keep the residual stream in the autocast dtype
            x = x.to(torch.get_autocast_dtype(x.device.type))
        x = rms_norm(x)
        x0 = x
        skips = []
        for block in self.blocks[:self.num_encoder_layers]:
            x = block(x, x0)
            skips.append(x)
        for i, block in enumerate(self.blocks[self.num_encoder_layers:]):
            if skips:  # U-Net: the deepest encoder output meets the first decoder block
                x = x + self.skip_weights[i].to(x.dtype) * skips.pop()
            x = block(x, x0)
        x = rms_norm(x)
        weight = self.tok_emb.weight if self.lm_head is None else self.lm_head.weight
        logits = F.linear(x, weight.to(x.dtype)).float()  # (B, T, V)
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)

    def forward(self, idx: Tensor, targets: Tensor, reduction: str = "mean") -> Tensor:
        logits = self.logits(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)


def enable_late_qat(model: GPT, bits: int) -> list[CastedLinear]:
    """Give every block matrix its QAT switch (off until the loop turns it on); returns them."""
    layers = [m for m in model.blocks.modules() if isinstance(m, CastedLinear)]
    for layer in layers:
        layer.enable_qat(bits)
    return layers


def count_flops_per_token(model: GPT, hp: Hyperparameters) -> float:
    # 6N for the matmuls (the tied embedding is counted once, as the head), plus attention's
    # QK^T and AV without a causal discount (PaLM appendix B).
    params = sum(p.numel() for p in model.parameters())
    return 6 * params + 12 * hp.num_layers * hp.model_dim * hp.train_seq_len


# ---- EVALUATION ----


@torch.no_grad()
def evaluate(model: nn.Module, val_tokens: Tensor, luts: ByteLuts, hp: Hyperparameters, layout: Layout,
             sliding: bool = False) -> tuple[float, float]:
    """val_loss (nats per token) and val_bpb over the whole validation split, scored in windows of
    seq_len tokens. Each window scores the targets after the previous window's, so every token is
    scored exactly once: with stride = seq_len (plain) windows do not overlap; with a sliding
    stride each scored token sees at least seq_len - stride tokens of context, except in the
    first window, which scores all of its tokens. Ranks take contiguous runs of windows; the
    float64 sums are reduced."""
    seq_len = (hp.eval_seq_len or hp.train_seq_len) if sliding else hp.train_seq_len
    stride = (hp.eval_stride or seq_len) if sliding else seq_len
    num_targets = val_tokens.numel() - 1
    if num_targets < seq_len:
        raise ConfigError(f"EVAL_SEQ_LEN={seq_len} is longer than the validation split ({num_targets} targets)")
    ends = list(range(seq_len, num_targets, stride)) + [num_targets]  # window k scores targets ends[k-1]..ends[k]
    scored = [ends[0]] + [b - a for a, b in zip(ends, ends[1:])]
    first = len(ends) * layout.rank // layout.world_size
    last = len(ends) * (layout.rank + 1) // layout.world_size
    batch_windows = max(1, hp.val_batch_size // (layout.world_size * layout.grad_accum_steps) // seq_len)
    positions = torch.arange(seq_len, device=layout.device)
    acc = torch.device("cpu") if layout.device.type == "mps" else layout.device  # MPS has no float64
    sums = torch.zeros(3, dtype=torch.float64, device=acc)  # loss, tokens, bytes
    was_training = model.training
    model.eval()
    for i in range(first, last, batch_windows):
        batch = range(i, min(i + batch_windows, last))
        windows = torch.stack([val_tokens[ends[k] - seq_len:ends[k] + 1] for k in batch])
        windows = windows.to(layout.device, torch.int64, non_blocking=True)
        x, y = windows[:, :-1], windows[:, 1:]  # (B, T)
        num_scored = torch.tensor([scored[k] for k in batch], device=layout.device)
        mask = positions[None, :] >= seq_len - num_scored[:, None]  # (B, T): the last num_scored
        with autocast(layout):
            losses = model(x, y, reduction="none").detach().view_as(mask)
        losses, mask, num_bytes = (t.to(acc) for t in (losses, mask, count_target_bytes(x, y, luts)))
        sums[0] += losses.double()[mask].sum()
        sums[1] += mask.sum()
        sums[2] += num_bytes[mask].sum()
    if layout.distributed:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    model.train(was_training)
    loss_sum, tokens, num_bytes = sums.tolist()
    if num_bytes == 0:
        raise ConfigError(f"TOKENIZER_PATH={hp.tokenizer_path}: the validation tokens stand for 0 bytes; is it the "
                          "tokenizer that made DATA_PATH's shards?")
    val_loss = loss_sum / tokens
    return val_loss, val_loss / math.log(2.0) * tokens / num_bytes


def autocast(layout: Layout):
    return torch.autocast(device_type=layout.device.type, dtype=torch.bfloat16, enabled=layout.use_bf16)


# ---- EXPORT: LOW-BIT WEIGHTS + COMPRESSION ----

# Tensors up to this size stay in float. Every matrix of the 9x512 default is far larger; at width
# 256 the attention matrices (32k-65k) must be quantized too, or they dominate the artifact.
KEEP_FLOAT_MAX_NUMEL = 16_384
QUANT_BITS_CHOICES = (4, 5, 6, 8)
# Each row's clip is the fraction of its max |w| below with the least reconstruction error: at low
# widths, clipping a few outliers buys finer steps for everything else (GPTQ-lite clip search).
CLIP_FRACTIONS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6)
COMPRESSORS = {
    "zlib": (lambda raw: zlib.compress(raw, level=9), zlib.decompress),
    "lzma": (lambda raw: lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME), lzma.decompress),
}


def export_tag(hp: Hyperparameters) -> str:
    return f"int{hp.quant_bits}_{hp.compressor}"  # names the log lines: final_int6_lzma_roundtrip_exact


def round_to_fp16(x: Tensor) -> Tensor:
    """Positive fp32 values in fp16's normal range, rounded to the nearest fp16 (ties to even) and
    kept in fp32. Integer ops because torch.compile drops a .half().float() round trip, and QAT
    must see the scales the export stores."""
    bits = x.float().view(torch.int32)
    return ((bits + 0x0FFF + ((bits >> 13) & 1)) & -0x2000).view(torch.float32)


def quantize_rows(w: Tensor, bits: int) -> tuple[Tensor, Tensor]:
    """Per-row symmetric quantization of a 2-D float tensor to integers in [-qmax, qmax], with the
    clip searched per row. Returns (q as float, scale (rows,) as stored in fp16)."""
    qmax = 2 ** (bits - 1) - 1
    absmax = w.abs().amax(dim=1, keepdim=True)  # (R, 1)
    fractions = torch.tensor(CLIP_FRACTIONS, device=w.device, dtype=w.dtype)[:, None, None]  # (K, 1, 1)
    # scales as stored in fp16, floored at its smallest normal so an all-zero row cannot divide by zero
    scales = round_to_fp16((absmax * fractions / qmax).clamp(2.0 ** -14, 65504.0))  # (K, R, 1)
    q = torch.clamp(torch.round(w / scales), -qmax, qmax)  # (K, R, C)
    best = (q * scales - w).square().sum(dim=2).argmin(dim=0)  # (R,)
    rows = torch.arange(w.size(0), device=w.device)
    return q[best, rows], scales[best, rows, 0]


def fake_quantize(w: Tensor, bits: int) -> Tensor:
    """The export's round trip in the forward pass, with a straight-through gradient (late QAT)."""
    q, scale = quantize_rows(w.detach(), bits)
    return w + (q * scale[:, None] - w).detach()


def pack_bits(q: Tensor, bits: int) -> Tensor:
    """Integers in [-(2^(b-1)-1), 2^(b-1)-1] -> a dense little-endian bitstream of `bits` per value."""
    unsigned = (q.flatten().to(torch.int16) + 2 ** (bits - 1) - 1).to(torch.uint8).numpy()
    planes = np.unpackbits(unsigned[:, None], axis=1, bitorder="little")[:, :bits]  # (N, bits)
    return torch.from_numpy(np.packbits(planes.reshape(-1), bitorder="little"))


def unpack_bits(packed: Tensor, bits: int, numel: int) -> Tensor:
    planes = np.unpackbits(packed.numpy(), bitorder="little")[:numel * bits].reshape(numel, bits)
    unsigned = np.packbits(planes, axis=1, bitorder="little")[:, 0]  # pads each row back to 8 bits
    return torch.from_numpy(unsigned.astype(np.int16) - (2 ** (bits - 1) - 1))


def quantize_state_dict(state_dict: dict[str, Tensor], bits: int, embed_bits: int) -> dict:
    """Large float matrices -> bit-packed per-row integers with fp16 scales; small tensors -> fp16,
    but control tensors (gains, mixes) stay fp32 since they are few and sensitive."""
    packed, scales, floats, dtypes, shapes, widths = {}, {}, {}, {}, {}, {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().cpu()
        dtypes[name] = str(tensor.dtype).removeprefix("torch.")
        if not tensor.is_floating_point():
            floats[name] = tensor
        elif tensor.ndim != 2 or tensor.numel() <= KEEP_FLOAT_MAX_NUMEL:
            keep_fp32 = any(key in name for key in CONTROL_PARAM_NAMES)
            floats[name] = tensor.float() if keep_fp32 else tensor.half()
        else:
            widths[name] = embed_bits if name == "tok_emb.weight" else bits
            q, scale = quantize_rows(tensor.float(), widths[name])
            packed[name], scales[name], shapes[name] = pack_bits(q, widths[name]), scale.half(), list(tensor.shape)
    return {"format": "packed_rows_v1", "packed": packed, "scales": scales, "shapes": shapes, "bits": widths,
            "floats": floats, "dtypes": dtypes}


def dequantize_state_dict(obj: dict) -> dict[str, Tensor]:
    out = {}
    for name, dtype in obj["dtypes"].items():
        if name in obj["packed"]:
            rows, cols = obj["shapes"][name]
            q = unpack_bits(obj["packed"][name], obj["bits"][name], rows * cols).view(rows, cols)
            tensor = q.float() * obj["scales"][name].float()[:, None]
        else:
            tensor = obj["floats"][name]
        out[name] = tensor.to(getattr(torch, dtype))
    return out


def save_artifact(state_dict: dict[str, Tensor], path: Path, hp: Hyperparameters) -> bytes:
    buffer = io.BytesIO()
    torch.save(quantize_state_dict(state_dict, hp.quant_bits, hp.embed_quant_bits), buffer)
    blob = COMPRESSORS[hp.compressor][0](buffer.getvalue())
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    return blob


def load_artifact(path) -> dict[str, Tensor]:
    """Read an artifact back without executing pickled code (weights_only). The compressor is
    recognized by its magic bytes."""
    blob = Path(path).read_bytes()
    raw = lzma.decompress(blob) if blob.startswith(b"\xfd7zXZ") else zlib.decompress(blob)
    return dequantize_state_dict(torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True))


# ---- LOGGING ----


class RunLog:
    """Console lines from rank 0, mirrored into logs/<RUN_ID>.txt after the script's own source."""

    def __init__(self, path: Path | None):
        self.path = path

    def write_header(self, source: bytes, hp: Hyperparameters, layout: Layout, command: str) -> None:
        digest = hashlib.sha256(source).hexdigest()
        with open(self.path, "xb") as f:  # "x": never overwrite an earlier run's log
            f.write(f"==== train_gpt.py source bytes:{len(source)} sha256:{digest} ====\n".encode())
            f.write(source)
            f.write(b"\n==== end of source ====\n")
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
        lines = [f"hardware: cuda: {layout.world_size}x {torch.cuda.get_device_name(layout.device)}"]
        try:
            smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
            lines += smi.rstrip().splitlines()
        except (OSError, subprocess.SubprocessError):
            pass
        return lines
    cpu_name = platform.processor() or platform.machine()
    try:
        cpu_name = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return [f"hardware: {layout.device.type}: {cpu_name}, {os.cpu_count()} logical cores, "
            f"{torch.get_num_threads()} torch threads per process x {layout.world_size} processes"]


def misspelled_settings(environ=None) -> list[str]:
    """Env vars a typo away from a setting: NUM_LAYER=11 would otherwise be silently ignored."""
    environ = os.environ if environ is None else environ
    names = Hyperparameters.env_names()
    return [f"{key} (did you mean {match[0]}?)" for key in environ
            if key not in names and (match := difflib.get_close_matches(key, names, n=1, cutoff=0.9))]


def launch_command(environ=None) -> str:
    """The command that reproduces this run: the env vars it set, then the launcher."""
    environ = os.environ if environ is None else environ
    settings = [f"{name}={shlex.quote(environ[name])}" for name in sorted(Hyperparameters.env_names())
                if name in environ]
    if "LOCAL_WORLD_SIZE" in environ:  # set by torchrun
        launcher = f"torchrun --standalone --nproc_per_node={environ['LOCAL_WORLD_SIZE']} {Path(__file__).name}"
    else:
        launcher = f"python {Path(__file__).name}"
    return " ".join(settings + [launcher])


# ---- CHECKPOINTS AND SAMPLES ----

MODEL_SHAPE_SETTINGS = ("vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult",
                        "tie_embeddings", "rope_base", "logit_softcap")
SAMPLE_PROMPTS = ("The President", "Congress shall", "In the year 1850,")
BOS_ID = 1


@dataclass
class LoopState:
    """Where training stands: with the weights, optimizer states and data position, all a resume needs."""
    step: int = 0
    training_time_ms: float = 0.0  # training only: validation, checkpoints and samples are excluded
    elapsed_ms: float = 0.0  # the clock all ranks agreed on after the last step
    qat_active: bool = False


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
    meta = json.loads((folder / "meta.json").read_text())
    for name in MODEL_SHAPE_SETTINGS:
        if meta["hyperparameters"][name] != getattr(hp, name):
            raise ConfigError(f"RESUME={folder}: the checkpoint has {name.upper()}={meta['hyperparameters'][name]} "
                              f"but this run has {name.upper()}={getattr(hp, name)}; set it to match")
    newer = [p for p in checkpoint_folders(Path(hp.checkpoint_dir) / hp.run_id) if p.name > folder.name]
    if meta["run_id"] == hp.run_id and newer:  # its next checkpoints would interleave with another history
        raise ConfigError(f"RESUME={folder}: RUN_ID={hp.run_id} already has later checkpoints ({newer[-1].name}); "
                          "resume the newest with RESUME=latest, or continue this one under a new RUN_ID")
    hp.resume = str(folder)
    return meta


def save_checkpoint(hp: Hyperparameters, layout: Layout, model: GPT, adam, muon: Muon, ema, state: LoopState,
                    loader: DistributedTokenLoader, source_sha256: str) -> Path:
    """Every rank writes into step_N.tmp/, which is renamed to step_N/ once complete, so a write
    killed halfway leaves the earlier checkpoints as they were. Plain tensors and JSON only."""
    root = Path(hp.checkpoint_dir) / hp.run_id
    folder, tmp = root / f"step_{state.step:06d}", root / f"step_{state.step:06d}.tmp"
    if layout.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(layout)
    muon_state = muon.state_dict()["state"]  # a rank holds the momentum of the matrices it orthogonalizes
    torch.save({i: v for i, v in muon_state.items() if i % layout.world_size == layout.rank},
               tmp / f"muon_rank{layout.rank}.pt")
    if layout.is_main:
        torch.save({"model": model.state_dict(), "adam": adam.state_dict(), "ema": ema.params if ema else None,
                    "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state(layout.device) if layout.device.type == "cuda" else None},
                   tmp / "state.pt")
        meta = dict(run_id=hp.run_id, source_sha256=source_sha256, world_size=layout.world_size,
                    loader=loader.stream.position(), hyperparameters=dataclasses.asdict(hp),
                    **dataclasses.asdict(state))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    barrier(layout)
    if layout.is_main:
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        stale = [p for p in root.glob("step_*.tmp") if p != tmp]  # writes that were killed halfway
        for old in stale + (checkpoint_folders(root)[:-hp.keep_checkpoints] if hp.keep_checkpoints else []):
            shutil.rmtree(old)
    barrier(layout)
    return folder


def load_checkpoint(folder: Path, layout: Layout, model: GPT, adam, muon: Muon, ema,
                    loader: DistributedTokenLoader) -> LoopState:
    """Restore a checkpoint into this run, whatever its world size (Muon's momentum is gathered
    from every rank's file; each rank then keeps using the part it owns)."""
    meta = json.loads((folder / "meta.json").read_text())
    saved = torch.load(folder / "state.pt", map_location=layout.device, weights_only=True)
    model.load_state_dict(saved["model"])
    # only the state: learning rates, betas and the like come from this run's settings
    adam.load_state_dict({"state": saved["adam"]["state"], "param_groups": adam.state_dict()["param_groups"]})
    muon_state = {}
    for path in sorted(folder.glob("muon_rank*.pt")):
        muon_state.update(torch.load(path, map_location=layout.device, weights_only=True))
    muon.load_state_dict({"state": muon_state, "param_groups": muon.state_dict()["param_groups"]})
    if ema:  # a run that turns the EMA on at the resume starts it from the resumed weights
        torch._foreach_copy_(ema.params, saved["ema"] or [p.detach() for p in model.parameters()])
    torch.set_rng_state(saved["rng"].cpu())
    if saved["cuda_rng"] is not None and layout.device.type == "cuda":
        torch.cuda.set_rng_state(saved["cuda_rng"].cpu(), layout.device)
    loader.stream.seek(meta["loader"])
    return LoopState(**{f.name: meta[f.name] for f in fields(LoopState)})


def load_codec(tokenizer_path) -> tuple:
    """(encode, decode) between text and ids, for a SentencePiece .model or the byte tokenizer."""
    path = Path(tokenizer_path)
    if path.suffix == ".json":
        offset = int(json.loads(path.read_text())["byte_offset"])
        return (lambda text: [b + offset for b in text.encode("utf-8")],
                lambda ids: bytes(i - offset for i in ids if offset <= i < offset + 256).decode("utf-8", "replace"))
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(path))
    return sp.encode, sp.decode


@torch.no_grad()
def sample(model: GPT, codec, hp: Hyperparameters, layout: Layout, new_tokens: int = 32) -> list[str]:
    """Greedy continuations of fixed prompts, so a user sees what the model learned."""
    encode, decode = codec
    was_training = model.training
    model.eval()
    texts = []
    for prompt in SAMPLE_PROMPTS:
        ids = [BOS_ID] + encode(prompt)
        for _ in range(new_tokens):
            x = torch.tensor([ids[-hp.train_seq_len:]], device=layout.device)
            with autocast(layout):
                ids.append(int(model.logits(x)[0, -1].argmax()))
        texts.append(decode(ids[1:]))
    model.train(was_training)
    return texts


class StopSignal:
    """The first SIGTERM or SIGINT asks the loop to finish its step, checkpoint and exit; a second
    one exits at once."""

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


def lr_schedule(step: int, elapsed_ms: float, hp: Hyperparameters) -> float:
    """LR multiplier: 1, then linear to 0 over the last WARMDOWN_ITERS steps, or, under a wallclock
    cap, over the last WARMDOWN_ITERS * (average step time) of it, whichever comes first."""
    if hp.warmdown_iters <= 0:
        return 1.0
    by_steps = min(1.0, max(hp.iterations - step, 0) / hp.warmdown_iters)
    if hp.max_wallclock_seconds <= 0:
        return by_steps
    warmdown_ms = hp.warmdown_iters * elapsed_ms / max(step, 1)
    remaining_ms = max(1000.0 * hp.max_wallclock_seconds - elapsed_ms, 0.0)
    by_time = remaining_ms / warmdown_ms if remaining_ms < warmdown_ms else 1.0
    return min(by_steps, by_time)


def muon_momentum(step: int, hp: Hyperparameters) -> float:
    if hp.muon_momentum_warmup_steps <= 0:
        return hp.muon_momentum
    frac = min(step / hp.muon_momentum_warmup_steps, 1.0)
    return (1 - frac) * hp.muon_momentum_warmup_start + frac * hp.muon_momentum


class EMA:
    """Exponential moving average of the weights, updated on device after every step (no host
    sync); swap() exchanges it with the live weights, and a second swap() undoes the first."""

    def __init__(self, model: nn.Module, decay: float):
        self.decay = decay
        self.params = [p.detach().clone() for p in model.parameters()]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        torch._foreach_lerp_(self.params, [p.detach() for p in model.parameters()], 1.0 - self.decay)

    @torch.no_grad()
    def swap(self, model: nn.Module) -> None:
        for p, ema in zip(model.parameters(), self.params):
            live = p.detach().clone()
            p.copy_(ema)
            ema.copy_(live)


def build_optimizers(model: GPT, hp: Hyperparameters, layout: Layout) -> tuple[list[torch.optim.Optimizer], Muon]:
    """Muon for the 2-D matrices inside the blocks; Adam for the embedding, the untied head and
    every vector or control parameter."""
    matrices, scalars = [], []
    for name, p in model.blocks.named_parameters():
        is_control = any(key in name for key in CONTROL_PARAM_NAMES)
        (matrices if p.ndim == 2 and not is_control else scalars).append(p)
    scalars.append(model.skip_weights)
    adam_groups = [
        dict(params=[model.tok_emb.weight], lr=hp.tied_embed_lr if hp.tie_embeddings else hp.embed_lr),
        dict(params=scalars, lr=hp.scalar_lr),
    ]
    if model.lm_head is not None:
        adam_groups.append(dict(params=[model.lm_head.weight], lr=hp.head_lr))
    adam = torch.optim.Adam(adam_groups, betas=(hp.beta1, hp.beta2), eps=hp.adam_eps,
                            fused=layout.device.type == "cuda")
    muon = Muon(matrices, lr=hp.matrix_lr, momentum=hp.muon_momentum, backend_steps=hp.muon_backend_steps,
                update_dtype=torch.bfloat16 if layout.use_bf16 else torch.float32)
    optimizers = [adam, muon]
    for opt in optimizers:
        for group in opt.param_groups:
            group["base_lr"] = group["lr"]
    return optimizers, muon


def train_step(model: nn.Module, loader: DistributedTokenLoader, optimizers, hp: Hyperparameters,
               layout: Layout, lr_scale: float) -> Tensor:
    """One optimizer step over GRAD_ACCUM_STEPS micro-batches; returns the mean train loss."""
    total = torch.zeros((), device=layout.device)
    for micro in range(layout.grad_accum_steps):
        if layout.distributed:  # all-reduce gradients only once, after the last micro-step
            model.require_backward_grad_sync = micro == layout.grad_accum_steps - 1
        x, y = loader.next_batch(hp.train_batch_tokens, hp.train_seq_len, layout.grad_accum_steps)
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


def setup(environ=None) -> tuple[Hyperparameters, Layout]:
    """Every check that can fail runs here, on every rank, before any process group or model."""
    environ = os.environ if environ is None else environ
    hp = Hyperparameters.from_env(environ)
    world_size = int(environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(environ.get("RANK", "0")), int(environ.get("LOCAL_RANK", "0"))
    accum = resolve_grad_accum(hp, world_size)
    if not Path(hp.data_path).is_dir():
        raise ConfigError(f"DATA_PATH={hp.data_path} is not a directory. {DATA_HINT}")
    shard_files(os.path.join(hp.data_path, "fineweb_train_*.bin"), "training")
    shard_files(os.path.join(hp.data_path, "fineweb_val_*.bin"), "validation")
    load_tokenizer_luts(hp.tokenizer_path, hp.vocab_size)
    meta = resolve_resume(hp)
    log_path = Path(hp.log_dir) / f"{hp.run_id}.txt"
    if hp.run_id and log_path.exists():
        # a resumed run continues its own log, if the script is still the one the log holds
        same_script = meta and meta["source_sha256"] == hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
        if not (meta and meta["run_id"] == hp.run_id and same_script):
            raise ConfigError(f"RUN_ID={hp.run_id}: {log_path} already exists; choose another RUN_ID or move the "
                              "old log away" + (" (the script changed since the checkpoint)" if meta else ""))
    device = pick_device(local_rank)
    layout = Layout(rank, world_size, local_rank, world_size > 1, device, accum,
                    resolve_mode(hp.compile, device), resolve_mode(hp.bf16, device))
    return hp, layout


def main() -> None:
    hp, layout = setup()
    device = layout.device
    source = Path(__file__).read_bytes()  # read once: the logged and the counted code are the same bytes
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.enable_flash_sdp(True)
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(not layout.use_bf16)  # flash takes only 16-bit inputs
    if layout.distributed:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    run_id = [hp.run_id or str(uuid.uuid4())]
    if layout.distributed:  # every rank must name the same log and artifact
        dist.broadcast_object_list(run_id, src=0)
    hp.run_id = run_id[0]
    log = RunLog(None)
    if layout.is_main:
        Path(hp.log_dir).mkdir(parents=True, exist_ok=True)
        log = RunLog(Path(hp.log_dir) / f"{hp.run_id}.txt")
        if log.path.exists():  # setup() let it through: a resume continues its own run's log
            log(f"command: {launch_command()}")
        else:
            log.write_header(source, hp, layout, launch_command())
        for typo in misspelled_settings():
            log(f"WARNING: env var {typo} is not a setting and was ignored")
        print(f"logfile: {log.path}")

    torch.manual_seed(hp.seed)
    luts = load_tokenizer_luts(hp.tokenizer_path, hp.vocab_size).to(device)
    val_tokens = load_validation_tokens(os.path.join(hp.data_path, "fineweb_val_*.bin"), hp.train_seq_len)
    train_pattern = os.path.join(hp.data_path, "fineweb_train_*.bin")
    log(f"val_tokens:{val_tokens.numel() - 1} train_shards:{len(shard_files(train_pattern, 'training'))}")

    base_model = GPT(hp).to(device)
    log(f"model_params:{sum(p.numel() for p in base_model.parameters())}")
    qat_layers = enable_late_qat(base_model, hp.quant_bits) if hp.qat_start_frac < 1.0 else []
    optimizers, muon = build_optimizers(base_model, hp, layout)
    compiled = base_model
    if layout.use_compile:
        compiled = torch.compile(base_model, dynamic=False, fullgraph=True)
        muon.orthogonalize = torch.compile(zeropower_via_newtonschulz5)
    model = compiled
    if layout.distributed:
        model = DDP(compiled, device_ids=[layout.local_rank] if device.type == "cuda" else None)
    loader = DistributedTokenLoader(train_pattern, layout.rank, layout.world_size, device)

    # Warmup primes compilation and allocator; then weights, optimizer states and data restart, so
    # these steps cost time but do not change the run.
    if hp.warmup_steps > 0:
        initial_model = copy.deepcopy(base_model.state_dict())
        initial_optimizers = [copy.deepcopy(opt.state_dict()) for opt in optimizers]
        for warmup_step in range(hp.warmup_steps):
            train_step(model, loader, optimizers, hp, layout, lr_scale=1.0)
            if warmup_step + 1 in (1, hp.warmup_steps):
                log(f"warmup_step:{warmup_step + 1}/{hp.warmup_steps}")
        base_model.load_state_dict(initial_model)
        for opt, state in zip(optimizers, initial_optimizers):
            opt.load_state_dict(state)
        del initial_model, initial_optimizers
        loader = DistributedTokenLoader(train_pattern, layout.rank, layout.world_size, device)

    ema = EMA(base_model, hp.ema_decay) if hp.ema_decay > 0 else None
    state, stop_after_step = LoopState(), None
    if hp.resume:
        state = load_checkpoint(Path(hp.resume), layout, base_model, optimizers[0], muon, ema, loader)
        log(f"resume: from {hp.resume} at step:{state.step} train_time:{state.training_time_ms:.0f}ms")
        if hp.max_wallclock_seconds > 0 and state.elapsed_ms >= 1000.0 * hp.max_wallclock_seconds:
            stop_after_step = state.step  # the budget was spent before the checkpoint
    for module in qat_layers:
        module.qat_on.fill_(float(state.qat_active))
    codec = load_codec(hp.tokenizer_path) if hp.sample_every > 0 else None
    stop_signal = StopSignal()
    flops_per_token, peak = count_flops_per_token(base_model, hp), peak_flops(device)
    max_wallclock_ms = 1000.0 * hp.max_wallclock_seconds
    source_sha256 = hashlib.sha256(source).hexdigest()
    first_step = state.step

    def pause_clock():  # validation, checkpoints and samples do not count as training time
        synchronize(device)
        state.training_time_ms += 1000.0 * (time.perf_counter() - t0)

    def checkpoint(reason: str) -> Path:
        folder = save_checkpoint(hp, layout, base_model, optimizers[0], muon, ema, state, loader, source_sha256)
        log(f"checkpoint: {folder} step:{state.step} ({reason})")
        return folder

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
            val_loss, val_bpb = evaluate(compiled, val_tokens, luts, hp, layout)
            if ema:
                ema.swap(base_model)
            log(f"step:{step}/{hp.iterations} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} "
                f"train_time:{state.training_time_ms:.0f}ms step_avg:{state.training_time_ms / max(step, 1):.2f}ms")
            synchronize(device)
            t0 = time.perf_counter()
        if last_step:
            if stop_after_step is not None and step < hp.iterations:
                log(f"stopping_early: wallclock_cap train_time:{state.training_time_ms:.0f}ms "
                    f"step:{step}/{hp.iterations}")
            break

        for group in muon.param_groups:
            group["momentum"] = muon_momentum(step, hp)
        train_loss = train_step(model, loader, optimizers, hp, layout, lr_schedule(step, state.elapsed_ms, hp))
        if ema:
            ema.update(base_model)
        state.step = step = step + 1

        state.elapsed_ms = state.training_time_ms + 1000.0 * (time.perf_counter() - t0)
        if hp.train_log_every > 0 and (step <= 10 or step % hp.train_log_every == 0):
            tokens_per_s = hp.train_batch_tokens * step / (state.elapsed_ms / 1000.0)
            line = (f"step:{step}/{hp.iterations} train_loss:{train_loss.item():.4f} "
                    f"train_time:{state.elapsed_ms:.0f}ms step_avg:{state.elapsed_ms / step:.2f}ms tok/s:{tokens_per_s:.0f}")
            if peak is not None:
                line += f" mfu:{100 * flops_per_token * tokens_per_s / (peak * layout.world_size):.1f}%"
            log(line)
        signum = stop_signal.signum
        if layout.distributed:
            # one clock and one signal for all ranks: the same LR, stop, QAT and checkpoint step everywhere
            agreed = torch.tensor([state.elapsed_ms, signum], dtype=torch.float64, device=device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
            state.elapsed_ms, signum = agreed[0].item(), int(agreed[1].item())
        if stop_after_step is None and max_wallclock_ms > 0 and state.elapsed_ms >= max_wallclock_ms:
            stop_after_step = step
        progress = max(step / max(hp.iterations, 1), state.elapsed_ms / max_wallclock_ms if max_wallclock_ms else 0)
        if qat_layers and not state.qat_active and progress >= hp.qat_start_frac:
            state.qat_active = True
            for module in qat_layers:
                module.qat_on.fill_(1.0)
            log(f"late_qat: on from step:{step} int{hp.quant_bits} fake quantization of the block matrices")
        periodic_save = hp.save_every > 0 and (step % hp.save_every == 0 or step in (hp.iterations, stop_after_step))
        periodic_sample = hp.sample_every > 0 and step % hp.sample_every == 0 and step < hp.iterations
        if signum or periodic_save or periodic_sample:
            pause_clock()
            if periodic_sample and layout.is_main:
                for text in sample(base_model, codec, hp, layout):
                    log(f"sample: {text!r}")
            if signum or periodic_save:
                folder = checkpoint(signal.Signals(signum).name if signum else "periodic")
            if signum:
                resume = launch_command({**os.environ, "RESUME": str(folder), "RUN_ID": hp.run_id})
                log(f"stopped by {signal.Signals(signum).name} after step:{step}; resume with: {resume}")
                barrier(layout)
                if layout.distributed:
                    dist.destroy_process_group()
                sys.exit(128 + signum)
            synchronize(device)
            t0 = time.perf_counter()

    if device.type == "cuda":
        log(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 2**20} MiB "
            f"reserved: {torch.cuda.max_memory_reserved() // 2**20} MiB")

    # Export, then score what was exported: the number that counts is the round-tripped model's.
    if ema:
        ema.swap(base_model)
    tag = export_tag(hp)
    artifact_path = Path(hp.log_dir) / f"{hp.run_id}_model.{tag}.ptz"
    if layout.is_main:
        blob = save_artifact(base_model.state_dict(), artifact_path, hp)
        total_bytes = len(source) + artifact_path.stat().st_size
        log(f"Serialized model {tag.replace('_', '+')}: {len(blob)} bytes")
        log(f"Code size: {len(source)} bytes")
        log(f"Total submission size {tag.replace('_', '+')}: {total_bytes} bytes")
        log(f"artifact: {artifact_path.as_posix()} bytes:{len(blob)} sha256:{hashlib.sha256(blob).hexdigest()}")
        if total_bytes > 16_000_000:
            log(f"WARNING: submission is {total_bytes} bytes, over the 16,000,000-byte cap by "
                f"{total_bytes - 16_000_000} bytes; it cannot be a record")
    if layout.distributed:
        dist.barrier()
    base_model.load_state_dict(load_artifact(artifact_path), strict=True)
    for module in qat_layers:  # the weights are quantized now; fake quantization would only cost time
        module.qat_on.fill_(0.0)
    for name, sliding in [("roundtrip", False)] + [("sliding_window", True)] * (hp.eval_stride > 0):
        synchronize(device)
        t_eval = time.perf_counter()
        val_loss, val_bpb = evaluate(compiled, val_tokens, luts, hp, layout, sliding=sliding)
        synchronize(device)
        log(f"final_{tag}_{name} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} "
            f"eval_time:{1000.0 * (time.perf_counter() - t_eval):.0f}ms")
        log(f"final_{tag}_{name}_exact val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f}")
    if hp.sample_every > 0 and layout.is_main:  # what the exported model writes
        for text in sample(base_model, codec, hp, layout):
            log(f"sample: {text!r}")
    if layout.distributed:
        dist.barrier()  # without it, gloo tears down while a peer is still in its last collective
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except ConfigError as e:
        sys.exit(f"train_gpt.py: error: {e}")
