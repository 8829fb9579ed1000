"""settings.py: what train_gpt.py's settings may be, checked before any work, and its --help.

train_gpt.py imports this module when it sits beside it: names that look like settings but are not
(typos, our former names, retired ones, the field's that the trainer lacks) are refused all at once,
and so are values the settings alone make impossible. A record folder's copy of train_gpt.py runs
without it, unchecked, and its log says so. Checks that need the data, the tokenizer or the number of
processes stay in the trainer. This module imports nothing of the trainer: it reads train_gpt.py's
source for the help (and for tools/settings_table.py's table), and is handed the settings it checks.
It also writes what serves the operator, not the run's result: the log's lines on the versions, the hardware
and the command that reproduces the run (the resume's command too), and the errors that end a run.
"""

import difflib
import importlib.util
import os
import platform
import re
import shlex
import traceback
from dataclasses import fields
from pathlib import Path

TRAINER = Path(__file__).with_name("train_gpt.py")

# Names refused with what to use instead: ours before they took the field's (2026-11-25), the field's
# for two of the baseline's, ours retired (None).
INSTEAD = dict(
    TTT="TTT_ENABLED",
    LOOP_REPEATS="NUM_LOOPS",
    LOOP_START_FRAC="ENABLE_LOOPING_AT",
    MIN_LR_SCALE="MIN_LR",
    PARALLEL_FROM="PARALLEL_START_LAYER",
    QUANT_BITS="MATRIX_BITS",
    EMBED_QUANT_BITS="EMBED_BITS",
    QUANT_SIGMAS="MATRIX_CLIP_SIGMAS",
    ATTN_QUANT_SIGMAS="ATTN_CLIP_SIGMAS",
    MLP_QUANT_SIGMAS="MLP_CLIP_SIGMAS",
    EMBED_QUANT_SIGMAS="EMBED_CLIP_SIGMAS",
    MUON_ROW_NORM="MUON_ROW_NORMALIZE",
    SCALAR_WD="ADAM_WD",
    SMEAR_GATE="SMEAR_GATE_ENABLED",
    SKIP_GATES="SKIP_GATES_ENABLED",
    ATTN_GATE="SPARSE_ATTN_GATE_ENABLED",
    BIGRAM_BUCKETS="BIGRAM_VOCAB_SIZE",
    SLIDING_EVAL="SLIDING_WINDOW_ENABLED",
    LOG_DIR="ARTIFACT_DIR",
    VAL_BATCH_TOKENS="VAL_BATCH_SIZE",
    GPTQ_CALIBRATION_BATCHES="GPTQ_CALIB_SEQS (sequences)",
    **dict.fromkeys(["TTT_LR", "TTT_MOMENTUM", "TTT_EPOCHS", "TTT_GRAD_CLIP", "TTT_CHUNK_TOKENS",
                     "QAT_START_FRAC", "SAMPLE_EVERY", "TTT_PARAMS", "GPTQ_CALIB", "GPTQ_TEMPERATURE",
                     "GPTQ_DAMP", "TIE_EMBEDDINGS", "EMBED_LR", "HEAD_LR", "TTT_BETA1",
                     "EVAL_SEQ_LEN"]),
)
# Prefixes of the field's settings that train_gpt.py lacks: refused, never silently ignored.
FIELD_LACKS = ("TTT_", "PHASED_TTT_", "GLOBAL_TTT_", "GATE", "ATTN_OUT_GATE", "SPARSE_ATTN_GATE_", "MTP_",
               "WD_TAPER", "EMBEDDING_DIM", "ROPE_", "PARALLEL_", "LQER_", "CASEOPS_", "FUSED_CE_", "SWA_",
               "SLIDING_WINDOW_", "VAL_DOC_FRACTION", "PREQUANT_ONLY", "EVAL_ONLY", "VAL_FILES", "DATA_DIR")

POSITIVE = ("train_batch_tokens", "logit_softcap", "rope_base", "train_seq_len", "val_batch_size",
            "vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult",
            "muon_backend_steps", "gptq_calib_seqs", "lqer_rank", "ttt_lora_rank", "ttt_chunk_size",
            "ttt_batch_size")
FRACTIONS = ("enable_looping_at", "warmdown_frac", "min_lr", "ttt_beta2")
CHOICES = dict(device=("auto", "cuda", "cpu"), compile=("auto", "0", "1"), bf16=("auto", "0", "1"),
               matrix_bits=(4, 5, 6, 7, 8), embed_bits=(4, 5, 6, 7, 8), sidecar_bytes=("check", "trust"),
               compressor=("zlib", "brotli", "zpaq"))
BOOLEANS = {"1": True, "true": True, "0": False, "false": False}


