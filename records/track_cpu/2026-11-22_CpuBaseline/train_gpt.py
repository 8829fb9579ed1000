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
import glob
import hashlib
import io
import json
import math
import os
import platform
import shlex
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
    # execution: auto = compile and bf16 on CUDA; on CPU the measured fastest (README, "Measurements")
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
        positive = ["iterations", "train_batch_tokens", "train_seq_len", "val_batch_size", "vocab_size",
                    "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult", "muon_backend_steps"]
        for name in positive:
            if getattr(self, name) <= 0 and not (name == "iterations" and self.iterations == 0):
                raise ConfigError(f"{name.upper()}={getattr(self, name)} must be positive")
        for name in ["warmdown_iters", "warmup_steps", "val_loss_every", "train_log_every", "grad_accum_steps",
                     "muon_momentum_warmup_steps", "max_wallclock_seconds", "grad_clip_norm"]:
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.upper()}={getattr(self, name)} must be >= 0 (0 turns it off)")
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
        for name in ("compile", "bf16"):
            if getattr(self, name) not in ("auto", "0", "1"):
                raise ConfigError(f"{name.upper()}={getattr(self, name)!r} must be auto, 0 or 1")


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
    # CPU default from the measurements in the README: eager fp32 was fastest on 2 cores.
    return setting == "1" if setting != "auto" else device.type == "cuda"


