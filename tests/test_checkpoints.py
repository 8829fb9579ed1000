"""Checkpoints, exact resume and graceful stop."""

import hashlib
import json
import re
import select
import signal
import subprocess
import sys
import time

import pytest
import torch

import train_gpt as tg
from conftest import ROOT, run_trainer

FINAL_RE = re.compile(r"final_int6_zlib_roundtrip_exact val_loss:(\S+) val_bpb:(\S+)")
TTT_RE = re.compile(r"final_int6_zlib_ttt_exact val_loss:(\S+) val_bpb:(\S+)")
# EMA and every model/optimizer technique on, so their state has to survive the resume too;
# the depth recurrence switches on at step 12, between the checkpoint at 10 and the end; TTT after the export
EVERY_TECHNIQUE = dict(NUM_LAYERS="3", MLP_LEAKY_SLOPE="0.5", ROPE_DIMS="8", LN_SCALE="1", XSA_LAST_N="2",
                       SMEAR_GATE="1", BIGRAM_BUCKETS="64", BIGRAM_DIM="16", LOOP_START="1", LOOP_END="1",
                       LOOP_REPEATS="1", LOOP_START_FRAC="0.6", PARALLEL_FROM="2", MUON_WD="0.05", EMBED_WD="0.05",
                       SCALAR_WD="0.01", MUON_ROW_NORM="1", MUON_POLAR="1", WARMDOWN_FRAC="0.5", MIN_LR_SCALE="0.1",
                       SKIP_GATES="1", ORTHO_INIT="1", ATTN_GATE="1", LQER_RANK="2", LQER_TOP_K="2")
LONG_RUN = dict(ITERATIONS="20", SAVE_EVERY="5", KEEP_CHECKPOINTS="3", EMA_DECAY="0.9",
                QUANT_BITS="6", VAL_LOSS_EVERY="10", TTT="1", TTT_CHUNK_TOKENS="2048", TTT_LR="0.01",
                **EVERY_TECHNIQUE)


