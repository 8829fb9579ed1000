"""Settings: each environment variable parsed as its type, validated before any work, and
every name that is not ours refused (typos, our old names, retired ones, the field's settings
we lack); --help lists them."""

import re
import shlex
import shutil
import subprocess
import sys

import pytest
import torch

import settings
import train_gpt as tg
from conftest import CPU_PINNED, ROOT, VAL_BATCH, all_on_hp

sys.path.insert(0, str(ROOT / "tools"))
import settings_table  # noqa: E402


def refused_names(error: pytest.ExceptionInfo) -> set[str]:
    """The names a refusal lists, one a line: `  NAME=value: why`."""
    return set(re.findall(r"^  (\w+)=", str(error.value), flags=re.M))


# ---- parsing and validation ----


@pytest.mark.parametrize("overrides, message", [
    (dict(NUM_LAYERS="nine"), r"NUM_LAYERS='nine' is not an integer"),
    (dict(MATRIX_LR="fast"), r"MATRIX_LR='fast' is not a number"),
    (dict(TIE_EMBEDDINGS="0"), r"TIE_EMBEDDINGS=0: retired"),
    (dict(QAT_START_FRAC="0.8"), r"QAT_START_FRAC=0.8: retired"),
    (dict(EVAL_SEQ_LEN="2048"), r"EVAL_SEQ_LEN=2048: a setting of the stack's eval-seq-len technique, not of the "
                                r"core: python tools/build_trainer.py --stack frontier --out build/train_gpt.py"),
    (dict(LN_SCALE="yes"), r"LN_SCALE='yes' is not 0 or 1"),
    (dict(MODEL_DIM="100", NUM_HEADS="8"), r"MODEL_DIM=100: use a multiple of NUM_HEADS=8"),
    (dict(NUM_HEADS="4", NUM_KV_HEADS="3"), r"NUM_HEADS=4: use a multiple of NUM_KV_HEADS=3"),
    (dict(MODEL_DIM="60", NUM_HEADS="4", NUM_KV_HEADS="2"),
     r"MODEL_DIM/NUM_HEADS = 15: RoPE needs an even head dim"),
    (dict(TRAIN_BATCH_TOKENS="1000"), r"TRAIN_BATCH_TOKENS=1000: use a multiple of 512"),
    (dict(WORLD_SIZE="3"), r"3 .*launch 1, 2, 4 or 8"),
    (dict(VOCAB_SIZE="1024"), r"VOCAB_SIZE=1024\b.* has 512 ids"),
    (dict(DATA_PATH="/nonexistent/sp1024"),
     r"DATA_PATH=/nonexistent/sp1024 is not a directory.*build_sotu"),
    (dict(TOKENIZER_PATH="/nonexistent/tok.model"),
     r"TOKENIZER_PATH=/nonexistent/tok.model is not a file"),
    (dict(VAL_BATCH_SIZE="64"), r"VAL_BATCH_SIZE=64: .*use at least 512"),
    (dict(COMPILE="maybe"), r"COMPILE='maybe' must be one of \('auto', '0', '1'\)"),
    (dict(NUM_LAYERS="1"), r"NUM_LAYERS=1: the U-Net pairs"),
    (dict(MATRIX_BITS="3"), r"MATRIX_BITS=3 must be one of \(4, 5, 6, 7, 8\)"),
    (dict(COMPRESSOR="gzip"), r"COMPRESSOR='gzip' must be one of \('zlib', 'brotli', 'zpaq'\)"),
    (dict(COMPRESSOR="lzma"), r"COMPRESSOR='lzma' must be one of \('zlib', 'brotli', 'zpaq'\)"),
    (dict(EVAL_STRIDE="128"), r"EVAL_STRIDE=128: at most the scoring window, TRAIN_SEQ_LEN=64"),
    (dict(EMA_DECAY="1.0"), r"EMA_DECAY=1.0: below 1"),
    (dict(TTT_ENABLED="1", TTT_CHUNK_SIZE="128"),
     r"TTT_CHUNK_SIZE=128: at most the scoring window, TRAIN_SEQ_LEN=64"),
])
def test_bad_settings_are_named(tiny_data, overrides, message):
    with pytest.raises(tg.ConfigError, match=message):
        tg.setup(tiny_data.env(**overrides))