def refused_names(environ, names):
    """A line for each variable of environ that looks like a setting but is none of names."""
    refused = []
    for name, value in environ.items():
        # the baseline's TIE_EMBEDDINGS=1 is what the trainer does
        if name in names or (name, value) == ("TIE_EMBEDDINGS", "1"):
            continue
        typo = difflib.get_close_matches(name, names, 1, 0.9)
        if name in INSTEAD:
            fix = f"use {INSTEAD[name]}" if INSTEAD[name] else "retired (docs/CHANGELOG.md)"
            refused.append(f"{name}={value}: {fix}")
        elif typo:
            refused.append(f"{name}={value}: not a setting; did you mean {typo[0]}?")
        elif name.startswith(FIELD_LACKS):
            refused.append(f"{name}={value}: the field's, not here (docs/GPU.md, \"Commands from the field\")")
    return refused


def environ_problems(environ, hp):
    """Lines for the names in environ that are not settings of hp (its dataclass), and for values that are not
    of their setting's type: the variable, its value, how to write it."""
    names = setting_names(hp)
    refused = refused_names(environ, names)
    found = ["settings this file does not honour (--help lists its own):\n  " + "\n  ".join(refused)] if refused else []
    for name in names:
        default = getattr(hp, name.lower())
        if name not in environ or isinstance(default, str):
            continue
        text = environ[name].strip()
        try:
            if isinstance(default, bool):
                BOOLEANS[text.lower()]
            else:
                type(default)(text)
        except (KeyError, ValueError):
            what = {bool: "0 or 1", int: "an integer", float: "a number"}[type(default)]
            example = int(default) if isinstance(default, bool) else default
            found.append(f"{name}={environ[name]!r} is not {what}; set it like {name}={example}")
    return found


def writable(folder):
    """folder, or the nearest parent that exists (it will be made there), is a directory this process may write."""
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    return existing, existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def problems(hp):
    """A line for each value that the settings alone make impossible: the variable, its value, the fix."""
    values = vars(hp)
    found = []
    def require(ok, message):
        if not ok:
            found.append(message)
    for name, value in values.items():
        if type(value) in (int, float):
            require(value >= 0, f"{name.upper()}={value} must be >= 0")
    for name in POSITIVE:
        require(values[name] > 0, f"{name.upper()}={values[name]} must be positive")
    for name in FRACTIONS:
        require(values[name] <= 1, f"{name.upper()}={values[name]} must be in [0, 1]")
    for name, allowed in CHOICES.items():
        require(values[name] in allowed, f"{name.upper()}={values[name]!r} must be one of {allowed}")
    if found:  # the checks below assume sane values
        return found
    folders = [("ARTIFACT_DIR", hp.artifact_dir)]
    if hp.save_every or hp.resume:
        folders.append(("CHECKPOINT_DIR", hp.checkpoint_dir))
    for name, folder in folders:
        existing, ok = writable(Path(folder))
        require(ok, f"{name}={folder}: {existing} is not a writable directory; choose another")
    if hp.run_id:
        plain = Path(hp.run_id).name == hp.run_id and not hp.run_id.startswith(".") and len(hp.run_id) <= 200
        require(plain, f"RUN_ID={hp.run_id!r} names files: use a plain name (no '/', no leading '.', at most 200 "
                "characters)")
    head_dim = hp.model_dim // hp.num_heads
    require(hp.num_layers >= 2, f"NUM_LAYERS={hp.num_layers}: the U-Net pairs blocks: use 2+")
    require(hp.vocab_size <= 65_536, f"VOCAB_SIZE={hp.vocab_size}: shards hold 65536 ids")
    require(hp.model_dim % hp.num_heads == 0,
            f"MODEL_DIM={hp.model_dim}: use a multiple of NUM_HEADS={hp.num_heads}")
    require(hp.num_heads % hp.num_kv_heads == 0,
            f"NUM_HEADS={hp.num_heads}: use a multiple of NUM_KV_HEADS={hp.num_kv_heads}")
    require(head_dim % 2 == 0, f"MODEL_DIM/NUM_HEADS = {head_dim}: RoPE needs an even head dim")
    rope_ok = hp.rope_dims % 2 == 0 and hp.rope_dims <= head_dim
    require(rope_ok, f"ROPE_DIMS={hp.rope_dims}: use an even number up to the head dim {head_dim}")
    require(hp.xsa_last_n <= hp.num_layers, f"XSA_LAST_N={hp.xsa_last_n}: at most NUM_LAYERS")
    lanes = hp.parallel_start_layer
    require(lanes < hp.num_layers, f"PARALLEL_START_LAYER={lanes}: use a layer below NUM_LAYERS")
    if hp.num_loops:
        span = f"LOOP_START={hp.loop_start} LOOP_END={hp.loop_end}"
        require(hp.loop_start <= hp.loop_end < hp.num_layers, f"{span}: need LOOP_START <= LOOP_END < NUM_LAYERS")
        require(not lanes or lanes > hp.loop_end, f"PARALLEL_START_LAYER={lanes}: past LOOP_END")
    require(hp.bigram_vocab_size != 1, "BIGRAM_VOCAB_SIZE=1: 0, or 2+ (a row is 'no previous token')")
    require(hp.ema_decay < 1.0, f"EMA_DECAY={hp.ema_decay}: below 1; 0 is off, 0.997 typical")
    within = f"at most the scoring window, TRAIN_SEQ_LEN={hp.train_seq_len}"
    require(hp.eval_stride <= hp.train_seq_len, f"EVAL_STRIDE={hp.eval_stride}: {within}")
    if hp.ttt_enabled:  # a chunk is scored in one window
        require(hp.ttt_chunk_size <= hp.train_seq_len, f"TTT_CHUNK_SIZE={hp.ttt_chunk_size}: {within}")
    if hp.compressor in ("brotli", "zpaq"):
        installed = importlib.util.find_spec(hp.compressor)
        require(installed, f"COMPRESSOR={hp.compressor} needs its package: pip install {hp.compressor}")
    packer = Path(__file__).with_name("tools") / "packing.py"  # which train_gpt.py imports to pack itself
    require(not hp.pack_code or packer.is_file(), f"PACK_CODE=1: {packer} is missing; run the repository's "
            "train_gpt.py, or set PACK_CODE=0 (a record folder's packed train_gpt.py counts its own bytes)")
    # GPTQ under a wallclock cap calibrates on training data inside the budget: seconds kept for it
    reserve = hp.gptq_reserve_seconds
    if hp.gptq and hp.max_wallclock_seconds > 0:
        require(reserve, "GPTQ=1 under MAX_WALLCLOCK_SECONDS: set GPTQ_RESERVE_SECONDS")
        require(reserve < hp.max_wallclock_seconds,
                f"GPTQ_RESERVE_SECONDS={reserve}: no time left of MAX_WALLCLOCK_SECONDS")
    else:
        require(not reserve, f"GPTQ_RESERVE_SECONDS={reserve}: only for GPTQ=1 under a cap")
    return found


