"""settings.py: what train_gpt.py's settings and inputs may be, checked before any work, and its --help.

train_gpt.py imports this module when it sits beside it: names that look like settings but are not
(typos, our former names, retired ones, the field's that the trainer lacks) are refused all at once,
and so are values the settings alone make impossible, tokenizers that add a space to every document, and
validation data whose documents do not decode to the bytes val_bpb counts for them. A record folder's copy of
train_gpt.py runs without it, unchecked, and its log says so. This module imports nothing of the trainer: it
reads train_gpt.py's source for the help (and for tools/settings_table.py's table), and is handed what it checks.
It also writes what serves the operator, not the run's result: the log's lines on the versions, the hardware
and the command that reproduces the run (the resume's command too), and the errors that end a run.
"""

import difflib
import importlib.util
import os
import platform
import re
import shlex
import shutil
import sys
import time
import traceback
from dataclasses import fields
from pathlib import Path

import numpy as np

TRAINER = Path(__file__).with_name("train_gpt.py")
STACK = Path(__file__).with_name("stack")  # the technique diffs that tools/build_trainer.py builds on the core
BUILD_COMMAND = "python tools/build_trainer.py --stack frontier --out build/train_gpt.py"

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
               "SLIDING_WINDOW_", "VAL_DOC_FRACTION", "PREQUANT_ONLY", "EVAL_ONLY", "VAL_FILES", "DATA_DIR",
               "ASYM_LOGIT_", "SMEAR_GATE_BOS_FIX", "COMPILE_SHAPE_WARMUP", "MIDRUN_CAP_", "MUON_HUBER_", "OPTROT_",
               "QK_GAIN_SCHEDULE", "WORD_ORDER", "WORD_NORMALIZE")

POSITIVE = ("train_batch_tokens", "logit_softcap", "rope_base", "train_seq_len", "val_batch_size",
            "vocab_size", "num_layers", "model_dim", "num_heads", "num_kv_heads", "mlp_mult",
            "muon_backend_steps", "gptq_calib_seqs", "lqer_rank", "ttt_lora_rank", "ttt_chunk_size",
            "ttt_batch_size")
FRACTIONS = ("enable_looping_at", "warmdown_frac", "min_lr", "ttt_beta2")
CHOICES = dict(device=("auto", "cuda", "cpu"), compile=("auto", "0", "1"), bf16=("auto", "0", "1"),
               matrix_bits=(4, 5, 6, 7, 8), embed_bits=(4, 5, 6, 7, 8), sidecar_bytes=("check", "trust"),
               compressor=("zlib", "brotli", "zpaq"))
BOOLEANS = {"1": True, "true": True, "0": False, "false": False}


def stack_settings() -> dict:
    """NAME: the technique of the stack (stack/*.diff) whose diff adds the setting, for a core to point the way."""
    found = {}
    for diff in sorted(STACK.glob("*.diff")):
        for name in re.findall(r"^\+    (\w+): \w+ = ", diff.read_text(encoding="utf-8"), flags=re.M):
            found[name.upper()] = diff.stem
    return found


def refused_names(environ, names):
    """A line for each variable of environ that looks like a setting but is none of names."""
    refused = []
    stack = stack_settings()
    for name, value in environ.items():
        # the baseline's TIE_EMBEDDINGS=1 is what the trainer does
        if name in names or (name, value) == ("TIE_EMBEDDINGS", "1"):
            continue
        typo = difflib.get_close_matches(name, names, 1, 0.9)
        # a setting the core retired may live on in a technique of the stack (EVAL_SEQ_LEN): that way first
        if name in stack:
            refused.append(f"{name}={value}: a setting of the stack's {stack[name]} technique, not of the core: "
                           f"{BUILD_COMMAND} builds the trainer that has it (stack/README.md)")
        elif name in INSTEAD:
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


