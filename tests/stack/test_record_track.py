"""docs/GPU.md's record-track command, run as it says: by the built frontier trainer."""

import re
import shlex

import pytest

from conftest import ROOT
from data.shards import read_datafile, write_datafile
from stack.conftest import build_trainer, built_env, launch


def record_track_settings() -> dict:
    """The record-track command's settings, as docs/GPU.md writes them (its STACK)."""
    text = (ROOT / "docs" / "GPU.md").read_text()
    stack = re.search(r'^STACK="(.*?)"$', text, flags=re.M | re.S).group(1)
    return dict(item.split("=", 1) for item in stack.split())


def test_the_documented_record_track_command_starts_on_the_fields_caseops_layout(frontier_script, tiny_data,
                                                                                 tmp_path):
    """docs/GPU.md's record-track command, run by the built frontier (the stack's global phases and attention
    within documents on), at tiny shapes, on a stand-in of the field's CaseOps data: a CaseOps
    tokenizer, and a byte sidecar that counts the text before the tokenizer's normalization (here a space that
    the normalization collapsed counts in full, in one of every five tokens). The default check refuses that
    sidecar, naming the document; the command's SIDECAR_BYTES=trust scores by it, and every lever runs."""
    from data import build_sotu
    build_sotu.main(["--documents", "12", "--variant", "sp1024_caseops", "--data-dir", str(tmp_path / "data"),
                     "--shard-tokens", "100000"])
    data = tmp_path / "data" / "datasets" / "sotu_sp1024_caseops"
    sidecar = data / "fineweb_val_bytes_000000.bin"
    counts = read_datafile(sidecar).astype("int64")
    text_tokens = (counts > 0).nonzero()[0]
    counts[text_tokens[::5]] += 1  # whitespace that normalization collapsed, counted in full
    write_datafile(sidecar, counts)
    settings = record_track_settings()
    assert settings["SIDECAR_BYTES"] == "trust"
    tiny = dict(DATA_PATH=data, TOKENIZER_PATH=tmp_path / "data" / "tokenizers" / "sotu_1024_bpe_caseops.model",
                VOCAB_SIZE=1024, MODEL_DIM=64, NUM_HEADS=4, NUM_KV_HEADS=2, TRAIN_SEQ_LEN=64, TRAIN_BATCH_TOKENS=2048,
                VAL_BATCH_SIZE=16384, ITERATIONS=4, WARMUP_STEPS=1, GPTQ_CALIB_SEQS=4, TTT_LORA_RANK=4,
                TTT_BATCH_SIZE=8, MAX_WALLCLOCK_SECONDS=600, RUN_ID="stack", GLOBAL_TTT_CHUNK_TOKENS=1024)
    env = built_env(tiny_data, frontier_script, **{**settings, **tiny})
    refused = launch(frontier_script, {**env, "SIDECAR_BYTES": "check"}, tmp_path)
    _, stderr = refused.communicate(timeout=300)
    assert refused.returncode == 1 and "SIDECAR_BYTES=trust scores by it unchecked" in stderr
    assert re.search(r"document \d+ .* decodes to \d+ bytes but the byte tables count \d+", stderr)
    out = launch(frontier_script, env, tmp_path)
    stdout, stderr = out.communicate(timeout=600)
    assert out.returncode == 0, stderr[-3000:]
    val_tokens = int(re.search(r"^val_tokens:(\d+) val_bytes:(\d+)", stdout, re.M).group(1))
    val_bytes = int(re.search(r"^val_tokens:(\d+) val_bytes:(\d+)", stdout, re.M).group(2))
    assert val_bytes == counts[1:val_tokens + 1].sum(), "scored by the sidecar's bytes"
    assert re.search(r"^final_int6_zpaq_ttt_exact val_loss:\S+ val_bpb:\S+$", stdout, re.M)
    assert "(packed from" in stdout and "gptq: matrices:" in stdout
    frontier = ",".join(build_trainer.load_manifest(build_trainer.Tree(ROOT)).stacks["frontier"])
    assert re.search(rf"^build: stack:frontier techniques:{frontier} core:", stdout, re.M)


