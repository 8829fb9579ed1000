"""train_gpt.py: the Parameter Golf speedrun in one file. It trains a small GPT (the field's levers as
settings) with Muon and Adam under a wallclock cap, exports low-bit compressed weights and scores their exact
val_bpb, on 8xH100 (torchrun --standalone --nproc_per_node=8 train_gpt.py), one GPU or the CPU (README.md).
Every setting is an environment variable named as the field names it. Rank 0 writes logs/<RUN_ID>.txt: this
file, then every line. Beside it, for the operator: settings.py (checks, --help, the log's description and
errors) and checkpoints.py. The core (cap: 1500 lines): tools/build_trainer.py builds the stack on it."""

from __future__ import annotations

import copy
import dataclasses
import gc
import glob
import hashlib
import importlib
import io
import json
import math
import os
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils._pytree import tree_leaves, tree_map

BUILD = "core"  # a build of the stack: its name and the core's commit (tools/build_trainer.py)

# ---- ERRORS ----
# A bad setting or input, and a run that cannot go on, end a run with one line; a bug keeps its traceback.
class ConfigError(ValueError):
    """A bad setting or input: the variable or file, its value, and the fix."""

class RunError(RuntimeError):
    """A run that cannot go on (divergence, a full disk, a score that is not finite): what to change."""

STOPS = (ConfigError, RunError)

def require(ok, message, error=ConfigError):
    if not ok:
        raise error(message)

# ---- HYPERPARAMETERS ----
# Every setting is an environment variable, a field's name upper-cased; settings.py checks them before any work.
# The challenge's limits: the artifact's bytes (code and compressed weights), the final evaluation's time
SUBMISSION_LIMIT_BYTES = 16_000_000
EVAL_LIMIT_MS = 600_000

@dataclass
class GPTConfig:
    """The model's settings, all GPT reads (a resume must match them); --help prints each comment."""
    vocab_size: int = 1024  # must equal the tokenizer's
    num_layers: int = 9  # blocks; the first half feed U-Net skips into the second
    num_kv_heads: int = 4  # key/value heads (GQA)
    model_dim: int = 512  # width
    num_heads: int = 8  # query heads
    mlp_mult: int = 2  # MLP hidden width = MLP_MULT x MODEL_DIM
    rope_base: float = 10_000.0  # RoPE frequency base
    logit_softcap: float = 30.0  # tanh cap on the logits
    mlp_leaky_slope: float = 0.0  # MLP: leaky_relu(x, slope)^2; 0: relu^2 (the field: 0.5)
    rope_dims: int = 0  # rotate only the first N dims of each head (partial RoPE); 0: all
    ln_scale: bool = False  # scale each block's normed inputs by 1/sqrt(layer index + 1)
    xsa_last_n: int = 0  # exclusive self-attention in the last N layers
    smear_gate_enabled: bool = False  # gated mix of the previous token's embedding, not across BOS
    bigram_vocab_size: int = 0  # rows of a hashed (previous, current) token-pair embedding; 0: off
    bigram_dim: int = 128  # width of the BigramHash rows (projected to MODEL_DIM)
    num_loops: int = 0  # depth recurrence: extra passes over LOOP_START..LOOP_END; 0: off
    loop_start: int = 0  # the first of the looped layers
    loop_end: int = 0  # the last of the looped layers (inclusive)
    parallel_start_layer: int = 0  # from this layer, two residual lanes (attention | MLP); 0: off
    skip_gates_enabled: bool = False  # U-Net skips as lerp(w * skip, x, sigmoid(g)), g = 0 at init
    sparse_attn_gate_enabled: bool = False  # head h's output * sigmoid(0.5 w_h . x[:12]), w zero
    qk_gain_init: float = 1.5  # initial per-head gain on the RMS-normed queries
    ortho_init: bool = False  # orthogonal Q, K, V and MLP input matrices (output projections: zero)
    tied_embed_init_std: float = 0.005  # init std of the tied embedding
    train_seq_len: int = 1024  # training (and plain validation) sequence length

@dataclass
class Hyperparameters(GPTConfig):
    """Every setting, the model's and the run's; its environment variable is its upper-case name."""
    data_path: str = "./data/datasets/fineweb10B_sp1024"  # folder of fineweb_{train,val}_*.bin shards
    tokenizer_path: str = "./data/tokenizers/fineweb_1024_bpe.model"  # SentencePiece .model or byte .json
    run_id: str = ""  # names the log, the artifact and the checkpoints; empty: a random uuid
    seed: int = 1337  # the initialization (data order and evaluation are fixed)
    artifact_dir: str = "logs"  # where the log and the artifact go
    val_batch_size: int = 524_288  # validation tokens per batch, over all ranks
    val_loss_every: int = 1000  # validate every N steps; 0: only at the end
    train_log_every: int = 200  # a step line every N steps (and the first 10)
    iterations: int = 20_000  # step cap
    warmdown_iters: int = 1200  # LR to 0 in the last N steps (N x step time under a wallclock cap)
    warmdown_frac: float = 0.0  # LR to 0 in this fraction of the step or time budget instead; 0: by steps
    min_lr: float = 0.0  # a floor under the LR multiplier
    warmup_steps: int = 20  # compile-priming steps, undone before training
    train_batch_tokens: int = 524_288  # tokens per optimizer step, over all ranks
    max_wallclock_seconds: float = 600.0  # training-time cap; 0: none
    grad_accum_steps: int = 0  # micro-steps per step; 0: 8 // world size (1 and 8 GPUs: same step)
    enable_looping_at: float = 0.5  # the fraction of the step or time budget from which they loop
    tied_embed_lr: float = 0.05  # Adam LR of the tied embedding
    matrix_lr: float = 0.04  # Muon LR of the block matrices
    scalar_lr: float = 0.04  # Adam LR of vectors and control tensors
    muon_momentum: float = 0.95  # Muon momentum after its warmup
    muon_backend_steps: int = 5  # Newton-Schulz iterations
    muon_momentum_warmup_start: float = 0.85  # Muon momentum at step 0
    muon_momentum_warmup_steps: int = 500  # steps of linear momentum warmup
    muon_row_normalize: bool = False  # equal-norm rows before orthogonalizing (MuonEq-R)
    muon_polar: bool = False  # Polar Express per-iteration coefficients, not the fixed quintic
    beta1: float = 0.9  # Adam beta1
    beta2: float = 0.95  # Adam beta2
    adam_eps: float = 1e-8  # Adam epsilon
    grad_clip_norm: float = 0.0  # clip the global norm of the averaged gradients; 0: off
    muon_wd: float = 0.0  # decoupled weight decay p <- p * (1 - lr * wd) of Muon's matrices
    embed_wd: float = 0.0  # decoupled weight decay of the embeddings (AdamW)
    adam_wd: float = 0.0  # decoupled weight decay of the vectors and control tensors (AdamW)
    ema_decay: float = 0.0  # the EMA of the weights is what validates and exports; 0: off
    eval_stride: int = 0  # sliding evaluation: each window of TRAIN_SEQ_LEN scores its last STRIDE; 0: off
    sliding_window_enabled: bool = True  # with EVAL_STRIDE, the sliding pass; 0: off if TTT scores
    ttt_enabled: bool = False  # score-first per-document LoRA TTT after the round trip: the score
    ttt_lora_rank: int = 96  # rank of a document's adapters (q, k, v, attention/MLP outputs, head)
    ttt_lora_lr: float = 0.0001  # the adapters' AdamW LR
    ttt_beta2: float = 0.999  # the adapters' AdamW beta2 (beta1: 0, the field's)
    ttt_weight_decay: float = 1.0  # the adapters' AdamW decoupled weight decay
    ttt_chunk_size: int = 48  # each document is scored, then trained on, in chunks of N tokens
    ttt_batch_size: int = 64  # documents adapted side by side (similar lengths, the longest first)
    matrix_bits: int = 8  # width of the block matrices' integers: 4 to 8 bits, a byte each
    embed_bits: int = 8  # width of the token embedding's integers: 4 to 8 bits
    matrix_clip_sigmas: float = 0.0  # each row's clip at k of its stds; 0: the searched clip
    attn_clip_sigmas: float = 0.0  # the clip in row stds of attention matrices; 0: MATRIX_CLIP_SIGMAS
    mlp_clip_sigmas: float = 0.0  # the clip in row stds of MLP matrices; 0: MATRIX_CLIP_SIGMAS
    embed_clip_sigmas: float = 0.0  # the clip in row stds of the embedding; 0: the searched clip
    lqer_enabled: bool = False  # LQER: a low-rank int2 x int4 correction of quantization errors
    lqer_rank: int = 4  # the rank of LQER's correction
    lqer_top_k: int = 3  # LQER corrects the K matrices whose error is largest
    gptq: bool = False  # full-Hessian GPTQ export; 0: round-to-nearest
    gptq_calib_seqs: int = 64  # calibration sequences of TRAIN_SEQ_LEN, over all ranks
    gptq_reserve_seconds: float = 0.0  # from MAX_WALLCLOCK_SECONDS, to calibrate on training data
    compressor: str = "zlib"  # zlib, brotli or zpaq (the smallest and by far the slowest)
    pack_code: bool = False  # count the code packed (minified, lzma, base85), as in a record folder
    sidecar_bytes: str = "check"  # a byte sidecar must match the decoded text; trust: unchecked, as the field
    save_every: int = 0  # checkpoint every N steps, at the end and on a first SIGTERM/SIGINT
    keep_checkpoints: int = 3  # keep the newest K checkpoints; 0: all
    checkpoint_dir: str = "checkpoints"  # checkpoints go to CHECKPOINT_DIR/<RUN_ID>/step_NNNNNN/
    resume: str = ""  # a checkpoint folder, or latest: the newest of RUN_ID
    device: str = "auto"  # auto: CUDA if there is one, else the CPU; or cuda, cpu
    compile: str = "auto"  # torch.compile: auto (CUDA: on; CPU: off, exact, never slower), 0 or 1
    bf16: str = "auto"  # bf16 autocast and bf16 Muon updates: auto (as COMPILE), 0 or 1
    optimize_ddp: bool = True  # dynamo's DDPOptimizer: graph split at grad buckets (the field: off)

    @classmethod
    def from_env(cls, environ=os.environ, world_size=1) -> Hyperparameters:
        """The settings in environ, once settings.py (beside this file) refused what cannot work."""
        check("environ_problems", environ, cls())
        hp = cls(**{f.name: as_setting(environ[f.name.upper()], f.default)
                    for f in fields(cls) if f.name.upper() in environ})
        hp.validate(world_size)
        return hp

    @property
    def budget_ms(self):  # training's wallclock: the cap less GPTQ's reserve; inf: no cap
        if self.max_wallclock_seconds <= 0:
            return math.inf
        return 1000.0 * (self.max_wallclock_seconds - self.gptq_reserve_seconds)

    @property
    def export_tag(self):  # names the artifact and the final lines: final_int6_brotli_roundtrip
        return f"int{self.matrix_bits}_{self.compressor}"

    @property
    def model_config(self) -> GPTConfig:
        return GPTConfig(**{f.name: getattr(self, f.name) for f in fields(GPTConfig)})

    def windows(self, sliding):
        """(length, stride) of scoring windows: TRAIN_SEQ_LEN, side by side or (sliding) EVAL_STRIDE apart."""
        stride = self.eval_stride if sliding else self.train_seq_len
        return self.train_seq_len, stride

    def micro_steps(self, world_size):  # GRAD_ACCUM_STEPS; 0: 8 // world size (1 and 8 GPUs: the same step)
        return self.grad_accum_steps or 8 // world_size

    def validate(self, world_size=1):
        """Refuse what the settings rule out with this many processes (settings.py's checks)."""
        check("problems", self, world_size)