def problems(hp, world_size=1):
    """A line for each value that the settings alone make impossible with world_size processes: the variable,
    its value, the fix."""
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
    if not hp.grad_accum_steps and 8 % world_size:
        return [f"{world_size} processes: launch 1, 2, 4 or 8, or set GRAD_ACCUM_STEPS"]
    per_micro = world_size * hp.micro_steps(world_size) * hp.train_seq_len
    batch = hp.train_batch_tokens
    require(batch % per_micro == 0, f"TRAIN_BATCH_TOKENS={batch}: use a multiple of {per_micro}")
    val_batch = hp.val_batch_size
    require(val_batch >= per_micro, f"VAL_BATCH_SIZE={val_batch}: use at least {per_micro}")
    folders = [("ARTIFACT_DIR", hp.artifact_dir)]
    if hp.save_every or hp.resume:
        folders.append(("CHECKPOINT_DIR", hp.checkpoint_dir))
    for name, folder in folders:
        existing, ok = writable(Path(folder))
        require(ok, f"{name}={folder}: {existing} is not a writable directory; choose another")
    require(hp.resume != "latest" or hp.run_id, "RESUME=latest: set RUN_ID to the run to resume")
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


# ---- the data ----
DATA_HINT = ("HINT: python data/build_sotu.py builds the offline corpus (DATA_PATH=./data/datasets/sotu_sp1024,"
             " TOKENIZER_PATH=./data/tokenizers/sotu_1024_bpe.model); data/download_challenge.py the field's")
# The challenge's shards (data/shards.py writes them): 256 little-endian int32 (magic, version, token count,
# zeros), then the token ids as little-endian uint16.
SHARD_MAGIC = 20240520
SHARD_VERSION = 1
SHARD_HEADER_BYTES = 256 * 4


def shards_problems(pattern, what, files) -> list[str]:
    """No shard matches the pattern, or none holds a token."""
    folder = Path(pattern).parent
    if not folder.is_dir():
        return [f"DATA_PATH={folder} is not a directory. {DATA_HINT}"]
    if not files:
        return [f"DATA_PATH: no {what} shards match {pattern}. {DATA_HINT}"]
    if not any(np.fromfile(f, dtype="<i4", count=3)[2] for f in files if Path(f).is_file()):
        return [f"DATA_PATH: the {what} shards {pattern} hold no tokens; rebuild them"]
    return []


def shard_problems(path, vocab_size=None) -> list[str]:
    """What makes a file no shard of the challenge's format (with vocab_size: ids the tokenizer lacks), first."""
    path = Path(path)
    fix = "rebuild or re-download this shard (see data/README.md)"
    if not path.is_file():
        return [f"{path}: not a readable file; {fix}"]
    size = path.stat().st_size
    if size < SHARD_HEADER_BYTES:
        return [f"{path}: {size} bytes is shorter than the shard header; {fix}"]
    magic, version, num_tokens = np.fromfile(path, dtype="<i4", count=3).tolist()
    if (magic, version) != (SHARD_MAGIC, SHARD_VERSION):
        return [f"{path}: magic number {magic}, version {version}: not a token shard ({SHARD_MAGIC}, "
                f"{SHARD_VERSION}), as data/shards.py writes them; {fix}"]
    expected = SHARD_HEADER_BYTES + 2 * num_tokens
    if size != expected:
        damage = "truncated" if size < expected else "has trailing bytes"
        return [f"{path}: {size} bytes, not the {expected} of its header: {damage}; {fix}"]
    if vocab_size is None or not num_tokens:
        return []
    tokens = np.memmap(path, dtype="<u2", mode="r", offset=SHARD_HEADER_BYTES, shape=(num_tokens,))
    if int(tokens.max()) < vocab_size:
        return []
    bad = int(np.argmax(tokens >= vocab_size))
    return [f"{path}: token {bad} is id {int(tokens[bad])}, outside VOCAB_SIZE={vocab_size}: the shard was made "
            "with another tokenizer; set TOKENIZER_PATH and VOCAB_SIZE to its own"]