# Dense bf16 peak per GPU, for MFU. Unknown GPUs get no MFU field rather than a made-up one.
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


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
                    buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
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
    """Weights stay fp32 for the optimizer; the matmul runs in the activations' dtype."""

    def forward(self, x: Tensor) -> Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        return F.linear(x, self.weight.to(x.dtype), bias)


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
        x = rms_norm(self.tok_emb(idx))  # (B, T, C)
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

    def forward(self, idx: Tensor, targets: Tensor) -> Tensor:
        logits = self.logits(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def count_flops_per_token(model: GPT, hp: Hyperparameters) -> float:
    # 6N for the matmuls (the tied embedding is counted once, as the head), plus attention's
    # QK^T and AV without a causal discount (PaLM appendix B).
    params = sum(p.numel() for p in model.parameters())
    return 6 * params + 12 * hp.num_layers * hp.model_dim * hp.train_seq_len


# ---- EVALUATION ----


@torch.no_grad()
def evaluate(model: nn.Module, val_tokens: Tensor, luts: ByteLuts, hp: Hyperparameters, layout: Layout
             ) -> tuple[float, float]:
    """val_loss (nats per token) and val_bpb over the whole validation split; each rank scores a
    contiguous range of sequences and the float64 sums are reduced."""
    seq_len = hp.train_seq_len
    batch_seqs = hp.val_batch_size // (layout.world_size * layout.grad_accum_steps) // seq_len
    total_seqs = (val_tokens.numel() - 1) // seq_len
    first = total_seqs * layout.rank // layout.world_size
    last = total_seqs * (layout.rank + 1) // layout.world_size
    sums = torch.zeros(3, dtype=torch.float64, device=layout.device)  # loss, tokens, bytes
    was_training = model.training
    model.eval()
    for start in range(first, last, batch_seqs):
        end = min(start + batch_seqs, last)
        local = val_tokens[start * seq_len:end * seq_len + 1].to(layout.device, torch.int64, non_blocking=True)
        x, y = local[:-1].view(-1, seq_len), local[1:].view(-1, seq_len)  # (B, T)
        with autocast(layout):
            loss = model(x, y).detach()
        sums[0] += loss.double() * y.numel()
        sums[1] += y.numel()
        sums[2] += count_target_bytes(x.reshape(-1), y.reshape(-1), luts).sum()
    if layout.distributed:
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
    model.train(was_training)
    loss_sum, tokens, num_bytes = sums.tolist()
    val_loss = loss_sum / tokens
    return val_loss, val_loss / math.log(2.0) * tokens / num_bytes


def autocast(layout: Layout):
    return torch.autocast(device_type=layout.device.type, dtype=torch.bfloat16, enabled=layout.use_bf16)


# ---- EXPORT: INT8 + ZLIB ----

KEEP_FLOAT_MAX_NUMEL = 65_536  # smaller tensors are cheap to keep in float
INT8_CLIP_QUANTILE = 0.9999984  # per-row clip: ignore the rarest outliers when setting the scale


def quantize_state_dict_int8(state_dict: dict[str, Tensor]) -> dict:
    """Large float matrices -> per-row int8 with an fp16 scale; small tensors -> fp16, but control
    tensors (gains, mixes) stay fp32 since they are few and sensitive."""
    quantized, scales, floats, dtypes = {}, {}, {}, {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().cpu()
        dtypes[name] = str(tensor.dtype).removeprefix("torch.")
        if not tensor.is_floating_point():
            floats[name] = tensor
        elif tensor.ndim != 2 or tensor.numel() <= KEEP_FLOAT_MAX_NUMEL:
            keep_fp32 = any(key in name for key in CONTROL_PARAM_NAMES)
            floats[name] = tensor.float() if keep_fp32 else tensor.half()
        else:
            w = tensor.float()
            k = max(1, min(w.size(1), round(INT8_CLIP_QUANTILE * w.size(1))))
            clip = w.abs().kthvalue(k, dim=1).values.clamp_min(1e-8)  # (rows,)
            scale = (clip / 127.0).half()
            q = torch.clamp(torch.round(w / scale.float()[:, None]), -127, 127).to(torch.int8)
            quantized[name], scales[name] = q, scale
    return {"format": "int8_per_row_v1", "quantized": quantized, "scales": scales, "floats": floats,
            "dtypes": dtypes}


def dequantize_state_dict_int8(obj: dict) -> dict[str, Tensor]:
    out = {}
    for name, dtype in obj["dtypes"].items():
        if name in obj["quantized"]:
            tensor = obj["quantized"][name].float() * obj["scales"][name].float()[:, None]
        else:
            tensor = obj["floats"][name]
        out[name] = tensor.to(getattr(torch, dtype))
    return out


def save_artifact(state_dict: dict[str, Tensor], path: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(quantize_state_dict_int8(state_dict), buffer)
    blob = zlib.compress(buffer.getvalue(), level=9)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)
    return blob


def load_artifact(path) -> dict[str, Tensor]:
    """Read an artifact back without executing pickled code (weights_only)."""
    obj = torch.load(io.BytesIO(zlib.decompress(Path(path).read_bytes())), map_location="cpu", weights_only=True)
    return dequantize_state_dict_int8(obj)


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
        cpu_name = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return [f"hardware: {layout.device.type}: {cpu_name}, {os.cpu_count()} logical cores, "
            f"{torch.get_num_threads()} torch threads per process x {layout.world_size} processes"]


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
    if hp.run_id and (Path(hp.log_dir) / f"{hp.run_id}.txt").exists():
        raise ConfigError(f"RUN_ID={hp.run_id}: {Path(hp.log_dir) / (hp.run_id + '.txt')} already exists; "
                          "choose another RUN_ID or move the old log away")
    device = pick_device(local_rank)
    layout = Layout(rank, world_size, local_rank, world_size > 1, device, accum,
                    resolve_mode(hp.compile, device), resolve_mode(hp.bf16, device))
    return hp, layout


def main() -> None:
    hp, layout = setup()
    device = layout.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        from torch.backends.cuda import enable_cudnn_sdp, enable_flash_sdp, enable_math_sdp, enable_mem_efficient_sdp
        enable_flash_sdp(True), enable_cudnn_sdp(False), enable_mem_efficient_sdp(False), enable_math_sdp(False)
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
        log.write_header(Path(__file__).read_bytes(), hp, layout, launch_command())
        print(f"logfile: {log.path}")

    torch.manual_seed(hp.seed)
    np.random.seed(hp.seed)
    luts = load_tokenizer_luts(hp.tokenizer_path, hp.vocab_size).to(device)
    val_tokens = load_validation_tokens(os.path.join(hp.data_path, "fineweb_val_*.bin"), hp.train_seq_len)
    train_pattern = os.path.join(hp.data_path, "fineweb_train_*.bin")
    log(f"val_tokens:{val_tokens.numel() - 1} train_shards:{len(shard_files(train_pattern, 'training'))}")

    base_model = GPT(hp).to(device)
    log(f"model_params:{sum(p.numel() for p in base_model.parameters())}")
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
        loader = DistributedTokenLoader(train_pattern, layout.rank, layout.world_size, device)

    flops_per_token, peak = count_flops_per_token(base_model, hp), peak_flops(device)
    max_wallclock_ms = 1000.0 * hp.max_wallclock_seconds
    training_time_ms, stop_after_step, step = 0.0, None, 0
    synchronize(device)
    t0 = time.perf_counter()
    while True:
        last_step = step == hp.iterations or (stop_after_step is not None and step >= stop_after_step)
        if last_step or (hp.val_loss_every > 0 and step % hp.val_loss_every == 0):
            synchronize(device)
            training_time_ms += 1000.0 * (time.perf_counter() - t0)  # validation is not training time
            val_loss, val_bpb = evaluate(compiled, val_tokens, luts, hp, layout)
            log(f"step:{step}/{hp.iterations} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} "
                f"train_time:{training_time_ms:.0f}ms step_avg:{training_time_ms / max(step, 1):.2f}ms")
            synchronize(device)
            t0 = time.perf_counter()
        if last_step:
            if stop_after_step is not None and step < hp.iterations:
                log(f"stopping_early: wallclock_cap train_time:{training_time_ms:.0f}ms step:{step}/{hp.iterations}")
            break

        elapsed_ms = training_time_ms + 1000.0 * (time.perf_counter() - t0)
        for group in muon.param_groups:
            group["momentum"] = muon_momentum(step, hp)
        train_loss = train_step(model, loader, optimizers, hp, layout, lr_schedule(step, elapsed_ms, hp))
        step += 1

        elapsed_ms = training_time_ms + 1000.0 * (time.perf_counter() - t0)
        if hp.train_log_every > 0 and (step <= 10 or step % hp.train_log_every == 0):
            tokens_per_s = hp.train_batch_tokens * step / (elapsed_ms / 1000.0)
            line = (f"step:{step}/{hp.iterations} train_loss:{train_loss.item():.4f} train_time:{elapsed_ms:.0f}ms "
                    f"step_avg:{elapsed_ms / step:.2f}ms tok/s:{tokens_per_s:.0f}")
            if peak is not None:
                line += f" mfu:{100 * flops_per_token * tokens_per_s / (peak * layout.world_size):.1f}%"
            log(line)
        reached_cap = torch.tensor(float(max_wallclock_ms > 0 and elapsed_ms >= max_wallclock_ms), device=device)
        if layout.distributed and max_wallclock_ms > 0:  # every rank stops at the same step
            dist.all_reduce(reached_cap, op=dist.ReduceOp.MAX)
        if stop_after_step is None and reached_cap.item() > 0:
            stop_after_step = step

    if device.type == "cuda":
        log(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 2**20} MiB "
            f"reserved: {torch.cuda.max_memory_reserved() // 2**20} MiB")

    # Export, then score what was exported: the number that counts is the round-tripped model's.
    artifact_path = Path(hp.log_dir) / f"{hp.run_id}_model.int8.ptz"
    if layout.is_main:
        blob = save_artifact(base_model.state_dict(), artifact_path)
        code_bytes = len(Path(__file__).read_bytes())
        total_bytes = code_bytes + artifact_path.stat().st_size
        log(f"Serialized model int8+zlib: {len(blob)} bytes")
        log(f"Code size: {code_bytes} bytes")
        log(f"Total submission size int8+zlib: {total_bytes} bytes")
        log(f"artifact: {artifact_path.as_posix()} bytes:{len(blob)} sha256:{hashlib.sha256(blob).hexdigest()}")
        if total_bytes > 16_000_000:
            log(f"WARNING: submission is {total_bytes} bytes, over the 16,000,000-byte cap by "
                f"{total_bytes - 16_000_000} bytes; it cannot be a record")
    if layout.distributed:
        dist.barrier()
    base_model.load_state_dict(load_artifact(artifact_path), strict=True)
    synchronize(device)
    t_eval = time.perf_counter()
    val_loss, val_bpb = evaluate(compiled, val_tokens, luts, hp, layout)
    synchronize(device)
    log(f"final_int8_zlib_roundtrip val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} "
        f"eval_time:{1000.0 * (time.perf_counter() - t_eval):.0f}ms")
    log(f"final_int8_zlib_roundtrip_exact val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f}")
    if layout.distributed:
        dist.barrier()  # without it, gloo tears down while a peer is still in its last collective
        dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except ConfigError as e:
        sys.exit(f"train_gpt.py: error: {e}")