ALONE = "settings.py is not beside this train_gpt.py"  # a record folder's copy: unchecked

def settings_py(name, *args, alone=None):
    """settings.py's function `name` called with args; `alone` where settings.py is not beside this file."""
    try:
        settings = importlib.import_module("settings")
    except ImportError:
        return alone
    return getattr(settings, name)(*args)

def progress(items, what):
    """items, and on the console a line at most every 10 s while they last (settings.py's)."""
    return settings_py("progress", items, what, alone=items)

def check(name, *args):
    """settings.py's check `name` of args: what it finds stops the run, before any work."""
    problems = settings_py(name, *args, alone=[])
    require(not problems, "\n".join(problems))

def as_setting(text, default):
    """An environment variable's text as its setting's type: bool (1, true), int, float or str."""
    if isinstance(default, bool):
        return text.strip().lower() in ("1", "true")
    return type(default)(text.strip())

# ---- DEVICE ----
# Hardware and numeric modes are chosen once, in setup(); the rest reads them from the Layout.
@dataclass
class Layout:
    """Where this process sits and how it computes: ranks, device, micro-steps per step, numeric modes."""
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    grad_accum_steps: int = 1
    use_compile: bool = False
    use_bf16: bool = False

    @property
    def distributed(self):
        return self.world_size > 1

    @property
    def cuda(self):
        return self.device.type == "cuda"

def pick_device(local_rank, choice="auto"):
    """The one place that chooses hardware: DEVICE, or (auto) CUDA if there is one, else the CPU."""
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")

def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize()

def ms_since(t0):
    return 1000.0 * (time.perf_counter() - t0)

def autocast(layout):
    return torch.autocast(device_type=layout.device.type, dtype=torch.bfloat16, enabled=layout.use_bf16)

# ---- MUON OPTIMIZER ----
# Muon (Jordan et al. 2024): the gradient's momentum, made about orthogonal by a few Newton-Schulz steps.
# (a, b, c) per Newton-Schulz step, the last repeated: the quintic (modded-nanogpt); Polar Express (Amsel 2025)
QUINTIC_COEFFS = ((3.4445, -4.7750, 2.0315),)
POLAR_EXPRESS_COEFFS = ((8.156554524902461, -22.48329292557795, 15.878769915207462),
                        (4.042929935166739, -2.808917465908714, 0.5000178451051316),
                        (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
                        (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
                        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323))

def zeropower_via_newtonschulz5(G, steps=5, eps=1e-7, dtype=torch.bfloat16, coeffs=QUINTIC_COEFFS):
    """Orthogonalize G's matrices (..., rows, cols) roughly: X <- aX + (bA + cA^2)X, A = XX^T."""
    X = G.to(dtype)
    # iterate on the wide side: X @ X.T is the smaller Gram matrix
    transposed = X.size(-2) > X.size(-1)
    X = (X.mT if transposed else X) / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    for i in range(steps):
        a, b, c = coeffs[min(i, len(coeffs) - 1)]
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if transposed else X

def muon_update(g, steps, coeffs, row_normalize, dtype):
    """A Nesterov gradient bank (n, rows, cols) as Muon's updates: rows of equal norm (MuonEq-R), orthogonalized,
    tall ones scaled by sqrt(rows / cols) so their RMS update is comparable."""
    if row_normalize:
        g = g / g.norm(dim=-1, keepdim=True).clamp_min(1e-7)
    g = zeropower_via_newtonschulz5(g, steps, dtype=dtype, coeffs=coeffs)
    return g * max(1.0, g.size(-2) / g.size(-1)) ** 0.5

class Muon(torch.optim.Optimizer):
    """Nesterov momentum (in the gradients, as modded-nanogpt), then orthogonalized updates of 2-D matrices in
    banks of one shape: each rank takes every world_size-th matrix of a bank, and the ranks sum the updates."""

    def __init__(self, params, lr, momentum, weight_decay=0.0, backend_steps=5, coeffs=QUINTIC_COEFFS,
                 row_normalize=False, bf16=False, compiled=False, rank=0, world_size=1):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))
        self.update_dtype = torch.bfloat16 if bf16 else torch.float32
        update = muon_update
        if compiled:
            update = torch.compile(muon_update, dynamic=False, fullgraph=True)
        self.orthogonalize = partial(update, steps=backend_steps, coeffs=coeffs, row_normalize=row_normalize,
                                     dtype=self.update_dtype)
        self.rank = rank
        self.world_size = world_size
        for p in self.param_groups[0]["params"]:
            self.state[p]["momentum_buffer"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self, closure=None):
        mine = slice(self.rank, None, self.world_size)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            momenta = [self.state[p]["momentum_buffer"] for p in params]
            grads = [p.grad for p in params]
            # every matrix in one op each: the momentum, Nesterov's gradient, the decoupled decay
            torch._foreach_mul_(momenta, group["momentum"])
            torch._foreach_add_(momenta, grads)
            torch._foreach_add_(grads, momenta, alpha=group["momentum"])
            if group["weight_decay"]:
                torch._foreach_mul_(params, 1.0 - group["lr"] * group["weight_decay"])

            # a bank: this rank's matrices in one batch, others' rows zero until the ranks sum them
            banks = {}
            for p in params:
                banks.setdefault(p.shape, []).append(p)
            for bank in banks.values():
                updates = bank[0].new_zeros(len(bank), *bank[0].shape, dtype=self.update_dtype)
                if bank[mine]:
                    updates[mine] = self.orthogonalize(torch.stack([p.grad for p in bank[mine]]))
                if self.world_size > 1:
                    dist.all_reduce(updates)
                torch._foreach_add_(bank, updates.to(bank[0].dtype).unbind(), alpha=-group["lr"])

# ---- DATA ----
# The challenge's shards: a header, then the uint16 ids of documents, each begun by BOS, end to end.
SHARD_HEADER_BYTES = 256 * 4  # 256 little-endian int32: magic, version, token count, zeros
BOS_ID = 1  # every document starts with it (CHALLENGE.md, data format)

def shard_tokens(path, vocab_size=None):
    """One shard's tokens, memory-mapped, once settings.py checked its header, size and (vocab_size) ids."""
    check("shard_problems", path, vocab_size)
    num_tokens = int(np.fromfile(path, dtype="<i4", count=3)[2])
    return np.memmap(path, dtype="<u2", mode="r", offset=SHARD_HEADER_BYTES, shape=(num_tokens,))

def load_shards(pattern, what, vocab_size=None, share=(0, 1)):
    """The shards matching pattern, checked; with vocab_size, the ids of share = (rank, world)'s shards."""
    files = sorted(glob.glob(pattern))
    check("shards_problems", pattern, what, files)
    rank, world = share
    return [shard_tokens(f, vocab_size if i % world == rank else None) for i, f in enumerate(files)]

def train_pattern(data_path):
    return os.path.join(data_path, "fineweb_train_*.bin")

class DistributedTokenLoader:
    """The training shards in order, cycled; each rank keeps its span (+1) of each global chunk."""

    def __init__(self, pattern, rank=0, world_size=1, device=torch.device("cpu")):
        self.shards = load_shards(pattern, "training")
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.position = [0, 0]  # [shard, token]: what a checkpoint saves

    def take(self, n):
        chunks = []
        while n > 0:
            index, pos = self.position
            chunks.append(self.shards[index][pos:pos + n])
            n -= len(chunks[-1])
            self.position = [index, pos + len(chunks[-1])]
            if self.position[1] == len(self.shards[index]):
                self.position = [(index + 1) % len(self.shards), 0]
        return torch.from_numpy(np.concatenate(chunks).astype(np.int32))

    def next_batch(self, global_tokens, seq_len, grad_accum_steps) -> tuple[Tensor, Tensor]:
        span = global_tokens // (self.world_size * grad_accum_steps) + 1  # with the last target
        local = self.take(span * self.world_size)[self.rank * span:(self.rank + 1) * span].to(torch.int64)
        if self.device.type == "cuda":
            local = local.pin_memory()  # so the copies below are asynchronous and overlap compute
        x = local[:-1].view(-1, seq_len).to(self.device, non_blocking=True)
        y = local[1:].view(-1, seq_len).to(self.device, non_blocking=True)
        return x, y