# ---- --help ----
# A field of Hyperparameters: its name, its default, its comment (methods are indented deeper).
FIELD = re.compile(r"^    (\w+): \w+ = (.+?)(?:  # (.*))?$", re.M)


def rows(trainer=TRAINER):
    """(NAME, default as written, meaning) per setting, in the order of Hyperparameters' lines."""
    source = trainer.read_text(encoding="utf-8")
    fields = source.split("\nclass Hyperparameters:", 1)[1].split("@classmethod", 1)[0]
    return [(name.upper(), default, meaning) for name, default, meaning in
            (m.groups("") for m in FIELD.finditer(fields))]


def help_text():
    """train_gpt.py --help: one aligned line per setting."""
    return "\n".join(f"{name:<27} {default:<13} {meaning}" for name, default, meaning in rows())


def describe_run(layout, hp, environ=os.environ) -> list[str]:
    """The log's lines on what ran where, which the records tools read: versions, hardware and the command."""
    import torch
    versions = f"versions: python:{platform.python_version()} torch:{torch.__version__}"
    return [versions, describe_hardware(layout), f"command: {launch_command(hp, environ)}"]


def describe_hardware(layout) -> str:
    """The GPUs, or the CPU, its cores and threads."""
    import torch
    if layout.cuda:
        return f"hardware: cuda: {layout.world_size}x {torch.cuda.get_device_name(layout.device)}"
    cpuinfo = Path("/proc/cpuinfo")
    found = re.findall(r"^model name\s*: (.*)", cpuinfo.read_text(), flags=re.M) if cpuinfo.exists() else []
    cpu = found[0] if found else platform.processor() or platform.machine()
    return (f"hardware: {layout.device.type}: {cpu}, {os.cpu_count()} logical cores, "
            f"{torch.get_num_threads()} torch threads per process x {layout.world_size} processes")


def log_failure(path, error, rank, plain) -> None:
    """Whatever ends a run goes into its log, from any rank: no log just stops. An error of class plain (the
    trainer's ConfigError) as its message, anything else with its traceback; a SystemExit said why itself."""
    if path is None or isinstance(error, SystemExit):
        return
    text = f"train_gpt.py: error: {error}" if isinstance(error, plain) else traceback.format_exc()
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"error: rank {rank}: {text.rstrip()}\n")


def setting_names(hp) -> list[str]:
    """The environment variables of a Hyperparameters (class or instance), in its order."""
    return [f.name.upper() for f in fields(hp)]


def launch_command(hp, environ=os.environ) -> str:
    """The command that reproduces a run: the settings it set, then the launcher (torchrun's, or python)."""
    names = setting_names(hp)
    settings = [f"{name}={shlex.quote(environ[name])}" for name in sorted(environ) if name in names]
    launcher = "python"
    if "LOCAL_WORLD_SIZE" in environ:
        per_node = environ["LOCAL_WORLD_SIZE"]
        nodes = int(environ["WORLD_SIZE"]) // int(per_node)
        where = "--standalone" if nodes == 1 else f"--nnodes={nodes} --rdzv_endpoint=<first node>"
        launcher = f"torchrun {where} --nproc_per_node={per_node}"
    return " ".join(settings + [f"{launcher} {TRAINER.name}"])