# The audited rows after the entry, #2014 (1.05759) and #2135 (1.05651): their README commands' variables, verbatim
# (the launcher left out; SEED as their first seed).
DATA = ("DATA_DIR=./data DATA_PATH=./data/datasets/fineweb10B_sp8192_lossless_caps_caseops_v1_reserved "
        "TOKENIZER_PATH=./data/tokenizers/fineweb_8192_bpe_lossless_caps_caseops_v1_reserved.model CASEOPS_ENABLED=1 "
        "VOCAB_SIZE=8192 ")
ROW_2014 = (
    "NCCL_NET=Socket " + DATA + "ITERATIONS=20000 MAX_WALLCLOCK_SECONDS=600 EVAL_INCLUDE_TAIL=1 TRAIN_SEQ_LEN=3072 "
    "ROPE_TRAIN_SEQ_LEN=3072 TRAIN_SEQ_SCHEDULE=1024@0.100,2048@0.700,3072@1.000 TRAIN_SEQ_SCHEDULE_MODE=wallclock "
    "SEQ_CHANGE_WARMUP_STEPS=32 EVAL_SEQ_LEN=3072 EVAL_STRIDE=1536 TTT_ENABLED=1 TTT_EVAL_SEQ_LEN=3072 "
    "TTT_BATCH_SIZE=24 TTT_CHUNK_SIZE=48 TTT_SHORT_SCORE_FIRST_ENABLED=1 TTT_SHORT_DOC_LEN=2000 "
    "TTT_SHORT_CHUNK_SIZE=24 TTT_SHORT_SCORE_FIRST_STEPS=256:8,2000:24 TTT_LORA_RANK=80 TTT_LORA_LR=0.0001 "
    "TTT_LOCAL_LR_MULT=0.75 TTT_MASK=no_qv TTT_Q_LORA=0 TTT_V_LORA=0 TTT_WEIGHT_DECAY=0.5 TTT_BETA2=0.99 "
    "PHASED_TTT_PREFIX_DOCS=2500 PHASED_TTT_NUM_PHASES=1 WARMDOWN_FRAC=0.85 BETA2=0.99 QK_GAIN_INIT=5.25 "
    "SPARSE_ATTN_GATE_ENABLED=1 SPARSE_ATTN_GATE_SCALE=0.5 GATED_ATTN_QUANT_GATE=1 SMEAR_GATE_ENABLED=1 "
    "GATE_WINDOW=12 FUSED_CE_ENABLED=1 MATRIX_LR=0.026 MIN_LR=0.1 GRAD_CLIP_NORM=0.3 EMBED_BITS=7 "
    "EMBED_CLIP_SIGMAS=14.0 MATRIX_CLIP_SIGMAS=12.85 ATTN_CLIP_SIGMAS=13.0 MLP_CLIP_SIGMAS=11.5 LQER_ENABLED=1 "
    "LQER_RANK=4 LQER_TOP_K=3 LQER_FACTOR_BITS=4 LQER_ASYM_ENABLED=1 LQER_ASYM_GROUP=64 AWQ_LITE_ENABLED=1 "
    "AWQ_LITE_BITS=8 AWQ_LITE_GROUP_TOP_K=1 AWQ_LITE_GROUP_SIZE=64 ASYM_LOGIT_RESCALE=1 GPTQ_RESERVE_SECONDS=4.0 "
    "GPTQ_CALIBRATION_BATCHES=16 COMPRESSOR=pergroup VAL_LOSS_EVERY=0 SEED=42")