# ---- TOKENIZER BYTE ACCOUNTING ----
# val_bpb divides by the UTF-8 bytes of the text behind the scored tokens, read off per-id tables.
SPACE = "\u2581"  # SentencePiece's space symbol: one byte of text

def read_pieces(path):
    """(kind, piece) of each id, and the decoder: a SentencePiece model, or a byte tokenizer's .json."""
    if path.suffix != ".json":
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(path))
        kinds = [(sp.is_control, "control"), (sp.is_byte, "byte"), (sp.is_unknown, "unknown")]
        pieces = []
        for i in range(sp.vocab_size()):
            kind = next((name for test, name in kinds if test(i)), "text")
            pieces.append((kind, sp.id_to_piece(i)))
        return pieces, sp.decode

    spec = json.loads(path.read_text())
    if spec.get("tokenizer_type") != "pure_byte":
        raise ValueError(f"tokenizer_type {spec.get('tokenizer_type')!r} is not 'pure_byte'")
    offset = int(spec["config"]["byte_offset"])
    pieces = [("byte" if 0 <= i - offset < 256 else "control", "") for i in range(int(spec["vocab_size"]))]
    def decode(ids):
        return bytes(i - offset for i in ids if 0 <= i - offset < 256).decode("utf-8", "replace")
    return pieces, decode

KIND_BYTES = {"byte": 1, "control": 0, "unknown": -1}  # the other pieces' text bytes

def piece_text_bytes(kind, piece):
    if kind == "text":  # its UTF-8 bytes, the space symbol's one
        return len(piece.encode("utf-8")) - 2 * piece.count(SPACE)
    return KIND_BYTES[kind]

def load_tokenizer(tokenizer_path, vocab_size) -> Tensor:
    """The UTF-8 bytes of each id's text (int64 [V]), once settings.py has checked the tokenizer."""
    check("tokenizer_problems", tokenizer_path, vocab_size, read_pieces)
    pieces, _ = read_pieces(Path(tokenizer_path))
    return torch.tensor([piece_text_bytes(kind, piece) for kind, piece in pieces])

# The validation tokens, the bytes of text behind each, and the tokens per evaluation batch
Validation = NamedTuple("Validation", [("tokens", Tensor), ("bytes", Tensor), ("batch_tokens", int)])

def load_validation(hp, piece_bytes, share=(0, 1), device=torch.device("cpu")) -> Validation:
    """Validation tokens, their bytes (a CaseOps sidecar's if any), checked, cut to full windows."""
    pattern = os.path.join(hp.data_path, "fineweb_val_[0-9]*.bin")
    shards = load_shards(pattern, "validation", len(piece_bytes))
    tokens = torch.from_numpy(np.concatenate(shards).astype(np.int32))

    sidecar = sorted(glob.glob(os.path.join(hp.data_path, "fineweb_val_bytes_*.bin")))
    if sidecar:  # the field's CaseOps data: each token's bytes of the original text
        counted = torch.from_numpy(np.concatenate([shard_tokens(f) for f in sidecar]).astype(np.int64))
    else:
        counted = piece_bytes[tokens.long()]
    check("validation_problems", tokens, counted, share, hp, bool(sidecar), read_pieces)
    usable = ((tokens.numel() - 1) // hp.train_seq_len) * hp.train_seq_len  # whole windows
    counted = counted[:usable + 1].to(torch.int16)
    return Validation(tokens[:usable + 1].to(device), counted.to(device), hp.val_batch_size)

# ---- MODEL ----
# The challenge's GPT and the field's levers, off by default; it reads only its GPTConfig (HYPERPARAMETERS).
# Tensors that steer, not compute: Adam trains them (2-D ones too); the export keeps them in fp32.
CONTROL_PARAM_NAMES = ("attn_scale", "mlp_scale", "resid_mix", "q_gain", "skip_weights", "skip_gates",
                       "lane_mix", "smear_lambda", "smear_gate", "attn_gate")

def is_control(name):
    return any(key in name for key in CONTROL_PARAM_NAMES)

# The field's constants: its gates read a token's first GATE_WINDOW channels; BigramHash multiplies (current,
# previous) ids and enters at BIGRAM_SCALE; a lane starts at these weights; LoRA adds alpha / r x A^T B^T.
GATE_WINDOW = 12
ATTN_GATE_SCALE = 0.5
BIGRAM_HASH = (36313, 27191)
BIGRAM_SCALE = 0.05
LANE_MIX_INIT = (1.1, 1.0, 1.0)
LORA_ALPHA = 144.0

class CastedLinear(nn.Linear):
    """fp32 weights for the optimizer; matmul in the activations' dtype; no bias (no layer has one)."""

    def __init__(self, in_features, out_features):
        super().__init__(in_features, out_features, bias=False)

    def forward(self, x):
        return F.linear(x, self.weight.to(x.dtype))

# Per-document TTT adapters (A, B): each layer's as run, by target, then the tied head's
Adapters = NamedTuple("Adapters", [("layers", tuple), ("head", tuple)])

def adapt(y, x, lora):
    """y + alpha/r (x A^T) B^T: TTT LoRA per document, A (D, r, in), B (D, out, r), x (D, T, in)."""
    if lora is None:
        return y
    A, B = lora
    down = x @ A.to(x.dtype).transpose(1, 2)  # (D, T, r)
    return y + down @ B.to(x.dtype).transpose(1, 2) * (LORA_ALPHA / A.size(1))

def optional(enabled, tensor):
    """A lever's parameter when it is on; None, no parameter, when it is off."""
    return nn.Parameter(tensor) if enabled else None

def rms_norm(x):
    return F.rms_norm(x, (x.size(-1),))

def input_gate(x, weight, scale=1.0):
    """sigmoid(scale * w . x[:k]) per row w (width k) of weight: the field's cheap gates (..., R)"""
    return torch.sigmoid(scale * (x[..., :weight.size(-1)] @ weight.to(x.dtype).T))

def rotary_cos_sin(seq_len, rope_dims, base):
    """fp32 tables, each (1, 1, T, rope_dims / 2)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rope_dims, 2, dtype=torch.float32) / rope_dims))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return freqs.cos()[None, None], freqs.sin()[None, None]

def apply_rotary(x, cos, sin):
    """Rotate each head's first 2 * cos.size(-1) channels (partial RoPE); the rest pass through."""
    rotated = 2 * cos.size(-1)
    x1, x2 = x[..., :rotated].chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos, x[..., rotated:]), dim=-1)

class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        dim = config.model_dim
        self.head_dim = dim // config.num_heads
        kv_dim = config.num_kv_heads * self.head_dim
        self.xsa = layer >= config.num_layers - config.xsa_last_n
        self.c_q = CastedLinear(dim, dim)
        self.c_k = CastedLinear(dim, kv_dim)
        self.c_v = CastedLinear(dim, kv_dim)
        self.proj = CastedLinear(dim, dim)
        nn.init.zeros_(self.proj.weight)

        # RoPE's tables, computed once, not inside the kernels; not saved, and not broadcast by DDP
        cos, sin = rotary_cos_sin(config.train_seq_len, config.rope_dims or self.head_dim, config.rope_base)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # q and k are RMS-normalized, so attention's sharpness is learned here, per head
        heads = config.num_heads
        self.q_gain = nn.Parameter(torch.full((heads,), config.qk_gain_init, dtype=torch.float32))
        self.attn_gate = optional(config.sparse_attn_gate_enabled, torch.zeros(heads, min(GATE_WINDOW, dim)))

    def forward(self, x, lora):
        B, T, C = x.shape
        heads = (-1, self.head_dim)
        # q (B, H, T, hd); k, v (B, Hkv, T, hd)
        q = adapt(self.c_q(x), x, lora.get("q")).unflatten(-1, heads).transpose(1, 2)
        k = adapt(self.c_k(x), x, lora.get("k")).unflatten(-1, heads).transpose(1, 2)
        v = adapt(self.c_v(x), x, lora.get("v")).unflatten(-1, heads).transpose(1, 2)
        cos = self.rope_cos[:, :, :T]
        sin = self.rope_sin[:, :, :T]
        q = rms_norm(q)  # fp32 on CUDA (autocast's rms_norm), as are cos, sin and q_gain
        k = rms_norm(k)
        q = apply_rotary(q, cos, sin) * self.q_gain.to(q.dtype)[None, :, None, None]
        k = apply_rotary(k, cos, sin)
        gqa = k.size(1) != q.size(1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)  # (B, H, T, hd)

        # exclusive self-attention: drop each head's component along its token's own value
        if self.xsa:
            # (B, Hkv, H / Hkv, T, hd): query heads by their group
            y = y.unflatten(1, (k.size(1), -1))
            v_hat = F.normalize(v, dim=-1)[:, :, None]  # (B, Hkv, 1, T, hd)
            y = y - (y * v_hat).sum(-1, keepdim=True) * v_hat
            y = y.flatten(1, 2)
        if self.attn_gate is not None:
            gate = input_gate(x, self.attn_gate, ATTN_GATE_SCALE).transpose(1, 2)  # (B, H, T)
            y = y * gate[..., None].to(y.dtype)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

class MLP(nn.Module):
    """leaky_relu(x, slope)^2 between two matrices; slope 0: the challenge's relu^2."""

    def __init__(self, dim, mlp_mult, leaky_slope=0.0):
        super().__init__()
        self.fc = CastedLinear(dim, mlp_mult * dim)
        self.proj = CastedLinear(mlp_mult * dim, dim)
        nn.init.zeros_(self.proj.weight)
        self.leaky_slope = leaky_slope

    def forward(self, x):
        return self.proj(F.leaky_relu(self.fc(x), self.leaky_slope).square())