# ---- the tokenizer and the validation bytes ----
# val_bpb divides by the UTF-8 bytes of the text behind the scored tokens, which train_gpt.py reads off its
# tokenizer's tables (or a CaseOps sidecar). These checks refuse what those tables would miscount.
SPACE = "\u2581"  # SentencePiece's space symbol

# The field's lossless case transform (CaseOps v1) writes lower case, each ASCII word's case an operator before it
# (U+E001 title, U+E002 all caps) or a letter (U+E003 capital next); U+E004 escapes the next char.
CASE_OPERATORS = re.compile("\ue004(.)|\ue001([A-Za-z])|\ue002([A-Za-z]+)|\ue003([A-Za-z])", re.S)


def case_word(match) -> str:
    """One operator of CaseOps text and what follows it, as the original text."""
    escaped, title, caps, capital = match.groups()
    return escaped or (title or caps or capital).upper()


def case_restore(text: str) -> str:
    """The original of CaseOps text; text without operators as it is."""
    return CASE_OPERATORS.sub(case_word, text)


def tokenizer_problems(tokenizer_path, vocab_size, read_pieces) -> list[str]:
    """A tokenizer that read_pieces (the trainer's reader: (kind, piece) of each id, and the decoder) cannot read,
    of another size than VOCAB_SIZE, without BOS at id 1, or (a SentencePiece model) adding a space to every
    document, which the byte tables would count as text."""
    name = f"TOKENIZER_PATH={tokenizer_path}"
    if not Path(tokenizer_path).is_file():
        return [f"{name} is not a file. {DATA_HINT}"]
    try:
        pieces, _ = read_pieces(Path(tokenizer_path))
    except Exception as e:
        return [f"{name} cannot be read as a tokenizer ({type(e).__name__}: {e}); it must be a SentencePiece "
                f".model or a byte tokenizer .json. {DATA_HINT}"]
    if len(pieces) != vocab_size:
        return [f"VOCAB_SIZE={vocab_size} does not match {name}, which has {len(pieces)} ids; "
                f"set VOCAB_SIZE={len(pieces)}"]
    if pieces[1][0] != "control":
        return [f"{name}: id 1 is not BOS; train it with bos_id=1"]
    if str(tokenizer_path).endswith(".json"):
        return []
    import sentencepiece as spm
    added = spm.SentencePieceProcessor(model_file=str(tokenizer_path)).normalize("a")
    if added.endswith(SPACE):
        return [f"{name} adds a space after each document (treat_whitespace_as_suffix)"]
    if added == SPACE + "a":
        return [f"{name} adds a space before each document: use add_dummy_prefix=False"]
    return []