def test_new_settings_are_validated():
    cases = [
        (dict(rope_dims=3), "ROPE_DIMS"),
        (dict(num_loops=1, loop_start=2, loop_end=1), "LOOP_START"),
        (dict(num_loops=1, loop_end=2, parallel_start_layer=2), "PARALLEL_START_LAYER"),
        (dict(bigram_vocab_size=1), "BIGRAM_VOCAB_SIZE"),
        (dict(warmdown_frac=1.5), "WARMDOWN_FRAC"),
        (dict(muon_wd=-0.1), "MUON_WD"),
        (dict(xsa_last_n=6), "XSA_LAST_N"),
    ]
    for bad, word in cases:
        values = {"num_loops": 0, "parallel_start_layer": 0, **bad}
        with pytest.raises(tg.ConfigError, match=word):
            all_on_hp(val_batch_size=VAL_BATCH, **values).validate()
    all_on_hp(val_batch_size=VAL_BATCH).validate()


@pytest.mark.parametrize("settings, message", [
    (dict(GPTQ_RESERVE_SECONDS="20"), r"GPTQ_RESERVE_SECONDS=20.0: only for GPTQ=1 under a cap"),
    (dict(GPTQ="1", MAX_WALLCLOCK_SECONDS="600"),
     r"GPTQ=1 under MAX_WALLCLOCK_SECONDS: set GPTQ_RESERVE_SECONDS"),
    (dict(GPTQ="1", GPTQ_CALIB_SEQS="0"), r"GPTQ_CALIB_SEQS=0 must be positive"),
])
def test_calibration_settings_that_would_break_the_rules_or_the_math_are_refused(settings, message):
    with pytest.raises(tg.ConfigError, match=message):
        tg.Hyperparameters.from_env({"MAX_WALLCLOCK_SECONDS": "0", **settings})