class Block(nn.Module):
    """Attention then MLP on one residual stream or two lanes (the field's PARALLEL_START_LAYER)."""

    def __init__(self, config, layer):
        super().__init__()
        dim = config.model_dim
        self.attn = CausalSelfAttention(config, layer)
        self.mlp = MLP(dim, config.mlp_mult, config.mlp_leaky_slope)
        self.attn_scale = nn.Parameter(torch.ones(dim))
        self.mlp_scale = nn.Parameter(torch.ones(dim))
        # its rows weigh the residual stream and the first layer's input x0 (init: the plain stream)
        self.resid_mix = nn.Parameter(torch.stack((torch.ones(dim), torch.zeros(dim))))
        # LN_SCALE: normed inputs times 1 / sqrt(layer + 1), so deeper layers add less
        self.norm_scale = (layer + 1) ** -0.5 if config.ln_scale else 1.0
        self.lane_mix = optional(0 < config.parallel_start_layer <= layer, torch.tensor([LANE_MIX_INIT] * 2))

    def norm(self, x):
        return rms_norm(x) * self.norm_scale

    def forward(self, lanes, x0, lora):
        """lanes: [(B, T, C)]: attention reads lane 0, the MLP the last; each lane adds both outputs
        with learned weights; lora: its TTT adapters by name (the outputs' read normed inputs)."""
        from_stream, from_x0 = self.resid_mix.to(x0.dtype)
        x = from_stream * lanes[0] + from_x0 * x0
        n = self.norm(x)
        attn = self.attn_scale.to(x.dtype) * adapt(self.attn(n, lora), n, lora.get("attn_out"))
        if self.lane_mix is None:
            x = x + attn
            n = self.norm(x)
            return [x + self.mlp_scale.to(x.dtype) * adapt(self.mlp(n), n, lora.get("mlp_out"))]

        n = self.norm(lanes[1])
        mlp = self.mlp_scale.to(x.dtype) * adapt(self.mlp(n), n, lora.get("mlp_out"))
        weights = self.lane_mix.to(x.dtype)
        return [keep * lane + from_attn * attn + from_mlp * mlp
                for lane, (keep, from_attn, from_mlp) in zip(lanes, weights)]

def lanes_mean(lanes):
    return lanes[0] if len(lanes) == 1 else torch.stack(lanes).mean(0)

def bigram_hash(idx, buckets):
    """(previous, current) -> rows 0..buckets-2 (the field's BigramHash); last row: no previous, or BOS."""
    prev = F.pad(idx[:, :-1], (1, 0))
    rows = torch.bitwise_xor(BIGRAM_HASH[0] * idx, BIGRAM_HASH[1] * prev) % (buckets - 1)
    first = torch.arange(idx.size(1), device=idx.device) == 0
    return torch.where(first | (idx == BOS_ID), buckets - 1, rows)

class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.logit_softcap = config.logit_softcap
        self.tok_emb = nn.Embedding(config.vocab_size, config.model_dim)
        # BigramHash: fixed scale, Muon (the field's learned scale + Adam lost 0.010 bpb, 3 seeds)
        self.bigram = None
        self.bigram_proj = None
        if config.bigram_vocab_size:
            self.bigram = nn.Embedding(config.bigram_vocab_size, config.bigram_dim)
            self.bigram_proj = CastedLinear(config.bigram_dim, config.model_dim)
            nn.init.zeros_(self.bigram.weight)
        # x_t += lambda * sigmoid(w . x_t[:12]) * x_{t-1}; zero: it starts as a no-op
        self.smear_lambda = optional(config.smear_gate_enabled, torch.zeros(1))
        self.smear_gate = optional(config.smear_gate_enabled, torch.zeros(min(GATE_WINDOW, config.model_dim)))
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.num_layers))
        self.parallel_start_layer = config.parallel_start_layer
        # depth recurrence: the order the blocks run in once looping is on (set_looping)
        first = list(range(config.loop_end + 1))
        looped = list(range(config.loop_start, config.loop_end + 1)) * config.num_loops
        self.looped_order = first + looped + list(range(config.loop_end + 1, config.num_layers))
        self.looping = False  # an attribute, which torch.compile guards on: a graph for each phase
        # the phase in the artifact's weights too, for its readers (set_looping writes it)
        if config.num_loops:
            self.register_buffer("loop_on", torch.zeros((), dtype=torch.int8))
        # U-Net over the layers as run: the first half's outputs feed the second half, deepest first
        self.skip_weights = nn.Parameter(torch.ones(len(self.looped_order) // 2, config.model_dim))
        self.skip_gates = optional(config.skip_gates_enabled, torch.zeros_like(self.skip_weights))
        self.final_norm = nn.RMSNorm(config.model_dim, elementwise_affine=False)

        # the initialization, in this order (the random draws follow it)
        if config.ortho_init:
            for block in self.blocks:
                for linear in (block.attn.c_q, block.attn.c_k, block.attn.c_v, block.mlp.fc):
                    nn.init.orthogonal_(linear.weight)
        nn.init.normal_(self.tok_emb.weight, mean=0.0, std=config.tied_embed_init_std)

    def set_looping(self, on):
        """Depth recurrence on or off: the one place the phase changes."""
        self.looping = on
        if hasattr(self, "loop_on"):
            self.loop_on.fill_(int(on))

    def layer_order(self):
        return self.looped_order if self.looping else list(range(len(self.blocks)))

    def embed(self, idx):
        x = self.tok_emb(idx)  # (B, T, C)
        if self.bigram is not None:
            pairs = self.bigram(bigram_hash(idx, self.bigram.num_embeddings))
            x = x + BIGRAM_SCALE * self.bigram_proj(pairs)
        if self.smear_gate is not None:  # a BOS takes nothing from the document before it
            gate = input_gate(x, self.smear_gate[None])[..., 0]  # (B, T)
            gate = self.smear_lambda * gate * (idx != BOS_ID)
            x = x + gate[..., None].to(x.dtype) * F.pad(x[:, :-1], (0, 0, 1, 0))
        if torch.is_autocast_enabled(x.device.type):
            x = x.to(torch.get_autocast_dtype(x.device.type))
        return rms_norm(x)

    def logits(self, idx, lora=None):
        """(B, T, V); lora: per-document TTT's Adapters."""
        x0 = self.embed(idx)
        lanes = [x0]  # the residual stream; two lanes from PARALLEL_START_LAYER on
        order = self.layer_order()
        lora = lora or Adapters(({},) * len(order), None)
        num_encoder = len(order) // 2
        skips = []
        for i, layer in enumerate(order):
            if layer == self.parallel_start_layer and layer > 0 and len(lanes) == 1:
                lanes = [lanes[0], lanes[0]]
            # U-Net: the deepest encoder output meets the first decoder
            if i >= num_encoder and skips:
                lanes[0] = self.add_skip(lanes[0], i - num_encoder, skips.pop())
            lanes = self.blocks[layer](lanes, x0, lora.layers[i])
            if i < num_encoder:
                skips.append(lanes_mean(lanes))

        x = self.final_norm(lanes_mean(lanes))
        logits = adapt(F.linear(x, self.tok_emb.weight.to(x.dtype)), x, lora.head).float()
        return self.logit_softcap * torch.tanh(logits / self.logit_softcap)

    def add_skip(self, x, k, skip):
        """x + w * skip, or (SKIP_GATES_ENABLED) lerp(w * skip, x, sigmoid(g))."""
        skip = self.skip_weights[k].to(x.dtype) * skip
        if self.skip_gates is None:
            return x + skip
        return torch.lerp(skip, x, torch.sigmoid(self.skip_gates[k]).to(x.dtype))

    def forward(self, idx, targets, reduction="mean", lora=None):
        logits = self.logits(idx, lora)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), reduction=reduction)

# ---- EVALUATION ----
# Each target scored once: windows side by side, sliding windows, or score-first LoRA TTT on each document.
def score_sums(losses, scored, num_bytes):
    """A batch's part of a score (float64; batches, then ranks add up): loss in nats, scored targets, bytes."""
    losses = torch.where(scored, losses.detach().double(), 0.0)
    return torch.stack([losses.sum(), scored.sum(), (num_bytes * scored).sum()])

def metrics(sums):
    """val_loss (nats per token) and val_bpb of score_sums() added up."""
    loss_sum, tokens, num_bytes = sums.tolist()
    val_loss = loss_sum / tokens
    return val_loss, val_loss / math.log(2.0) * tokens / num_bytes