ROW_2135 = (
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True NCCL_NET=Socket " + DATA + "ASYM_LOGIT_RESCALE=1 "
    "NGRAM_TILT_ENABLED=1 NGRAM_HINT_PRECOMPUTE_OUTSIDE=0 TOKEN_ORDER=16 TOKEN_THRESHOLD=0.800 TOKEN_BOOST=2.625 "
    "WITHIN_TAU=99.0 WITHIN_BOOST=0.0 WORD_TAU=99.0 WORD_BOOST=0.0 AGREE_ADD_BOOST=0.0 SMEAR_GATE_BOS_FIX=0 "
    "TTT_LORA_EMA_DECAY=0.0 TTT_UPDATE_EVERY=1 PHASED_TTT_PREFIX_DOCS=2500 PHASED_TTT_NUM_PHASES=1 "
    "EVAL_SEQ_LEN=2560 TTT_EVAL_SEQ_LEN=2560 COMPRESSOR=pergroup MATRIX_CLIP_SIGMAS=12.85 ATTN_CLIP_SIGMAS=13.0 "
    "MLP_CLIP_SIGMAS=11.5 EMBED_BITS=7 EMBED_CLIP_SIGMAS=14.0 MATRIX_LR=0.028 MIN_LR=0.1 WARMDOWN_FRAC=0.85 "
    "BETA2=0.99 FUSED_CE_ENABLED=1 SPARSE_ATTN_GATE_ENABLED=1 SPARSE_ATTN_GATE_SCALE=0.5 SMEAR_GATE_ENABLED=1 "
    "GATE_WINDOW=12 LQER_ENABLED=1 LQER_RANK=4 LQER_TOP_K=3 LQER_FACTOR_BITS=4 LQER_ASYM_ENABLED=1 "
    "LQER_ASYM_GROUP=32 TTT_WARM_START_A=1 TTT_LORA_RANK=80 TTT_BETA2=0.99 TTT_WEIGHT_DECAY=2.0 TTT_LORA_LR=8e-5 "
    "GPTQ_RESERVE_SECONDS=0.5 GPTQ_CALIBRATION_BATCHES=32 TTT_K_LORA=0 TTT_O_LORA=1 TTT_MLP_LORA=1 "
    "EMA_DECAY=0.9965 SEED=314")
# What each names that the built frontier cannot honour (docs/GPU.md, "The audited rows after it"): every other
# name is one of its settings, or no setting at all (NCCL_NET, PYTORCH_CUDA_ALLOC_CONF)
LACKS = {"DATA_DIR", "CASEOPS_ENABLED", "SPARSE_ATTN_GATE_SCALE", "GATE_WINDOW", "FUSED_CE_ENABLED",
         "ASYM_LOGIT_RESCALE", "GPTQ_CALIBRATION_BATCHES"}
ROW_2014_LACKS = LACKS | {"ROPE_TRAIN_SEQ_LEN", "GATED_ATTN_QUANT_GATE"}
ROW_2135_LACKS = LACKS | {"SMEAR_GATE_BOS_FIX", "TTT_LORA_EMA_DECAY", "TTT_UPDATE_EVERY", "TTT_WARM_START_A"}


@pytest.mark.parametrize("command, lacks", [(ROW_2014, ROW_2014_LACKS), (ROW_2135, ROW_2135_LACKS)],
                         ids=["2014", "2135"])
def test_an_audited_rows_command_is_refused_for_what_differs_and_only_that(fr, command, lacks):
    """The built frontier takes #2014's and #2135's commands as their authors wrote them, but for the names it
    cannot honour: all named at once, each with what to do; without them, and with our compressor for their
    `pergroup` (a value, refused after the names), the rest is this trainer's settings on top of the record-track
    command's (the field's defaults are its whole stack), at 8 ranks."""
    env = dict(pair.split("=", 1) for pair in shlex.split(command))
    with pytest.raises(fr.ConfigError) as refusal:
        fr.Hyperparameters.from_env(env)
    assert set(re.findall(r"^  (\w+)=", str(refusal.value), flags=re.M)) == lacks
    rest = {name: value for name, value in env.items() if name not in lacks}
    with pytest.raises(fr.ConfigError, match="COMPRESSOR='pergroup' must be one of"):
        fr.Hyperparameters.from_env(rest)
    # our defaults are the baseline's, the field's its whole stack: on top of the record-track settings
    fr.Hyperparameters.from_env(record_track_settings() | rest | {"COMPRESSOR": "zpaq"}, 8)