def test_the_suite_pins_the_cpu_where_a_gpu_is_visible(tiny_data, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert tg.pick_device(0).type == "cuda", "auto would take the GPU"
    layout = tg.setup(tiny_data.env()).layout
    modes = (layout.device.type, layout.use_compile, layout.use_bf16)
    assert modes == ("cpu", False, False)
    pinned = {k: tiny_data.env()[k] for k in CPU_PINNED}
    assert pinned == CPU_PINNED


# ---- names that are not ours ----


def test_misspelled_settings_are_refused():
    """A typo would otherwise be silently ignored: it is refused, naming the setting meant;
    other env vars pass."""
    environ = {"NUM_LAYER": "11", "PATH": "/bin", "MATRIX_LR": "0.1", "HOME": "/root"}
    with pytest.raises(tg.ConfigError) as e:
        tg.Hyperparameters.from_env(environ)
    assert "NUM_LAYER=11: not a setting; did you mean NUM_LAYERS?" in str(e.value)
    assert "PATH" not in str(e.value)
    assert "MATRIX_LR" not in str(e.value)
    fine = {"PATH": "/bin", "MATRIX_LR": "0.1", "OMP_NUM_THREADS": "1"}
    assert tg.Hyperparameters.from_env(fine).matrix_lr == 0.1


def test_old_and_retired_names_are_refused_with_what_to_use():
    """Every name in INSTEAD is refused before any work, with ours for it (a real setting) or
    "retired"; none of them is still a setting, which would shadow the refusal. (At 0: the
    baseline's TIE_EMBEDDINGS=1 is what this file does, and passes.) One the core retired that a technique of the
    stack carries (EVAL_SEQ_LEN) points to the build that has it."""
    assert not set(settings.INSTEAD) & set(settings.setting_names(tg.Hyperparameters))
    stack = settings.stack_settings()
    for name, ours in settings.INSTEAD.items():
        with pytest.raises(tg.ConfigError) as e:
            tg.Hyperparameters.from_env({name: "0"})
        assert refused_names(e) == {name}
        line = re.search(rf"^  {name}=0: (.*)$", str(e.value), flags=re.M).group(1)
        if name in stack:
            assert ours is None and line.startswith(f"a setting of the stack's {stack[name]} technique"), line
        elif ours is None:
            assert line.startswith("retired"), line
        else:
            assert line == f"use {ours}"
            assert ours.split()[0] in settings.setting_names(tg.Hyperparameters), f"{name}: INSTEAD names {ours}, not a setting"


# The best entry's (1.0611) logged command, its environment as its README gives it
# (the launcher left out).
TOP_COMMAND = (
    "DATA_DIR=./data VOCAB_SIZE=8192 "
    "DATA_PATH=./data/datasets/fineweb10B_sp8192_lossless_caps_caseops_v1_reserved "
    "TOKENIZER_PATH=./data/tokenizers/fineweb_8192_bpe_lossless_caps_caseops_v1_reserved.model "
    "CASEOPS_ENABLED=1 ITERATIONS=20000 MAX_WALLCLOCK_SECONDS=600 PHASED_TTT_ENABLED=1 "
    "PHASED_TTT_PREFIX_DOCS=2500 PHASED_TTT_NUM_PHASES=3 EMBED_BITS=7 MATRIX_LR=0.026 MIN_LR=0.1 "
    "MLP_CLIP_SIGMAS=11.5 ATTN_CLIP_SIGMAS=13.0 EMBED_CLIP_SIGMAS=14.0 GRAD_CLIP_NORM=0.3 "
    "TTT_CHUNK_SIZE=48 WARMUP_STEPS=20 MUON_BACKEND_STEPS=5 GLOBAL_TTT_MOMENTUM=0.9 "
    "WARMDOWN_FRAC=0.85 BETA2=0.99 TTT_BETA2=0.99 TTT_WEIGHT_DECAY=0.5 TTT_LORA_RANK=80 "
    "SPARSE_ATTN_GATE_SCALE=0.5 GPTQ_RESERVE_SECONDS=0.5 GPTQ_CALIBRATION_BATCHES=16 "
    "VAL_LOSS_EVERY=0 GATED_ATTN_QUANT_GATE=1 SPARSE_ATTN_GATE_ENABLED=1 GATE_WINDOW=12 "
    "SMEAR_GATE_ENABLED=1 LQER_ENABLED=1 LQER_ASYM_ENABLED=1 LQER_RANK=4 LQER_FACTOR_BITS=4 "
    "LQER_ASYM_GROUP=64 LQER_TOP_K=3 FUSED_CE_ENABLED=1 COMPRESSOR=pergroup NCCL_NET=Socket "
    "SEED=42")
TOP_ENV = dict(pair.split("=", 1) for pair in shlex.split(TOP_COMMAND))
# What it sets that we lack: every other name in it is one of our settings, or not a setting at all
# (NCCL_NET). DATA_DIR only derives the two paths the command also sets.
TOP_LACKS = {
    "DATA_DIR",
    "CASEOPS_ENABLED",
    "PHASED_TTT_ENABLED",
    "PHASED_TTT_PREFIX_DOCS",
    "PHASED_TTT_NUM_PHASES",
    "GLOBAL_TTT_MOMENTUM",
    "SPARSE_ATTN_GATE_SCALE",
    "GPTQ_CALIBRATION_BATCHES",
    "GATED_ATTN_QUANT_GATE",
    "GATE_WINDOW",
    "LQER_ASYM_ENABLED",
    "LQER_FACTOR_BITS",
    "LQER_ASYM_GROUP",
    "FUSED_CE_ENABLED",
}


def test_the_best_entrys_command_is_refused_for_what_we_lack_and_only_that():
    with pytest.raises(tg.ConfigError) as refusal:
        tg.Hyperparameters.from_env(TOP_ENV)
    named = refused_names(refusal)
    assert named == TOP_LACKS, "every name we cannot honour is named at once, and nothing we can"
    message = str(refusal.value)
    assert "GPTQ_CALIBRATION_BATCHES=16: use GPTQ_CALIB_SEQS" in message
    field = "FUSED_CE_ENABLED=1: the field's, not here (docs/GPU.md, \"Commands from the field\")"
    assert field in message
    # the stack's settings point at the build that has them
    stack = ("PHASED_TTT_PREFIX_DOCS=2500: a setting of the stack's global-phases technique, not of the core: "
             "python tools/build_trainer.py --stack frontier --out build/train_gpt.py builds the trainer that has it")
    assert stack in message


def test_the_best_entrys_names_set_what_they_mean():
    """A field name that is a setting here is our name: no aliases, no special values."""
    env = {k: v for k, v in TOP_ENV.items() if k not in TOP_LACKS | {"COMPRESSOR"}}
    hp = tg.Hyperparameters.from_env(env | {"GPTQ": "1"})
    assert (hp.matrix_bits, hp.embed_bits, hp.min_lr) == (8, 7, 0.1)
    assert (hp.matrix_lr, hp.beta2) == (0.026, 0.99)
    sigmas = (hp.attn_clip_sigmas, hp.mlp_clip_sigmas, hp.embed_clip_sigmas)
    assert sigmas == (13.0, 11.5, 14.0)
    gates = (hp.smear_gate_enabled, hp.sparse_attn_gate_enabled)
    assert gates == (True, True)
    assert (hp.grad_clip_norm, hp.warmdown_frac) == (0.3, 0.85)
    ttt = (hp.ttt_chunk_size, hp.ttt_beta2, hp.ttt_weight_decay, hp.ttt_lora_rank)
    assert ttt == (48, 0.99, 0.5, 80), "the entry's per-document LoRA TTT"
    lqer = (hp.lqer_enabled, hp.lqer_rank, hp.lqer_top_k)
    assert lqer == (True, 4, 3), "the entry's LQER, as its names say"
    switched = tg.Hyperparameters.from_env({"LQER_ENABLED": "1"})
    assert switched.lqer_rank == 4, "the field's default rank"
    ranked = tg.Hyperparameters.from_env({"LQER_RANK": "2"})
    assert (ranked.lqer_enabled, ranked.lqer_rank) == (False, 2), "LQER_ENABLED alone turns it on"
    offs = ({}, {"LQER_ENABLED": "0"}, {"LQER_ENABLED": "0", "LQER_RANK": "4"})
    for off in offs:
        unset = tg.Hyperparameters.from_env(off)
        assert unset == tg.Hyperparameters(), f"{off}: off, as the field means it"
    with pytest.raises(tg.ConfigError, match=r"LQER_ENABLED='2' is not 0 or 1"):
        tg.Hyperparameters.from_env({"LQER_ENABLED": "2"})
    named = tg.Hyperparameters.from_env(dict(
        NUM_LOOPS="2",
        ENABLE_LOOPING_AT="0.35",
        PARALLEL_START_LAYER="8",
        LOOP_END="5",
        LOOP_START="3",
        NUM_LAYERS="11",
        TTT_ENABLED="1",
        MUON_ROW_NORMALIZE="1",
        ADAM_WD="0.02",
        MATRIX_CLIP_SIGMAS="12.85",
        SKIP_GATES_ENABLED="1",
        MATRIX_BITS="6",
    ))
    loops = (named.num_loops, named.enable_looping_at, named.parallel_start_layer)
    assert loops == (2, 0.35, 8)
    assert (named.ttt_enabled, named.muon_row_normalize, named.adam_wd) == (True, True, 0.02)
    assert (named.matrix_clip_sigmas, named.skip_gates_enabled) == (12.85, True)
    assert named.matrix_bits == 6
    with pytest.raises(tg.ConfigError, match=r"LOOP_REPEATS=3: use NUM_LOOPS"):
        tg.Hyperparameters.from_env(dict(NUM_LOOPS="2", LOOP_REPEATS="3"))


def test_a_copy_without_settings_py_runs_unchecked_and_its_log_says_so(tiny_data, tmp_path):
    """A record folder holds train_gpt.py alone: it runs, refusing nothing, and says so in one line."""
    shutil.copy(ROOT / "train_gpt.py", tmp_path / "train_gpt.py")
    env = tiny_data.env(ITERATIONS="2", RUN_ID="alone", NUM_LAYER="3", PYTHONPATH="")
    out = subprocess.run([sys.executable, "train_gpt.py"], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    log = (tmp_path / "logs" / "alone.txt").read_text()
    assert ("settings: not checked; versions, hardware, command, errors not logged: settings.py is not beside "
            "this train_gpt.py") in log
    assert "final_int8_zlib_roundtrip_exact" in log, "the typo NUM_LAYER went unrefused, as the line warns"
    with pytest.raises(tg.ConfigError, match="NUM_LAYER=3: not a setting"):
        tg.Hyperparameters.from_env({"NUM_LAYER": "3"})


def test_pack_code_needs_the_packer_beside_the_trainer(tmp_path):
    """PACK_CODE=1 packs the code with tools/packing.py at the export: settings.py refuses it at startup
    where that file is missing, rather than after the training."""
    assert not settings.problems(tg.Hyperparameters(pack_code=True))
    shutil.copy(ROOT / "settings.py", tmp_path / "settings.py")
    code = ("import sys; sys.path.append(sys.argv[1]); import settings, train_gpt; "
            "print(settings.__file__); print(*settings.problems(train_gpt.Hyperparameters(pack_code=True)))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    where, problem = out.stdout.splitlines()
    assert where == str(tmp_path / "settings.py")
    assert problem.startswith(f"PACK_CODE=1: {tmp_path / 'tools' / 'packing.py'} is missing; run the repository's ")


# ---- --help and docs/SETTINGS.md ----


def test_help_prints_every_setting_with_its_default_from_the_code():
    command = [sys.executable, str(ROOT / "train_gpt.py"), "--help"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert not (ROOT / "logs" / "--help.txt").exists()
    lines = {line.split()[0]: line for line in out.stdout.splitlines()}
    assert list(lines) == settings.setting_names(tg.Hyperparameters)
    defaults = tg.Hyperparameters()
    for name, line in lines.items():
        shown = line.split()[1].strip('"')
        value = getattr(defaults, name.lower())
        same = shown == str(value) or float(shown.replace("_", "")) == float(value)
        assert same, (name, shown, value)
        assert len(line.split()) > 2, f"{name} has no meaning in its comment"


def test_settings_page_lists_every_setting():
    """DOCS CHECK (a failure here is the page's, not the trainer's): docs/SETTINGS.md's table is the one
    tools/settings_table.py makes from Hyperparameters, row for row (its --write docs/SETTINGS.md mends it)."""
    page = (ROOT / "docs" / "SETTINGS.md").read_text()
    missing = [name for name in settings.setting_names(tg.Hyperparameters) if f"`{name}`" not in page]
    assert not missing, f"docs/SETTINGS.md's table lacks {missing}"
    stale = [row for row in settings_table.table().splitlines() if row not in page.splitlines()]
    assert not stale, f"docs/SETTINGS.md's table differs from the code in: {stale}"


@pytest.mark.parametrize("module", ["settings", "checkpoints", "tools.packing"])
def test_the_modules_the_trainer_imports_import_nothing_of_it(module):
    """No import circle: train_gpt.py imports settings.py, checkpoints.py and tools/packing.py, never the other
    way round (settings.py reads the source; the checkpoints' Keeper is handed what it uses)."""
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "print(sorted(m for m in sys.modules if 'train_gpt' in m))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert "train_gpt" not in (ROOT / f"{module.replace('.', '/')}.py").read_text().replace("train_gpt.py", "")