@torch.no_grad()
def score(model, val, layout, seq_len, stride):
    """score_sums() of every target once, over ranks: windows of seq_len end stride apart, each scoring the
    targets after the one before."""
    device = layout.device
    stop = val.tokens.numel() - 1
    ends = list(range(seq_len, stop, stride)) + [stop]  # each window's last target
    counts = [b - a for a, b in zip([0] + ends, ends)]  # its targets: those after the window before

    # this rank's share, in batches of one shape (one graph): the last one padded with windows scoring nothing
    share = slice(len(ends) * layout.rank // layout.world_size,
                  len(ends) * (layout.rank + 1) // layout.world_size)
    per_batch = max(1, val.batch_tokens // (layout.world_size * layout.grad_accum_steps) // seq_len)
    mine = ends[share]
    pad = math.ceil(len(mine) / per_batch) * per_batch - len(mine)
    ends = mine + mine[-1:] * pad
    counts = torch.tensor(counts[share] + [0] * pad, device=device)

    sums = torch.zeros(3, dtype=torch.float64, device=device)
    for i in progress(range(0, len(ends), per_batch), "scoring: batches"):
        batch = ends[i:i + per_batch]
        windows = torch.stack([val.tokens[end - seq_len:end + 1] for end in batch])  # (B, T + 1)
        num_bytes = torch.stack([val.bytes[end - seq_len + 1:end + 1] for end in batch])
        # (B, T): the targets each window scores
        scored = torch.arange(seq_len, device=device) >= seq_len - counts[i:i + per_batch, None]
        windows = windows.to(device, torch.int64)
        with autocast(layout):
            losses = model(windows[:, :-1], windows[:, 1:], reduction="none")
        sums += score_sums(losses.view_as(scored), scored, num_bytes)
    if layout.distributed:
        dist.all_reduce(sums)
    return sums.cpu()

def document_spans(tokens):
    """[(first, end)) of each document's targets: a BOS starts one; its last token predicts the next BOS."""
    starts = (tokens[1:-1] == BOS_ID).nonzero().flatten().add(1).tolist()
    bounds = [0] + starts + [tokens.numel() - 1]
    return [(a + 1, b + 1) for a, b in zip(bounds, bounds[1:])]

def lora_ttt(run):
    """Score-first per-document LoRA TTT (the field's): documents in groups of similar length, longest first, the
    ranks taking turns; A carries over to a rank's next group, so the score depends on the number of ranks."""
    hp, layout = run.hp, run.layout
    val = Validation(run.val.tokens.cpu(), run.val.bytes.cpu(), 0)
    spans = sorted(document_spans(val.tokens), key=lambda span: span[0] - span[1])
    groups = [spans[i:i + hp.ttt_batch_size] for i in range(0, len(spans), hp.ttt_batch_size)]
    run.log(f"ttt: groups:{len(groups)} world_size:{layout.world_size} (A carries over: the score depends on it)")

    torch.manual_seed(hp.seed)  # the adapters' A, the same on every rank
    lora = new_adapters(run.model, hp.ttt_lora_rank, hp.ttt_batch_size, layout.device)
    sums = torch.zeros(3, dtype=torch.float64, device=layout.device)
    for group in progress(groups[layout.rank::layout.world_size], "ttt: groups"):
        sums += ttt_group(run.scorer, val, group, lora, hp, layout)
    if layout.distributed:
        dist.all_reduce(sums)
    return sums.cpu()

def new_adapters(model, rank, rows, device):
    """Adapters for `rows` documents: A uniform (nn.Linear's init), B zero, so the model starts as it is."""
    dim = model.tok_emb.embedding_dim
    kv_dim = model.blocks[0].attn.c_k.out_features

    def pair(out):
        A = torch.rand(rows, rank, dim, device=device)
        B = torch.zeros(rows, out, rank, device=device)
        return ((2 * A - 1) * dim ** -0.5).requires_grad_(), B.requires_grad_()
    outputs = dict(q=dim, k=kv_dim, v=kv_dim, attn_out=dim, mlp_out=dim)
    layers = tuple({name: pair(out) for name, out in outputs.items()} for _ in model.layer_order())
    return Adapters(layers, pair(model.tok_emb.num_embeddings))

def chunk_windows(val, spans, lo, chunk, seq_len, rows):
    """Each document's window for its chunk from a + lo: (tokens, bytes or -1, rows that train)."""
    window = min(lo + chunk, seq_len)
    tokens = torch.zeros(rows, window + 1, dtype=torch.int64)
    counted = torch.full((rows, window), -1)
    trained = torch.zeros(rows)
    for row, (a, b) in enumerate(spans[:rows]):
        chunk_end = min(a + lo + chunk, b)  # past its last target (a done one: none)
        window_start = max(a - 1, chunk_end - 1 - window)
        tokens[row, :chunk_end - window_start] = val.tokens[window_start:chunk_end]
        chunk_start = a + lo - 1 - window_start  # the chunk's targets end the window
        counted[row, chunk_start:chunk_end - 1 - window_start] = val.bytes[a + lo:chunk_end]
        trained[row] = chunk_end < b  # the last chunk is only scored
    return tokens, counted, trained

def ttt_group(scorer, val, spans, lora, hp, layout):
    """Documents side by side, chunk by chunk, each scored, then trained on; B and AdamW anew, A kept."""
    params = tree_leaves(lora)  # A, B of each adapter in turn
    for B in params[1::2]:
        B.detach().zero_()
    adamw = torch.optim.AdamW(params, lr=hp.ttt_lora_lr, betas=(0.0, hp.ttt_beta2), eps=1e-10,
                              weight_decay=hp.ttt_weight_decay, fused=layout.cuda)
    scorer.requires_grad_(False)
    sums = torch.zeros(3, dtype=torch.float64, device=layout.device)
    for lo in range(0, max(b - a for a, b in spans), hp.ttt_chunk_size):
        # compiled: every row, one shape; eager: the documents not yet done (the longest come first)
        rows = len(lora.head[0]) if layout.use_compile else sum(lo < b - a for a, b in spans)
        windows = chunk_windows(val, spans, lo, hp.ttt_chunk_size, hp.train_seq_len, rows)
        tokens, counted, trained = (t.to(layout.device) for t in windows)
        x = tokens[:, :-1]
        y = tokens[:, 1:]
        torch._dynamo.mark_dynamic(x, 1)  # one compiled graph for every window
        torch._dynamo.mark_dynamic(y, 1)

        scored = counted >= 0
        with autocast(layout):
            losses = scorer(x, y, reduction="none", lora=tree_map(lambda t: t[:rows], lora))
            losses = torch.where(scored, losses.view_as(scored), 0.0)
        sums += score_sums(losses, scored, counted)
        means = losses.sum(1) / scored.sum(1).clamp(min=1)
        (means * trained).sum().backward()
        adamw.step()
        adamw.zero_grad(set_to_none=True)
    scorer.requires_grad_(True)
    return sums

def prime_ttt(run):
    """Compile TTT's graph before its timer, on random documents of one chunk (the rest: as validation)."""
    hp, layout = run.hp, run.layout
    run.log("compiling: TTT's graph, on random documents (about as long as the training step's)")
    t0 = time.perf_counter()
    graphs = compiled_graphs()
    docs = torch.randint(2, hp.vocab_size, (hp.ttt_batch_size, hp.ttt_chunk_size))
    docs[:, 0] = BOS_ID
    docs = docs.flatten()
    lora = new_adapters(run.model, hp.ttt_lora_rank, hp.ttt_batch_size, layout.device)
    noise = Validation(docs, torch.zeros_like(docs), 0)
    ttt_group(run.scorer, noise, document_spans(docs), lora, hp, layout)
    synchronize(layout.device)
    run.log(f"priming: passes:ttt graphs:{compiled_graphs() - graphs} time:{ms_since(t0):.0f}ms")

def final_passes(run):
    """Score the round-tripped model plainly, in sliding windows and with TTT, each pass timed."""
    hp, layout, log = run.hp, run.layout, run.log
    passes = ["roundtrip"]
    if hp.eval_stride and (hp.sliding_window_enabled or not hp.ttt_enabled):
        passes.append("sliding_window")
    if hp.ttt_enabled:
        passes.append("ttt")
    if layout.use_compile and hp.ttt_enabled:
        prime_ttt(run)

    times_ms = {}
    graphs = compiled_graphs()
    for name in passes:
        line = f"final_{hp.export_tag}_{name}"
        synchronize(layout.device)
        t0 = time.perf_counter()
        windows = hp.windows(name == "sliding_window")
        sums = lora_ttt(run) if name == "ttt" else score(run.scorer, run.val, layout, *windows)
        val_loss, val_bpb = metrics(sums)
        synchronize(layout.device)
        times_ms[name] = ms_since(t0)
        finite = math.isfinite(val_loss)
        require(finite, f"{line}: val_loss is {val_loss}, no submission: lower the LRs", RunError)
        log(f"{line} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} eval_time:{times_ms[name]:.0f}ms")
        log(f"{line}_exact val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f}")
    each = ",".join(f"{name}:{ms:.0f}ms" for name, ms in times_ms.items())
    total = f"final_eval_total eval_time:{sum(times_ms.values()):.0f}ms limit:{EVAL_LIMIT_MS}ms passes:{each}"
    if layout.use_compile:
        total += f" graphs_compiled_inside:{compiled_graphs() - graphs}"
    log(total)

# ---- EXPORT: LOW-BIT WEIGHTS + COMPRESSION ----
# The artifact: a few bits a weight (rows of integers, fp16 steps), compressed, then read back and scored.
# Tensors up to this size stay float: at width 256 attention matrices (32k-65k) are quantized too.
KEEP_FLOAT_MAX_NUMEL = 16_384
# Searched clip: each row's fraction of its max |w| with least error (GPTQ-lite); or *_CLIP_SIGMAS.
CLIP_FRACTIONS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6)
# LQER's factors of a matrix's error: A (rows x rank) in int2, B (rank x cols) in int4, in rows of 64
LQER_A_BITS = 2
LQER_B_BITS = 4
LQER_GROUP = 64
CALIB_BATCH_SEQS = 8  # GPTQ's calibration: sequences a forward
# Each COMPRESSOR's options, and the first bytes that tell its artifacts (brotli has none: a tag of ours)
COMPRESSORS = {"zlib": dict(level=9), "brotli": dict(quality=11), "zpaq": dict(level=5, threads=1)}
BROTLI_TAG = b"BROTLI"
LEADING_BYTES = {"zlib": b"\x78", "brotli": BROTLI_TAG, "zpaq": b"7kSt"}

def compress(raw, name):
    tag = BROTLI_TAG if name == "brotli" else b""
    return tag + importlib.import_module(name).compress(raw, **COMPRESSORS[name])

def decompress(blob, what):
    """An artifact's bytes decompressed by the COMPRESSOR its first bytes name."""
    names = [name for name, lead in LEADING_BYTES.items() if blob.startswith(lead)]
    require(bool(names), f"{what}: its first bytes {blob[:6]!r} are those of no COMPRESSOR")
    return importlib.import_module(names[0]).decompress(blob.removeprefix(BROTLI_TAG))

def is_quantized(name, tensor):
    """Stored as integers: the large matrices, and the attention gates (int8 rows, the field's)."""
    big = tensor.ndim == 2 and tensor.numel() > KEEP_FLOAT_MAX_NUMEL
    return tensor.is_floating_point() and (big or name.endswith("attn_gate"))

def quant_spec(name, hp):
    """(bits, clip in row stds; 0: the searched clip) of a matrix stored as integers, by kind."""
    if name == "tok_emb.weight":
        return hp.embed_bits, hp.embed_clip_sigmas
    if name.endswith("attn_gate"):
        return 8, 0.0
    if ".attn." in name and hp.attn_clip_sigmas:
        return hp.matrix_bits, hp.attn_clip_sigmas
    if ".mlp." in name and hp.mlp_clip_sigmas:
        return hp.matrix_bits, hp.mlp_clip_sigmas
    return hp.matrix_bits, hp.matrix_clip_sigmas

def int_rows(x, steps, low, high):
    """Per-row integers in [low, high] and fp16 steps, each row's best of candidates (K, R, 1)."""
    # floored at fp16's smallest normal (no division by 0); beyond its range: inf, which the export refuses
    steps = steps.clamp(min=2.0 ** -14).half().float()
    q = torch.clamp(torch.round(x / steps), low, high)  # (K, R, C)
    best = (q * steps - x).square().sum(dim=2).argmin(dim=0)  # (R,)
    rows = torch.arange(x.size(0), device=x.device)
    return q[best, rows], steps[best, rows, 0]

def quantize_rows(w, bits, sigmas=0.0):
    """Symmetric integers in [-qmax, qmax], fp16 steps: at the searched clip or SIGMAS row stds."""
    qmax = 2 ** (bits - 1) - 1
    if sigmas:
        clips = [sigmas * w.std(dim=1, keepdim=True)]
    else:
        absmax = w.abs().amax(dim=1, keepdim=True)  # (R, 1)
        clips = [absmax * f for f in CLIP_FRACTIONS]
    return int_rows(w, torch.stack(clips) / qmax, -qmax, qmax)

def gptq_quantize(w, H, bits, damp=0.01, sigmas=0.0, block=128):
    """GPTQ (Frantar et al. 2022) with quantize_rows's scales, in act order: each column's rounding error goes
    onto later ones by the Cholesky factor of H^-1, H damped by damp * mean(diag H). H = I: round-to-nearest."""
    qmax = 2 ** (bits - 1) - 1
    scale = quantize_rows(w, bits, sigmas)[1]
    W = w.double().clone()
    H = H.double().clone()
    dead = H.diagonal() == 0  # inputs that were always zero: their weights do not matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    order = torch.argsort(H.diagonal(), descending=True)
    W = W[:, order]
    H = H[order][:, order]
    H += damp * H.diagonal().mean() * torch.eye(len(H), dtype=H.dtype, device=H.device)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)

    s = scale.double()
    Q = torch.zeros_like(W)
    for a in range(0, W.size(1), block):
        b = min(a + block, W.size(1))
        err = torch.zeros_like(W[:, a:b])  # (R, b - a)
        for j in range(a, b):
            Q[:, j] = torch.clamp(torch.round(W[:, j] / s), -qmax, qmax)
            err[:, j - a] = (W[:, j] - Q[:, j] * s) / U[j, j]
            W[:, j + 1:b] -= err[:, j - a:j - a + 1] @ U[j:j + 1, j + 1:b]
        W[:, b:] -= err @ U[a:b, b:]
    return Q[:, torch.argsort(order)].float(), scale