def validation_problems(tokens, counted, share, hp, sidecar, read_pieces) -> list[str]:
    """The validation split's: a byte count for each token, a window of TRAIN_SEQ_LEN + 1 with text, and each
    document of share = (rank, world) counted as its text's bytes, decoded by the tokenizer that read_pieces (the
    trainer's reader) reads (a sidecar's counts too, unless SIDECAR_BYTES=trust)."""
    what = f"DATA_PATH={hp.data_path} validation split"
    if sidecar:
        what += " (its byte sidecar; SIDECAR_BYTES=trust scores by it unchecked)"
    if len(counted) != len(tokens):
        return [f"{what}: {len(counted)} counts for {len(tokens)} tokens; rebuild"]
    seq_len = hp.train_seq_len
    usable = ((tokens.numel() - 1) // seq_len) * seq_len
    if usable == 0 or not counted[1:usable + 1].any():
        pattern = Path(hp.data_path) / "fineweb_val_[0-9]*.bin"
        return [f"DATA_PATH: the validation split {pattern} holds {tokens.numel()} tokens ({int(counted.sum())} "
                f"bytes of text), not one window of {seq_len} + 1 with text; lower TRAIN_SEQ_LEN or build more "
                "validation data"]
    if sidecar and hp.sidecar_bytes == "trust":
        return []
    import torch
    pieces, decode = read_pieces(Path(hp.tokenizer_path))
    no_text = torch.tensor([kind == "control" for kind, _ in pieces])
    return byte_problems(tokens, counted, decode, no_text, what, share, sidecar)


def byte_problems(tokens, counted, decode, no_text, what, share=(0, 1), caseops=False) -> list[str]:
    """The first document of share = (rank, world) whose tokens are not counted as its text's bytes, or a token
    whose bytes are unknown (<unk>). tokens and counted are the split's; decode makes text of ids, and no_text
    (bool, per id) marks the control ids after which a document starts; with caseops, the text is restored from
    CaseOps before it is measured."""
    if (counted < 0).any():
        return [f"{what}: token {int((counted < 0).nonzero()[0])} is <unk>, text the tokenizer could not "
                "write, so its bytes are unknown; use a tokenizer trained with byte_fallback=True"]
    ids = tokens.numpy()
    sums = np.concatenate(([0], counted.numpy().cumsum()))
    starts = no_text[tokens.long()].nonzero().flatten().tolist()
    if not no_text[tokens[0]]:  # text before the first BOS is a document too
        starts.insert(0, -1)
    bounds = list(zip(starts, starts[1:] + [len(ids)]))
    for doc in range(share[0], len(bounds), share[1]):
        a, b = bounds[doc]
        text = decode(ids[a + 1:b].tolist())
        if caseops:
            text = case_restore(text)
        expected = len(text.replace(SPACE, " ").encode("utf-8"))
        found = sums[b] - sums[a + 1]
        if found != expected:
            return [f"{what}: document {doc} (tokens {a + 1}..{b}, {text[:40]!r}...) decodes to {expected} bytes "
                    f"but the byte tables count {found}; this tokenizer writes text in a way val_bpb cannot count "
                    "exactly: please report it with the tokenizer"]
    return []


# ---- --help ----
# A field of Hyperparameters: its name, its default, its comment (methods are indented deeper).
FIELD = re.compile(r"^    (\w+): \w+ = (.+?)(?:  # (.*))?$", re.M)


def rows(trainer=TRAINER):
    """(NAME, default as written, meaning) per setting, in the order of Hyperparameters' lines."""
    source = trainer.read_text(encoding="utf-8")
    # the model's settings (GPTConfig), then the run's (Hyperparameters), up to the first method
    fields = source.split("\nclass GPTConfig:", 1)[1].split("@classmethod", 1)[0]
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


def layout_problems(hp, layout) -> list[str]:
    """What the hardware chosen rules out: flash attention (CUDA, bf16) takes head dims up to 256."""
    head_dim = hp.model_dim // hp.num_heads
    if layout.cuda and layout.use_bf16 and head_dim > 256:
        return [f"MODEL_DIM/NUM_HEADS = {head_dim}: over flash's 256; raise NUM_HEADS"]
    return []


def unwritten_artifact(path, needed, error) -> str:
    """Why the artifact could not be written to path, its bytes needed and free, and where to turn."""
    free = shutil.disk_usage(path.parent).free
    return (f"ARTIFACT_DIR={path.parent}: {error.strerror}: the artifact needs {needed} bytes and {free} are free; "
            "free space there or set ARTIFACT_DIR elsewhere")


def progress(items, what, every_s=10.0):
    """items, with a line on the console (stderr) at most every every_s seconds while they last: what, how many
    are done, and since when. Rank 0's only: the others would say the same."""
    if os.environ.get("RANK", "0") != "0":
        yield from items
        return
    items = list(items)
    start = shown = time.monotonic()
    for done, item in enumerate(items):
        if time.monotonic() - shown >= every_s:
            shown = time.monotonic()
            print(f"  {what}: {done}/{len(items)} done in {shown - start:.0f} s", file=sys.stderr, flush=True)
        yield item


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
