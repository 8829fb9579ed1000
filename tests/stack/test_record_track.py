"""docs/GPU.md's record-track command, run as it says: by the built frontier trainer."""

import re

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