def lqer_factors(error, rank):
    """LQER (Zhang et al. 2024): error ~ A B, A = U_r S_r and B = V_r^T, each flattened into rows to quantize:
    A as one row, B in rows of LQER_GROUP (zero-padded)."""
    U, S, Vh = torch.linalg.svd(error.double(), full_matrices=False)
    A = (U[:, :rank] * S[:rank]).float()
    B = Vh[:rank].float().flatten()
    padded = F.pad(B, (0, math.ceil(len(B) / LQER_GROUP) * LQER_GROUP - len(B)))
    return A.reshape(1, -1), padded.view(-1, LQER_GROUP)

def quantize_state_dict(state_dict, hp, hessians=None):
    """Matrices -> per-row integers, a byte each (compresses best), fp16 scales; the rest float."""
    ints = {}
    scales = {}
    floats = {}
    dtypes = {}
    for name, tensor in progress(state_dict.items(), "export: tensors"):
        tensor = tensor.detach().cpu()
        dtypes[name] = str(tensor.dtype).removeprefix("torch.")
        if not tensor.is_floating_point():
            floats[name] = tensor
            continue
        if not is_quantized(name, tensor):
            floats[name] = tensor.float() if is_control(name) else tensor.half()
            stored = floats[name]
        else:
            bits, sigmas = quant_spec(name, hp)
            if name in (hessians or {}):
                q, scale = gptq_quantize(tensor, hessians[name].cpu(), bits, sigmas=sigmas)
            else:
                q, scale = quantize_rows(tensor.float(), bits, sigmas)
            ints[name] = q.to(torch.int8)
            scales[name] = scale.half()
            stored = scales[name]

        finite = torch.isfinite(tensor).all() and torch.isfinite(stored).all()
        require(bool(finite), f"export: {name} holds |w| up to {tensor.abs().max():.4g}: not finite, or beyond "
                "fp16's 65504 in its stored form; no artifact can hold this model: lower the learning rates",
                RunError)
    if hp.lqer_enabled:
        add_lqer(state_dict, ints, scales, hp.lqer_rank, hp.lqer_top_k)
    return {"format": "int8_rows_v2", "ints": ints, "scales": scales, "floats": floats, "dtypes": dtypes}

def add_lqer(state_dict, ints, scales, rank, top_k):
    """LQER: low-rank factors of the top_k largest quantization errors, stored as W.lqer_a, W.lqer_b."""
    errors = {name: state_dict[name].detach().cpu().float() - q * scales[name].float()[:, None]
              for name, q in ints.items()}
    for name in sorted(errors, key=lambda name: -errors[name].norm())[:top_k]:
        A, B = lqer_factors(errors[name], rank)
        for part, x, bits in ((".lqer_a", A, LQER_A_BITS), (".lqer_b", B, LQER_B_BITS)):
            # asymmetric integers: [-top, top - 1], steps absmax / 1.5 (int2), / 7.5 (int4)
            top = 2 ** (bits - 1)
            step = (x.abs().amax(dim=1, keepdim=True) / (top - 0.5)).clamp(max=torch.finfo(torch.float16).max)
            q, scale = int_rows(x, step[None], -top, top - 1)
            ints[name + part] = q.to(torch.int8)
            scales[name + part] = scale.half()

def dequantize_state_dict(obj):
    """The state dict: integers times their rows' steps (+ LQER's A B), the rest as stored, in its dtypes."""
    weights = {name: q.float() * obj["scales"][name].float()[:, None] for name, q in obj["ints"].items()}
    for name in [name.removesuffix(".lqer_a") for name in weights if name.endswith(".lqer_a")]:
        W = weights[name]
        A = weights.pop(f"{name}.lqer_a").view(len(W), -1)
        B = weights.pop(f"{name}.lqer_b").flatten()
        W += A @ B[:A.size(1) * W.size(1)].view(A.size(1), W.size(1))
    stored = {**obj["floats"], **weights}
    return {name: stored[name].to(getattr(torch, dtype)) for name, dtype in obj["dtypes"].items()}

def save_artifact(state_dict, path, hp, hessians=None):
    """The artifact's bytes, also written to path unless None (all or nothing: a renamed temp)."""
    buffer = io.BytesIO()
    torch.save(quantize_state_dict(state_dict, hp, hessians), buffer)
    blob = compress(buffer.getvalue(), hp.compressor)
    if path is None:
        return blob

    # nodes sharing the folder rename their own; a full disk: one line, no partial file left
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(blob)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise RunError(settings_py("unwritten_artifact", path, len(blob), e, alone=str(e))) from None
    os.replace(tmp, path)
    return blob

def load_artifact(source):
    """An artifact's weights (a path or bytes), its compressor by its first bytes (weights_only)."""
    if isinstance(source, bytes):
        raw = decompress(source, "artifact")
    else:
        raw = decompress(Path(source).read_bytes(), source)
    return dequantize_state_dict(torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True))