def artifact_sha(cwd, run_id) -> str:
    return hashlib.sha256((cwd / "logs" / f"{run_id}_model.int6_zlib.ptz").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def straight_run(tiny_data, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("straight")
    out = run_trainer(tiny_data.env(RUN_ID="straight", **LONG_RUN), cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return cwd, out


def test_periodic_checkpoints_keep_the_newest(straight_run):
    cwd, out = straight_run
    folders = tg.checkpoint_folders(cwd / "checkpoints" / "straight")
    assert [f.name for f in folders] == ["step_000010", "step_000015", "step_000020"]
    meta = json.loads((folders[0] / "meta.json").read_text())
    assert meta["step"] == 10 and meta["loop_active"] is False and meta["training_time_ms"] > 0
    assert TTT_RE.search(out.stdout) and re.search(r"final_int6_zlib_ttt val_loss:\S+ val_bpb:\S+ eval_time:\d+ms",
                                                    out.stdout)


def test_resume_is_bitwise_identical_on_one_process(straight_run, tiny_data):
    cwd, out = straight_run
    assert "phase: from step:12 depth_recurrence:on" in out.stdout
    resumed = run_trainer(tiny_data.env(RUN_ID="resumed", RESUME="checkpoints/straight/step_000010", **LONG_RUN), cwd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume: from checkpoints/straight/step_000010 at step:10" in resumed.stdout
    assert FINAL_RE.search(resumed.stdout).group(0) == FINAL_RE.search(out.stdout).group(0)
    assert TTT_RE.search(resumed.stdout).group(0) == TTT_RE.search(out.stdout).group(0)
    assert artifact_sha(cwd, "resumed") == artifact_sha(cwd, "straight"), "the exported weights differ"


def test_a_resumed_run_counts_the_training_time_already_spent(straight_run, tiny_data):
    """The wallclock cap covers the whole run: a checkpoint that already used more than a resumed run's cap stops
    that run at once, at the checkpoint's step, without another training step."""
    cwd, _ = straight_run
    spent_ms = json.loads((cwd / "checkpoints" / "straight" / "step_000010" / "meta.json").read_text())["training_time_ms"]
    out = run_trainer(tiny_data.env(RUN_ID="capped", RESUME="checkpoints/straight/step_000010", **{
        **LONG_RUN, "ITERATIONS": "1000", "MAX_WALLCLOCK_SECONDS": f"{spent_ms / 2000:.3f}"}), cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^stopping_early: wallclock_cap train_time:\d+ms step:10/1000$", out.stdout, flags=re.M)
    assert not re.search(r"^step:11/", out.stdout, flags=re.M)


def test_resume_on_two_processes(straight_run, tiny_data, tmp_path):
    outs = [run_trainer(tiny_data.env(RUN_ID="pair", **LONG_RUN), tmp_path, nproc=2)]
    outs.append(run_trainer(tiny_data.env(RUN_ID="pair2", RESUME="checkpoints/pair/step_000010", **LONG_RUN),
                            tmp_path, nproc=2))
    assert all(o.returncode == 0 for o in outs), outs[-1].stderr[-3000:]
    straight, resumed = (float(FINAL_RE.search(o.stdout).group(1)) for o in outs)
    assert abs(straight - resumed) < 1e-6
    one_process = float(FINAL_RE.search(straight_run[1].stdout).group(1))
    assert abs(straight - one_process) < 1e-4, "1 and 2 processes, every technique on"
    ttt_pair, ttt_one = (float(TTT_RE.search(o.stdout).group(1)) for o in (outs[0], straight_run[1]))
    assert abs(ttt_pair - ttt_one) < 1e-4, "test-time training: 2 ranks average the gradient 1 process takes"
    assert ttt_one != float(FINAL_RE.search(straight_run[1].stdout).group(1)), "TTT changed nothing"
    assert artifact_sha(tmp_path, "pair2") == artifact_sha(tmp_path, "pair"), "same world size: bitwise too"


def tiny_training(tiny_data, tmp_path, **overrides):
    hp = tg.Hyperparameters(**{**dict(vocab_size=tiny_data.vocab_size, num_layers=2, model_dim=32, num_heads=4,
                                      num_kv_heads=2, train_seq_len=16, run_id="unit",
                                      checkpoint_dir=str(tmp_path / "ckpt"), data_path=str(tiny_data.data_path)),
                                 **overrides})
    layout = tg.Layout(0, 1, 0, False, torch.device("cpu"), 1, False, False)
    model = tg.GPT(hp)
    optimizers, muon = tg.build_optimizers(model, hp, layout)
    loader = tg.DistributedTokenLoader(str(tiny_data.data_path / "fineweb_train_*.bin"), 0, 1, layout.device)
    return hp, layout, model, optimizers, muon, loader


def test_a_write_killed_halfway_leaves_the_last_checkpoint(tiny_data, tmp_path, monkeypatch):
    hp, layout, model, (adam, muon), _, loader = tiny_training(tiny_data, tmp_path)
    tg.train_step(model, lambda: loader.next_batch(512, hp.train_seq_len, 1), [adam, muon], hp, layout, 1.0)
    first = tg.save_checkpoint(hp, layout, model, adam, muon, None, tg.LoopState(step=1), loader, "sha")
    tg.train_step(model, lambda: loader.next_batch(512, hp.train_seq_len, 1), [adam, muon], hp, layout, 1.0)
    real_save, calls = torch.save, []

    def dying_save(obj, path, *args, **kwargs):  # the checkpoint's state.pt never gets written
        calls.append(path)
        if len(calls) == 1:
            raise OSError("killed mid-write")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(OSError, match="killed mid-write"):
        tg.save_checkpoint(hp, layout, model, adam, muon, None, tg.LoopState(step=2), loader, "sha")
    monkeypatch.setattr(torch, "save", real_save)
    assert tg.checkpoint_folders(first.parent) == [first], "the half-written step_000002 must not count"
    assert (first.parent / "step_000002.tmp").exists()
    hp.resume = "latest"
    assert tg.resolve_resume(hp)["step"] == 1
    fresh = tiny_training(tiny_data, tmp_path)
    state = tg.load_checkpoint(first, layout, fresh[2], *fresh[3], None, fresh[5])
    assert state.step == 1


def test_checkpoint_of_another_model_is_refused(tiny_data, tmp_path):
    hp, layout, model, (adam, muon), _, loader = tiny_training(tiny_data, tmp_path)
    folder = tg.save_checkpoint(hp, layout, model, adam, muon, None, tg.LoopState(step=3), loader, "sha")
    other = tg.Hyperparameters(vocab_size=tiny_data.vocab_size, num_layers=2, model_dim=64, num_heads=4,
                               num_kv_heads=2, resume=str(folder), data_path=str(tiny_data.data_path))
    with pytest.raises(tg.ConfigError, match="the checkpoint has MODEL_DIM=32 but this run has MODEL_DIM=64"):
        tg.resolve_resume(other)
    missing = tg.Hyperparameters(resume=str(tmp_path / "nowhere"))
    with pytest.raises(tg.ConfigError, match="meta.json does not exist"):
        tg.resolve_resume(missing)


def test_resuming_an_older_checkpoint_of_the_same_run_is_refused(tiny_data, tmp_path):
    hp, layout, model, (adam, muon), _, loader = tiny_training(tiny_data, tmp_path)
    older = tg.save_checkpoint(hp, layout, model, adam, muon, None, tg.LoopState(step=1), loader, "sha")
    tg.save_checkpoint(hp, layout, model, adam, muon, None, tg.LoopState(step=2), loader, "sha")
    hp.resume = str(older)
    with pytest.raises(tg.ConfigError, match="RUN_ID=unit already has later checkpoints \\(step_000002\\)"):
        tg.resolve_resume(hp)
    hp.run_id, hp.resume = "branch", str(older)  # the same checkpoint under a new RUN_ID is fine
    assert tg.resolve_resume(hp)["step"] == 1


def test_sigterm_checkpoints_then_resume_latest_continues_the_log(tiny_data, tmp_path):
    env = tiny_data.env(RUN_ID="long", ITERATIONS="100000", TRAIN_LOG_EVERY="1")
    with open(tmp_path / "stderr.txt", "w") as stderr:  # a file: a pipe nobody drains could fill and stall the run
        proc = subprocess.Popen([sys.executable, str(ROOT / "train_gpt.py")], env=env, cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=stderr, text=True)
    deadline, seen = time.time() + 120, ""
    while "step:3/" not in seen and time.time() < deadline:  # wait, with a deadline, until training is under way
        if select.select([proc.stdout], [], [], max(0.0, deadline - time.time()))[0]:
            seen += proc.stdout.readline()
    assert "step:3/" in seen, "the run never reached step 3"
    proc.send_signal(signal.SIGTERM)
    stdout = seen + proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGTERM, (tmp_path / "stderr.txt").read_text()[-3000:]
    match = re.search(r"stopped by SIGTERM after step:(\d+); resume with: (.*)", stdout)
    assert match and "RESUME=checkpoints/long/step_" in match.group(2) and "RUN_ID=long" in match.group(2)
    stopped_at = int(match.group(1))
    assert tg.checkpoint_folders(tmp_path / "checkpoints" / "long")[-1].name == f"step_{stopped_at:06d}"
    # resume the newest checkpoint of the run, this time with an end in sight; its log continues
    out = run_trainer(tiny_data.env(RUN_ID="long", RESUME="latest", ITERATIONS=str(stopped_at + 3)), tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    log = (tmp_path / "logs" / "long.txt").read_text()
    assert len(re.findall(r"^==== train_gpt.py source bytes:", log, flags=re.M)) == 1, "one header, then appended"
    assert f"resume: from checkpoints/long/step_{stopped_at:06d} at step:{stopped_at}" in log
    assert f"step:{stopped_at + 3}/{stopped_at + 3} val_loss" in log


def test_byte_codec_round_trips(tmp_path):
    (tmp_path / "byte260.json").write_text(json.dumps({"tokenizer_type": "pure_byte", "vocab_size": 260, "config": {"byte_offset": 4}}))
    tok = tg.load_tokenizer(tmp_path / "byte260.json", 260)
    encode, decode = tok.encode, tok.decode
    text = "Fellow citizens — ünïcödé 🚀"
    assert decode(encode(text)) == text and min(encode(text)) >= 4