def calibrate(run, loader):
    """GPTQ's H = X^T X of each quantized matrix's inputs (embedding: the head's), on next training tokens."""
    hp, layout, model = run.hp, run.layout, run.model
    t0 = time.perf_counter()
    seqs = max(1, hp.gptq_calib_seqs // layout.world_size)
    tokens = loader.take(seqs * layout.world_size * hp.train_seq_len).to(layout.device, torch.int64)
    # the ranks split what one process would read, so they see the same rows
    x = tokens.view(layout.world_size, seqs, hp.train_seq_len)[layout.rank]

    modules = {f"{name}.weight": m for name, m in model.named_modules()
               if isinstance(m, CastedLinear) and is_quantized(f"{name}.weight", m.weight)}
    modules["tok_emb.weight"] = model.final_norm
    hessians = {}
    def accumulate(module, inputs, output, name):  # a module run twice (depth recurrence) adds both
        x = output if module is model.final_norm else inputs[0]
        x = x.flatten(0, -2).double()
        hessians[name] = hessians.get(name, 0) + x.T @ x
    hooks = [m.register_forward_hook(partial(accumulate, name=name)) for name, m in modules.items()]
    with torch.no_grad(), autocast(layout):
        for batch in x.split(CALIB_BATCH_SEQS):
            model.logits(batch)
    for hook in hooks:
        hook.remove()
    if layout.distributed:
        for H in hessians.values():
            dist.all_reduce(H)
    synchronize(layout.device)
    ms = ms_since(t0)
    run.log(f"gptq: matrices:{len(hessians)} calib:train sequences:{seqs * layout.world_size} "
            f"calibration_time:{ms:.0f}ms reserved:{1000 * hp.gptq_reserve_seconds:.0f}ms")
    return hessians

def export(run, hessians=None):
    """Quantize and compress; every rank makes the same bytes (none waits in a collective)."""
    hp, log = run.hp, run.log
    t0 = time.perf_counter()
    path = Path(hp.artifact_dir) / f"{hp.run_id}_model.{hp.export_tag}.ptz"
    writes = path if run.layout.local_rank == 0 else None  # one process a node
    blob = save_artifact(run.model.state_dict(), writes, hp, hessians)

    code = run.source
    packed = ""
    if hp.pack_code:
        code = importlib.import_module("tools.packing").pack_source(code)
        packed = f" (packed from {len(run.source)}: PACK_CODE=1)"
    total = len(code) + len(blob)
    ms = ms_since(t0)
    name = hp.export_tag.replace("_", "+")
    log(f"Serialized model {name}: {len(blob)} bytes")
    log(f"Code size: {len(code)} bytes{packed}")
    log(f"Total submission size {name}: {total} bytes")
    log(f"artifact: {path.as_posix()} bytes:{len(blob)} sha256:{hashlib.sha256(blob).hexdigest()} "
        f"export_time:{ms:.0f}ms")
    if total > SUBMISSION_LIMIT_BYTES:
        log(f"WARNING: submission is {total} bytes, over the {SUBMISSION_LIMIT_BYTES:,}-byte cap: "
            "it cannot be a record")
    return blob

# ---- TRAINING ----
# Steps under the wallclock cap: its clock counts training only, and every rank agrees on it after each step.
Optimizers = NamedTuple("Optimizers", [("adam", torch.optim.AdamW), ("muon", Muon)])

def build_optimizers(model, hp, layout):
    """AdamW for the embeddings, vectors and control tensors; Muon for the other 2-D matrices."""
    params = dict(model.named_parameters())
    embeddings = [params.pop(name) for name in ("tok_emb.weight", "bigram.weight") if name in params]
    matrices = [p for name, p in params.items() if p.ndim == 2 and not is_control(name)]
    scalars = [p for p in params.values() if not any(p is m for m in matrices)]

    adam_groups = [dict(params=embeddings, lr=hp.tied_embed_lr, weight_decay=hp.embed_wd),
                   dict(params=scalars, lr=hp.scalar_lr, weight_decay=hp.adam_wd)]
    adam = torch.optim.AdamW(adam_groups, betas=(hp.beta1, hp.beta2), eps=hp.adam_eps, weight_decay=0.0,
                             fused=layout.cuda)
    coeffs = POLAR_EXPRESS_COEFFS if hp.muon_polar else QUINTIC_COEFFS
    muon = Muon(matrices, lr=hp.matrix_lr, momentum=hp.muon_momentum, weight_decay=hp.muon_wd,
                backend_steps=hp.muon_backend_steps, coeffs=coeffs, row_normalize=hp.muon_row_normalize,
                bf16=layout.use_bf16, compiled=layout.use_compile, rank=layout.rank,
                world_size=layout.world_size)
    for group in adam.param_groups + muon.param_groups:  # the schedule scales each group's own LR
        group["base_lr"] = group["lr"]
    return Optimizers(adam, muon)

def training_progress(step, elapsed_ms, hp):
    return max(step / max(hp.iterations, 1), elapsed_ms / hp.budget_ms)

def lr_schedule(step, elapsed_ms, hp):
    """LR multiplier: 1, then linear to 0 over the last WARMDOWN_FRAC of the budget, or the last
    WARMDOWN_ITERS steps (under a wallclock cap: their mean time, if sooner); floored at MIN_LR."""
    if hp.warmdown_frac > 0:
        left = max(1.0 - training_progress(step, elapsed_ms, hp), 0.0) / hp.warmdown_frac
        return max(min(1.0, left), hp.min_lr)
    left = 1.0
    if hp.warmdown_iters > 0:
        left = min(1.0, max(hp.iterations - step, 0) / hp.warmdown_iters)
    if hp.budget_ms < math.inf:
        warmdown_ms = max(hp.warmdown_iters * elapsed_ms / max(step, 1), 1e-9)
        left = min(left, max(hp.budget_ms - elapsed_ms, 0.0) / warmdown_ms)
    return max(left, hp.min_lr)

def muon_momentum(step, hp):
    """Muon's momentum, warmed up linearly from MUON_MOMENTUM_WARMUP_START over its steps."""
    if hp.muon_momentum_warmup_steps <= 0:
        return hp.muon_momentum
    frac = min(step / hp.muon_momentum_warmup_steps, 1.0)
    return (1 - frac) * hp.muon_momentum_warmup_start + frac * hp.muon_momentum

def looping_at(progress, hp):
    return hp.num_loops > 0 and hp.enable_looping_at < 1.0 and progress >= hp.enable_looping_at

class EMA:
    """The weights' moving average (EMA_DECAY; 0: off, no-op): it validates and exports (swap())."""

    def __init__(self, model, decay):
        self.decay = decay
        self.params = [p.detach().clone() for p in model.parameters()] if decay > 0 else None

    def update(self, model):
        if self.params is not None:
            torch._foreach_lerp_(self.params, [p.detach() for p in model.parameters()], 1.0 - self.decay)

    def swap(self, model):
        if self.params is None:
            return
        live = [p.detach().clone() for p in model.parameters()]
        torch._foreach_copy_([p.detach() for p in model.parameters()], self.params)
        self.params = live

def train_step(model, batches, optimizers, lr_scale, grad_clip, layout):
    """One optimizer step over micro-batches [(x, y), ...], all-reduced once; returns mean loss."""
    total = torch.zeros((), device=layout.device)
    for i, (x, y) in enumerate(batches):
        if layout.distributed:
            model.require_backward_grad_sync = i == len(batches) - 1
        with autocast(layout):
            loss = model(x, y)
        (loss / len(batches)).backward()
        total += loss.detach()

    if grad_clip > 0:
        params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
        torch.nn.utils.clip_grad_norm_(params, grad_clip)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * lr_scale
        opt.step()
        opt.zero_grad(set_to_none=True)
    return total / len(batches)

def next_batches(loader, hp, layout):
    accum = layout.grad_accum_steps
    return [loader.next_batch(hp.train_batch_tokens, hp.train_seq_len, accum) for _ in range(accum)]

def compiled_graphs():
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]

def warmup(run, optimizers):
    """Compile each phase's training step, before the clock: WARMUP_STEPS steps, then the weights,
    the optimizer states and the data start again. The final passes prime their own graphs."""
    hp, layout, model = run.hp, run.layout, run.model
    t0 = time.perf_counter()
    initial = [{name: t.to("cpu", copy=True) for name, t in model.state_dict().items()}]
    initial += [copy.deepcopy(opt.state_dict()) for opt in optimizers]
    first = looping_at(0.0, hp)  # the loop phase of the first half of the steps, then the one it switches to
    switched = looping_at(hp.enable_looping_at, hp)
    loader = DistributedTokenLoader(train_pattern(hp.data_path), layout.rank, layout.world_size, layout.device)
    if layout.use_compile:
        run.log(f"compiling: the training step, {len({first, switched})} loop phase(s): about 1 to 3 minutes")
    for step in range(hp.warmup_steps):
        model.set_looping(switched if 2 * step >= hp.warmup_steps else first)
        train_step(run.trainer, next_batches(loader, hp, layout), optimizers, 1.0, hp.grad_clip_norm, layout)

    model.zero_grad(set_to_none=True)
    for target, state in zip([model, *optimizers], initial):
        target.load_state_dict(state)
    model.set_looping(first)  # the phase training starts in (a resume: the Keeper sets its own)
    synchronize(layout.device)
    run.log(f"warmup: steps:{hp.warmup_steps} phases:{len({first, switched})} graphs:{compiled_graphs()} "
            f"time:{ms_since(t0):.0f}ms")

@dataclass
class LoopState:
    """Where training stands (with weights and data: all a resume needs); its clock counts training only."""
    step: int = 0
    training_time_ms: float = 0.0
    elapsed_ms: float = 0.0  # the clock all ranks agreed on after the last step

    def ended(self, hp):
        return self.step >= hp.iterations or self.elapsed_ms >= hp.budget_ms

    def start_clock(self, device):
        synchronize(device)
        self.device = device
        self.t0 = time.perf_counter()

    def clock_ms(self):  # not synchronized: the step's work may still be queued
        return self.training_time_ms + ms_since(self.t0)

    @contextmanager
    def paused(self, seen, layout):
        """The clock stopped, the device done: no validation, checkpoint or export follows a bad loss."""
        synchronize(self.device)
        self.training_time_ms += ms_since(self.t0)
        check_finite(agree([float(not np.isfinite(seen))], layout)[0], self.step)
        yield
        self.start_clock(self.device)

def agree(values, layout):
    """The max over ranks of host values, read back (as the challenge's stop): one process reads no device."""
    if not layout.distributed:
        return values
    # on the host: gloo reduces it, and NCCL's device waits for nothing
    agreed = np.array(values, dtype=np.float64)
    dist.all_reduce(torch.from_numpy(agreed), op=dist.ReduceOp.MAX)
    return agreed.tolist()

def check_finite(diverged, step):
    require(not diverged, f"training diverged: train_loss was not finite by step:{step}; lower MATRIX_LR "
            "/ TIED_EMBED_LR / SCALAR_LR or set GRAD_CLIP_NORM (and resume a checkpoint, if any)", RunError)

def log_step(log, state, loss, hp):
    if hp.train_log_every <= 0 or (state.step > 10 and state.step % hp.train_log_every):
        return
    elapsed = state.elapsed_ms
    tokens_per_s = hp.train_batch_tokens * state.step / (elapsed / 1000.0)
    log(f"step:{state.step}/{hp.iterations} train_loss:{loss.item():.4f} train_time:{elapsed:.0f}ms "
        f"step_avg:{elapsed / state.step:.2f}ms tok/s:{tokens_per_s:.0f}")

def train(run, optimizers, ema, loader):
    """Validate when due, step, agree, switch the loop phase, checkpoint, till the budget ends. A steady step
    reads nothing of the device on one process: the host queues the next while the device runs this one."""
    hp, layout, model, keeper = run.hp, run.layout, run.model, run.keeper
    saved = keeper.restore(run, optimizers, ema, loader) if keeper else {}
    state = LoopState(**{f.name: saved.get(f.name, f.default) for f in fields(LoopState)})
    # the host reads each loss a step or two late from pinned memory, never waiting; a NaN makes all later ones so
    last_loss = torch.zeros((), pin_memory=layout.cuda)
    seen = last_loss.numpy()
    first_step = state.step
    state.start_clock(layout.device)
    while True:
        every = hp.val_loss_every  # (a resumed run's first step was validated before it stopped)
        due = every > 0 and state.step % every == 0 and (state.step > first_step or state.step == 0)
        if due or state.ended(hp):
            with state.paused(seen, layout):
                ema.swap(model)  # scored: the weights that will be exported
                val_loss, val_bpb = metrics(score(run.scorer, run.val, layout, *hp.windows(False)))
                spent = state.training_time_ms
                run.log(f"step:{state.step}/{hp.iterations} val_loss:{val_loss:.4f} val_bpb:{val_bpb:.4f} "
                        f"train_time:{spent:.0f}ms step_avg:{spent / max(state.step, 1):.2f}ms")
                ema.swap(model)
        if state.ended(hp):
            break

        for group in optimizers.muon.param_groups:
            group["momentum"] = muon_momentum(state.step, hp)
        lr_scale = lr_schedule(state.step, state.elapsed_ms, hp)
        batches = next_batches(loader, hp, layout)
        loss = train_step(run.trainer, batches, optimizers, lr_scale, hp.grad_clip_norm, layout)
        ema.update(model)
        last_loss.copy_(loss, non_blocking=True)
        state.step += 1
        state.elapsed_ms = state.clock_ms()
        log_step(run.log, state, loss, hp)

        signum = keeper.signum if keeper else 0
        agreed = agree([state.elapsed_ms, signum, float(not np.isfinite(seen))], layout)
        state.elapsed_ms, signum, diverged = agreed
        check_finite(diverged, state.step)
        looping = looping_at(training_progress(state.step, state.elapsed_ms, hp), hp)
        if looping != model.looping and not state.ended(hp):  # no phase the model never trained in
            model.set_looping(looping)
            run.log(f"phase: from step:{state.step} depth_recurrence:{'on' if looping else 'off'}")
        if keeper and keeper.due(state, int(signum)):
            with state.paused(seen, layout):
                keeper.save(run, optimizers, ema, loader, state, int(signum))
            if signum:
                shutdown(run)
                sys.exit(128 + int(signum))

    if state.elapsed_ms >= hp.budget_ms and state.step < hp.iterations:
        spent = state.training_time_ms
        run.log(f"stopping_early: wallclock_cap train_time:{spent:.0f}ms step:{state.step}/{hp.iterations}")
    if keeper:
        keeper.close()

# ---- RUN ----
# main() is the recipe: set up (checks first), build, compile, train, calibrate, export, read back, score.
@dataclass
class RunLog:
    """Rank 0's console lines, mirrored into ARTIFACT_DIR/<RUN_ID>.txt after the script's source."""
    path: Path | None = None  # None: lines go nowhere (tests, tools)
    is_main: bool = True

    def write_header(self, run):
        """Rank 0's: the source, what ran where (settings.py's lines), the build, settings, layout and data's
        fingerprints; a resume continues its own run's log (setup() let it through) without the source."""
        if not self.is_main:
            return
        source, hp, layout = run.source, run.hp, run.layout
        digest = hashlib.sha256(source).hexdigest()
        if not self.path.exists():
            with open(self.path, "xb") as f:  # "x": never overwrite an earlier run's log
                f.write(f"==== train_gpt.py source bytes:{len(source)} sha256:{digest} ====\n".encode())
                f.write(source + b"\n==== end of source ====\n")
        skipped = f"settings: not checked; versions, hardware, command, errors not logged: {ALONE}"
        for line in settings_py("describe_run", layout, hp, alone=[skipped]):
            self(line)

        self(f"build: {BUILD}")
        self(f"hyperparameters: {json.dumps(asdict(hp))}")
        self(f"world_size:{layout.world_size} grad_accum_steps:{layout.grad_accum_steps} "
             f"device:{layout.device.type} compile:{layout.use_compile} bf16:{layout.use_bf16}")
        print(f"logfile: {self.path}")
        shards = len(glob.glob(train_pattern(hp.data_path)))
        val_bytes = int(run.val.bytes[1:].sum())
        self(f"val_tokens:{run.val.tokens.numel() - 1} val_bytes:{val_bytes} train_shards:{shards}")

    def __call__(self, message):
        if self.path is None or not self.is_main:
            return
        print(message, flush=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(message + "\n")

@dataclass
class Run:
    """What setup() read and checked, and the model main() builds: what the stages of main() share."""
    hp: Hyperparameters
    layout: Layout
    val: Validation
    source: bytes
    keeper: object = None
    log: RunLog = field(default_factory=RunLog)
    model: GPT | None = None  # the plain module: its weights are trained and exported
    scorer: nn.Module | None = None  # the same weights, compiled on CUDA: what evaluates
    trainer: nn.Module | None = None  # the compiled model as DDP wraps it: what trains

def setup(environ=os.environ) -> Run:
    """Each check that can fail, on each rank, first; then the device, the processes and their one RUN_ID."""
    world_size = int(environ.get("WORLD_SIZE", 1))
    rank = int(environ.get("RANK", 0))
    local_rank = int(environ.get("LOCAL_RANK", 0))
    hp = Hyperparameters.from_env(environ, world_size)
    device = pick_device(local_rank, hp.device)
    def on(mode):
        return device.type == "cuda" if mode == "auto" else mode == "1"
    layout = Layout(rank, world_size, local_rank, device, hp.micro_steps(world_size),
                    use_compile=on(hp.compile), use_bf16=on(hp.bf16))
    check("layout_problems", hp, layout)
    piece_bytes = load_tokenizer(hp.tokenizer_path, hp.vocab_size)
    shards = load_shards(train_pattern(hp.data_path), "training", hp.vocab_size, (rank, world_size))
    val = load_validation(hp, piece_bytes, (rank, world_size), device)

    # the device's modes, then the processes: host tensors (agree()) go through gloo
    if layout.cuda:
        torch.cuda.set_device(layout.device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(not layout.use_bf16)  # flash is 16-bit: math for fp32
    run_id = [hp.run_id or str(uuid.uuid4())]
    if layout.distributed:
        backend = "cuda:nccl,cpu:gloo" if layout.cuda else "gloo"
        dist.init_process_group(backend=backend, device_id=layout.device if layout.cuda else None)
        dist.broadcast_object_list(run_id, src=0)
    hp = dataclasses.replace(hp, run_id=run_id[0])

    # read once: the logged and the counted code are the same bytes
    source = Path(__file__).read_bytes()
    keeper = None
    # what a record never does lives beside this file, handed what it uses
    if hp.save_every or hp.resume:
        keeper = importlib.import_module("checkpoints").Keeper(hp, source, shards, ConfigError)
    log_path = Path(hp.artifact_dir) / f"{hp.run_id}.txt"
    if layout.rank == 0 and log_path.exists() and not (keeper and keeper.continues_log()):  # rank 0 writes it
        raise ConfigError(f"RUN_ID={hp.run_id}: {log_path} exists; choose another RUN_ID or move that log")
    Path(hp.artifact_dir).mkdir(parents=True, exist_ok=True)
    return Run(hp, layout, val, source, keeper, RunLog(log_path, layout.rank == 0))

def build_model(hp, layout) -> tuple[GPT, nn.Module, nn.Module]:
    """The model (seeded), and its handles: compiled on CUDA to score, and as DDP wraps it to train."""
    torch.manual_seed(hp.seed)
    model = GPT(hp.model_config).to(layout.device)

    scorer = model
    if layout.use_compile:
        # training phases x eval shapes; fullgraph fails past it (named cache_size_limit before torch 2.7)
        torch._dynamo.config.cache_size_limit = 64
        torch._dynamo.config.optimize_ddp = hp.optimize_ddp
        scorer = torch.compile(model, dynamic=False, fullgraph=True)
    trainer = scorer
    if layout.distributed:  # no buffer broadcast: every rank holds the same RoPE tables and flags
        device_ids = [layout.local_rank] if layout.cuda else None
        trainer = DDP(scorer, device_ids=device_ids, broadcast_buffers=False)
    return model, scorer, trainer

def main():
    run = setup()
    hp, layout, log = run.hp, run.layout, run.log
    try:
        log.write_header(run)
        run.model, run.scorer, run.trainer = build_model(hp, layout)
        log(f"model_params:{sum(p.numel() for p in run.model.parameters())}")
        optimizers = build_optimizers(run.model, hp, layout)
        warmup(run, optimizers)
        ema = EMA(run.model, hp.ema_decay)
        loader = DistributedTokenLoader(train_pattern(hp.data_path), layout.rank, layout.world_size, layout.device)
        train(run, optimizers, ema, loader)
        if layout.cuda:
            log(f"peak memory allocated: {torch.cuda.max_memory_allocated() // 2**20} MiB "
                f"reserved: {torch.cuda.max_memory_reserved() // 2**20} MiB")

        # calibration and export see the weights the last validation scored; GPTQ reads on from the loader
        ema.swap(run.model)
        hessians = None
        if hp.gptq:
            hessians = calibrate(run, loader)
        blob = export(run, hessians)
        run.model.load_state_dict(load_artifact(blob), strict=True)
        final_passes(run)
        shutdown(run)
    except BaseException as error:
        settings_py("log_failure", log.path, error, layout.rank, STOPS)
        raise

def shutdown(run):
    if run.layout.distributed:
        dist.barrier()  # without it, gloo tears down while a peer is still in its last collective
        run.trainer = None  # DDP holds the group: freed now, gloo's threads cannot abort the exit
        gc.collect()
        dist.destroy_process_group()

if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(settings_py("help_text", alone=f"--help: {ALONE}"))
        sys.exit(0)
    try:
        main()
    except STOPS as e:
        sys.exit(f"train_gpt.py: error: {e}")
