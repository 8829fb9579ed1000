"""Properties of train_gpt.py: each test would catch a real bug in the trainer."""

import io
import json
import math
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import train_gpt as tg
from conftest import ROOT, run_trainer
from data.shards import write_datafile


def small_hp(**overrides) -> tg.Hyperparameters:
    values = dict(vocab_size=64, num_layers=3, model_dim=32, num_heads=4, num_kv_heads=2, train_seq_len=16)
    values.update(overrides)
    return tg.Hyperparameters(**values)


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Zero-initialized projections make a fresh model context-blind; shake every weight."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


# ---- file and import ----


def test_line_cap():
    lines = (ROOT / "train_gpt.py").read_text().count("\n")
    assert lines < 1500, f"train_gpt.py has {lines} lines; the hard cap is 1500"


def test_import_has_no_side_effects(tmp_path):
    code = ("import os, torch.distributed as d, train_gpt; "
            "assert not d.is_initialized(); print(sorted(os.listdir('.')))")
    env = {"PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "2", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", "importing train_gpt wrote files or printed"


# ---- model ----


def test_model_shapes_and_causality():
    torch.manual_seed(0)
    hp = small_hp()
    model = tg.GPT(hp)
    randomize(model)
    idx = torch.randint(0, hp.vocab_size, (2, hp.train_seq_len))
    logits = model.logits(idx)
    assert logits.shape == (2, hp.train_seq_len, hp.vocab_size) and logits.dtype == torch.float32
    assert logits.abs().max() <= hp.logit_softcap
    loss = model(idx, idx)
    assert loss.ndim == 0 and torch.isfinite(loss)
    t = 9
    changed = idx.clone()
    changed[:, t] = (changed[:, t] + 1) % hp.vocab_size
    logits2 = model.logits(changed)
    torch.testing.assert_close(logits2[:, :t], logits[:, :t], rtol=0, atol=1e-6)
    assert (logits2[:, t + 1:] - logits[:, t + 1:]).abs().max() > 1e-4, "later positions must see the change"


def test_gqa_equals_full_heads_with_repeated_kv():
    torch.manual_seed(0)
    dim, heads, kv_heads = 32, 4, 2
    gqa = tg.CausalSelfAttention(tg.Hyperparameters(model_dim=dim, num_heads=heads, num_kv_heads=kv_heads), layer=0)
    randomize(gqa)
    full = tg.CausalSelfAttention(tg.Hyperparameters(model_dim=dim, num_heads=heads, num_kv_heads=heads), layer=0)
    head_dim, group = dim // heads, heads // kv_heads
    with torch.no_grad():
        full.c_q.weight.copy_(gqa.c_q.weight)
        full.proj.weight.copy_(gqa.proj.weight)
        full.q_gain.copy_(gqa.q_gain)
        for name in ("c_k", "c_v"):  # each KV head's rows, repeated for every query head of its group
            w = getattr(gqa, name).weight.view(kv_heads, head_dim, dim)
            getattr(full, name).weight.copy_(w.repeat_interleave(group, dim=0).reshape(dim, dim))
    x = torch.randn(2, 12, dim)
    torch.testing.assert_close(gqa(x), full(x), rtol=1e-5, atol=1e-5)


def test_params_split_between_muon_and_adam():
    hp = small_hp()
    model = tg.GPT(hp)
    layout = tg.Layout(0, 1, 0, False, torch.device("cpu"), 1, False, False)
    (adam, muon), _ = tg.build_optimizers(model, hp, layout)
    muon_ids = {id(p) for g in muon.param_groups for p in g["params"]}
    adam_ids = {id(p) for g in adam.param_groups for p in g["params"]}
    assert muon_ids.isdisjoint(adam_ids)
    assert muon_ids | adam_ids == {id(p) for p in model.parameters()}, "every parameter has one optimizer"
    assert all(p.ndim == 2 for g in muon.param_groups for p in g["params"])
    assert id(model.tok_emb.weight) in adam_ids, "the tied embedding (and head) trains with Adam"
    assert id(model.blocks[0].resid_mix) in adam_ids, "2-D control tensors belong to Adam"


# ---- Muon ----


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (96, 96)])
def test_newton_schulz_singular_values_near_one(shape):
    torch.manual_seed(0)
    k = min(shape)
    U, _ = torch.linalg.qr(torch.randn(shape[0], k))
    V, _ = torch.linalg.qr(torch.randn(shape[1], k))
    G = U @ torch.diag(torch.logspace(0, -1.5, k)) @ V.T  # singular values from 1 down to ~0.03
    s = torch.linalg.svdvals(tg.zeropower_via_newtonschulz5(G).float())
    assert s.min() > 0.6 and s.max() < 1.25, (s.min().item(), s.max().item())


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-3)])
def test_muon_step_matches_reference(dtype, atol):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s)) for s in [(16, 8), (8, 16), (12, 12)]]
    reference = [p.detach().clone() for p in params]
    momentum_bufs = [torch.zeros_like(p) for p in params]
    lr, momentum = 0.05, 0.9
    opt = tg.Muon(params, lr=lr, momentum=momentum, backend_steps=5, update_dtype=dtype)
    for _ in range(3):
        grads = [torch.randn_like(p) for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads):  # plain Nesterov momentum -> orthogonalize -> shape-scaled step
            momentum_bufs[i] = momentum * momentum_bufs[i] + g
            update = tg.zeropower_via_newtonschulz5(g + momentum * momentum_bufs[i], dtype=dtype).float()
            update *= max(1.0, g.shape[0] / g.shape[1]) ** 0.5
            reference[i] -= lr * update
    for p, ref in zip(params, reference):
        torch.testing.assert_close(p.detach(), ref, rtol=0, atol=atol)
    assert p.dtype == torch.float32


# ---- data ----


def test_shard_round_trip(tmp_path):
    tokens = torch.randint(0, 65536, (5000,), dtype=torch.int64)
    write_datafile(tmp_path / "s.bin", tokens.tolist())
    assert torch.equal(torch.from_numpy(tg.shard_tokens(tmp_path / "s.bin").astype("int64")), tokens)


@pytest.mark.parametrize("damage, message", [
    ("magic", "magic number"), ("version", "version"), ("truncate", "truncated"), ("append", "trailing bytes"),
    ("header", "shorter than"),
])
def test_malformed_shard_errors(tmp_path, damage, message):
    path = tmp_path / "fineweb_train_000000.bin"
    write_datafile(path, list(range(100)))
    raw = bytearray(path.read_bytes())
    if damage == "magic":
        raw[0:4] = (12345).to_bytes(4, "little")
    elif damage == "version":
        raw[4:8] = (7).to_bytes(4, "little")
    elif damage == "truncate":
        raw = raw[:-3]
    elif damage == "append":
        raw += b"\0\0"
    else:
        raw = raw[:100]
    path.write_bytes(bytes(raw))
    with pytest.raises(tg.ConfigError, match=message) as err:
        tg.shard_tokens(path)
    assert str(path) in str(err.value)


def test_ranks_take_disjoint_contiguous_spans(tmp_path):
    # three small shards, so the spans cross shard boundaries and the stream wraps around
    stream = torch.arange(700) % 65536
    for i, part in enumerate(stream.split([250, 0, 200, 250])):  # an empty shard is skipped
        write_datafile(tmp_path / f"fineweb_train_{i:06d}.bin", part.tolist())
    pattern = str(tmp_path / "fineweb_train_*.bin")
    assert torch.equal(tg.DistributedTokenLoader(pattern).take(1500).long(), torch.cat([stream] * 3)[:1500])
    world_size = 2  # batches of 2 x 64 tokens: each rank reads its 64 and the one after them (its last target)
    loaders = [tg.DistributedTokenLoader(pattern, r, world_size, torch.device("cpu")) for r in range(world_size)]
    single = tg.DistributedTokenLoader(pattern)
    for _ in range(8):  # 8 * 2 * 65 tokens > 700: wraps around
        batches = [loader.next_batch(global_tokens=2 * 64, seq_len=16, grad_accum_steps=1) for loader in loaders]
        assert all(x.shape == y.shape == (4, 16) and torch.equal(x.flatten()[1:], y.flatten()[:-1]) for x, y in batches)
        spans = [torch.cat((x.flatten(), y.flatten()[-1:])) for x, y in batches]
        assert torch.equal(torch.cat(spans), single.take(world_size * 65).long())


# ---- schedule ----


def test_warmdown_by_steps():
    hp = small_hp(iterations=100, warmdown_iters=20, max_wallclock_seconds=0)
    assert tg.lr_schedule(0, 0.0, hp) == 1.0
    assert tg.lr_schedule(80, 0.0, hp) == 1.0
    assert tg.lr_schedule(90, 0.0, hp) == pytest.approx(0.5)
    assert tg.lr_schedule(100, 0.0, hp) == 0.0


def test_warmdown_by_wallclock():
    hp = small_hp(iterations=10_000, warmdown_iters=100, max_wallclock_seconds=10.0)
    # 10 ms/step: the warmdown spans the last 100 * 10 ms = 1 s of the 10 s budget
    assert tg.lr_schedule(10, 100.0, hp) == 1.0
    assert tg.lr_schedule(900, 9000.0, hp) == pytest.approx(1.0)
    assert tg.lr_schedule(950, 9500.0, hp) == pytest.approx(0.5)
    assert tg.lr_schedule(1000, 10_000.0, hp) == 0.0
    # a step cap reached before the budget still warms down by steps
    capped = small_hp(iterations=200, warmdown_iters=100, max_wallclock_seconds=600.0)
    assert tg.lr_schedule(150, 1500.0, capped) == pytest.approx(0.5)


def test_muon_momentum_warmup():
    hp = small_hp(muon_momentum=0.95, muon_momentum_warmup_start=0.85, muon_momentum_warmup_steps=100)
    assert tg.muon_momentum(0, hp) == pytest.approx(0.85)
    assert tg.muon_momentum(50, hp) == pytest.approx(0.90)
    assert tg.muon_momentum(500, hp) == pytest.approx(0.95)


# ---- val_bpb byte accounting ----


def stream_bytes(tokens: torch.Tensor, tok: tg.Tokenizer) -> int:
    return int(tg.token_bytes(tokens, tok).sum())


def test_sentencepiece_bytes_equal_decoded_text(tiny_data):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tiny_data.tokenizer_path))
    luts = tg.load_tokenizer(tiny_data.tokenizer_path, tiny_data.vocab_size)
    tokens = torch.from_numpy(tg.shard_tokens(tiny_data.data_path / "fineweb_val_000000.bin").astype("int64"))
    docs = [sp.encode(doc) for doc in tiny_data.val_docs]
    assert any(sp.is_byte(t) for t in docs[-1]), "the last document must exercise byte fallback"
    decoded_bytes = sum(len(sp.decode(ids).encode("utf-8")) for ids in docs)
    assert stream_bytes(tokens, luts) == decoded_bytes


def test_byte_tokenizer_bytes_equal_text(tmp_path):
    spec = {"tokenizer_type": "pure_byte", "vocab_size": 260,  # the challenge's fineweb_pure_byte_260.json
            "config": {"byte_offset": 4, "byte_count": 256, "pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}}
    (tmp_path / "byte260.json").write_text(json.dumps(spec))
    luts = tg.load_tokenizer(tmp_path / "byte260.json", 260)
    docs = ["Plain ASCII.", " leading space, ünïcödé, 東京 🚀", ""]
    tokens = torch.tensor([t for d in docs for t in [1] + [b + 4 for b in d.encode("utf-8")]])
    assert stream_bytes(tokens, luts) == sum(len(d.encode("utf-8")) for d in docs)


def test_vocab_mismatch_is_named(tiny_data):
    with pytest.raises(tg.ConfigError, match=rf"VOCAB_SIZE=1024 .* has {tiny_data.vocab_size} ids"):
        tg.load_tokenizer(tiny_data.tokenizer_path, 1024)


# ---- export ----


@pytest.mark.parametrize("bits, embed_bits, compressor", [(8, 8, "zlib"), (6, 8, "lzma"), (4, 5, "zlib"),
                                                          (7, 8, "brotli"), (5, 6, "brotli"), (6, 7, "zpaq")])
def test_export_round_trip_within_quantization_error(tmp_path, bits, embed_bits, compressor):
    torch.manual_seed(0)
    hp = small_hp(vocab_size=2048, model_dim=192, quant_bits=bits, embed_quant_bits=embed_bits, compressor=compressor)
    model = tg.GPT(hp)
    randomize(model)
    state = model.state_dict()
    blob = tg.save_artifact(state, tmp_path / "m.ptz", hp)
    assert (tmp_path / "m.ptz").stat().st_size == len(blob)
    restored = tg.load_artifact(tmp_path / "m.ptz")
    assert restored.keys() == state.keys()
    assert tg.save_artifact(state, None, hp) == blob, "the same bytes every time: every rank exports them"
    quantized = tg.quantize_state_dict(state, hp)
    widths = {name: int(q.abs().max()).bit_length() + 1 for name, q in quantized["ints"].items()}
    assert widths["tok_emb.weight"] == embed_bits, "the large embedding has its own width"
    assert widths["blocks.0.mlp.fc.weight"] == bits
    for name, w in state.items():
        assert restored[name].dtype == w.dtype and restored[name].shape == w.shape
        if name in quantized["ints"]:
            width = widths[name]
            scale = quantized["scales"][name].float()[:, None]
            inside = w.abs() <= (2 ** (width - 1) - 1) * scale  # beyond the clip, values saturate by design
            err = (restored[name] - w).abs()
            assert (err[inside] <= scale.expand_as(w)[inside] * 0.5 + 1e-6).all()
        elif any(key in name for key in tg.CONTROL_PARAM_NAMES):
            assert torch.equal(restored[name], w), f"control tensor {name} must stay fp32"
        else:
            torch.testing.assert_close(restored[name], w, rtol=1e-3, atol=1e-3)


class _Payload:
    def __reduce__(self):
        return (print, ("pickled code ran",))


def test_artifact_loader_refuses_pickled_code(tmp_path):
    buffer = io.BytesIO()
    torch.save({"format": "packed_rows_v1", "evil": _Payload()}, buffer)
    (tmp_path / "evil.ptz").write_bytes(zlib.compress(buffer.getvalue()))
    with pytest.raises(Exception, match="[Ww]eights only"):
        tg.load_artifact(tmp_path / "evil.ptz")


# ---- configuration errors ----


@pytest.mark.parametrize("overrides, message", [
    (dict(NUM_LAYERS="nine"), r"NUM_LAYERS='nine' is not an integer"),
    (dict(MATRIX_LR="fast"), r"MATRIX_LR='fast' is not a number"),
    (dict(TIE_EMBEDDINGS="0"), r"TIE_EMBEDDINGS=0: retired"), (dict(QAT_START_FRAC="0.8"), r"QAT_START_FRAC=0.8: retired"),
    (dict(LN_SCALE="yes"), r"LN_SCALE='yes' is not 0 or 1"),
    (dict(MODEL_DIM="100", NUM_HEADS="8"), r"MODEL_DIM=100: use a multiple of NUM_HEADS=8"),
    (dict(NUM_HEADS="4", NUM_KV_HEADS="3"), r"NUM_HEADS=4: use a multiple of NUM_KV_HEADS=3"),
    (dict(MODEL_DIM="60", NUM_HEADS="4", NUM_KV_HEADS="2"), r"MODEL_DIM/NUM_HEADS = 15 is odd"),
    (dict(TRAIN_BATCH_TOKENS="1000"), r"TRAIN_BATCH_TOKENS=1000 does not split into whole sequences"),
    (dict(WORLD_SIZE="3"), r"world size 3 does not divide 8"),
    (dict(VOCAB_SIZE="1024"), r"VOCAB_SIZE=1024 does not match"),
    (dict(DATA_PATH="/nonexistent/sp1024"), r"DATA_PATH=/nonexistent/sp1024 is not a directory.*build_sotu"),
    (dict(TOKENIZER_PATH="/nonexistent/tok.model"), r"TOKENIZER_PATH=/nonexistent/tok.model is not a file"),
    (dict(VAL_BATCH_SIZE="64"), r"VAL_BATCH_SIZE=64 gives each rank less than one sequence"),
    (dict(COMPILE="maybe"), r"COMPILE=.maybe. must be one of auto, 0, 1"),
    (dict(NUM_LAYERS="1"), r"NUM_LAYERS=1: the U-Net pairs"),
    (dict(QUANT_BITS="3"), r"QUANT_BITS=3 must be one of 4, 5, 6, 7, 8"),
    (dict(COMPRESSOR="gzip"), r"COMPRESSOR=.gzip. must be one of zlib, lzma, brotli"),
    (dict(EVAL_STRIDE="128"), r"EVAL_STRIDE=128: at most the eval window 64"),
    (dict(EMA_DECAY="1.0"), r"EMA_DECAY=1.0 must be in \[0, 1\)"),
])
def test_bad_settings_are_named(tiny_data, overrides, message):
    with pytest.raises(tg.ConfigError, match=message):
        tg.setup(tiny_data.env(**overrides))


def test_validation_split_shorter_than_a_sequence(tiny_data, tmp_path):
    data = tmp_path / "short"
    data.mkdir()
    (data / "fineweb_train_000000.bin").write_bytes((tiny_data.data_path / "fineweb_train_000000.bin").read_bytes())
    write_datafile(data / "fineweb_val_000000.bin", [1, 5, 6, 7])
    with pytest.raises(tg.ConfigError, match=r"validation split .* holds 4 tokens .*, not one window"):
        tg.setup(tiny_data.env(DATA_PATH=data))


def test_cli_reports_config_error_without_traceback(tiny_data, tmp_path):
    out = run_trainer(tiny_data.env(NUM_KV_HEADS="3"), tmp_path)
    assert out.returncode != 0
    assert "train_gpt.py: error: NUM_HEADS=4: use a multiple of NUM_KV_HEADS=3" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "logs").exists(), "a bad setting must stop the run before it writes anything"


# ---- end to end ----

FINAL_RE = re.compile(r"final_int8_zlib_roundtrip_exact val_loss:(\S+) val_bpb:(\S+)")


@pytest.fixture(scope="module")
def single_run(tiny_data, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("run1")
    out = run_trainer(tiny_data.env(RUN_ID="single", VAL_LOSS_EVERY="10"), cwd)
    assert out.returncode == 0, out.stderr[-3000:]
    return cwd, out


def test_end_to_end_loss_falls_and_final_lines(single_run, tiny_data):
    cwd, out = single_run
    vals = [float(v) for v in re.findall(r"step:\d+/20 val_loss:(\S+)", out.stdout)]
    assert len(vals) == 3, out.stdout  # steps 0, 10 and 20
    assert vals[0] == pytest.approx(math.log(tiny_data.vocab_size), abs=0.3), "a fresh model is near uniform"
    assert vals[-1] < vals[0] - 0.5, f"validation loss did not fall: {vals}"
    train = [float(v) for v in re.findall(r"train_loss:(\S+)", out.stdout)]
    assert train[-1] < train[0]
    assert re.search(r"step:20/20 train_loss:\S+ train_time:\d+ms step_avg:[\d.]+ms tok/s:\d+", out.stdout)
    final = FINAL_RE.search(out.stdout)
    assert final and abs(float(final.group(1)) - vals[-1]) < 0.05, "int8 round trip changed the loss a lot"
    assert re.search(r"final_int8_zlib_roundtrip val_loss:\S+ val_bpb:\S+ eval_time:\d+ms", out.stdout)


def test_log_embeds_exact_source_and_sizes_are_real(single_run):
    cwd, out = single_run
    log = (cwd / "logs" / "single.txt").read_bytes()
    source = (ROOT / "train_gpt.py").read_bytes()
    header = re.match(rb"==== train_gpt.py source bytes:(\d+) sha256:(\w+) ====\n", log)
    assert header and int(header.group(1)) == len(source)
    assert log[header.end():header.end() + len(source)] == source
    text = log[header.end() + len(source):].decode()
    assert text.startswith("\n==== end of source ====\n")
    assert "command: " in text and "python train_gpt.py" in text and "ITERATIONS=20" in text
    assert json.loads(re.search(r"hyperparameters: (.*)", text).group(1))["num_layers"] == 2
    artifact = cwd / "logs" / "single_model.int8_zlib.ptz"
    total = int(re.search(r"Total submission size int8\+zlib: (\d+) bytes", text).group(1))
    assert total == len(source) + artifact.stat().st_size
    assert re.search(r"step:20/20 val_loss", text) and FINAL_RE.search(text), "console lines reach the log"


def test_existing_run_id_is_not_overwritten(single_run, tiny_data):
    cwd, _ = single_run
    before = (cwd / "logs" / "single.txt").read_bytes()
    out = run_trainer(tiny_data.env(RUN_ID="single"), cwd)
    assert out.returncode != 0 and "RUN_ID=single" in out.stderr and "already exists" in out.stderr
    assert (cwd / "logs" / "single.txt").read_bytes() == before


def test_two_processes_match_one(single_run, tiny_data, tmp_path):
    _, out1 = single_run
    # no RUN_ID: rank 0's random one must reach rank 1, or the ranks disagree on the artifact's name
    out2 = run_trainer(tiny_data.env(VAL_LOSS_EVERY="10"), tmp_path, nproc=2)
    assert out2.returncode == 0, out2.stderr[-3000:]
    assert "world_size:2 grad_accum_steps:4" in out2.stdout
    assert len(list((tmp_path / "logs").glob("*_model.int8_zlib.ptz"))) == 1
    loss1, loss2 = (float(FINAL_RE.search(o.stdout).group(1)) for o in (out1, out2))
    assert abs(loss1 - loss2) < 1e-4, (loss1, loss2)


def test_warmup_steps_do_not_change_the_run(single_run, tiny_data, tmp_path):
    """Warmup only primes compilation: weights, optimizer states and data restart after it."""
    _, out1 = single_run
    out2 = run_trainer(tiny_data.env(RUN_ID="warm", VAL_LOSS_EVERY="10", WARMUP_STEPS="3"), tmp_path)
    assert out2.returncode == 0, out2.stderr[-3000:]
    assert "warmup_step:3/3" in out2.stdout
    assert FINAL_RE.search(out2.stdout).group(0) == FINAL_RE.search(out1.stdout).group(0)


def test_readme_documents_every_setting():
    readme = (ROOT / "README.md").read_text()
    missing = [name for name in tg.ENV_NAMES if f"`{name}`" not in readme]
    assert not missing, f"README's settings table lacks {missing}"


def test_misspelled_settings_are_refused():
    """A typo would otherwise be silently ignored: it is refused, naming the setting meant; other env vars pass."""
    with pytest.raises(tg.ConfigError) as e:
        tg.Hyperparameters.from_env({"NUM_LAYER": "11", "PATH": "/bin", "MATRIX_LR": "0.1", "HOME": "/root"})
    assert "NUM_LAYER=11: not a setting; did you mean NUM_LAYERS?" in str(e.value)
    assert "PATH" not in str(e.value) and "MATRIX_LR" not in str(e.value)
    assert tg.Hyperparameters.from_env({"PATH": "/bin", "MATRIX_LR": "0.1", "OMP_NUM_THREADS": "1"}).matrix_lr == 0.1


def test_nothing_compiles_inside_a_timer(tiny_data, tmp_path):
    """torch.compile recompiles nothing inside the timed training loop or the timed final passes: with the
    depth-recurrence switch and no validation but the last, training compiles one graph beyond warmup's (that
    validation's, outside the timed steps); the round trip, sliding and TTT passes compile nothing inside their
    timers, with validation or without, at window and batch shapes training never ran (their graphs are primed on
    random tokens first). Dynamo's guards decide recompiles whatever the backend, so the cheap "eager" backend
    stands in for inductor."""
    driver = ("import functools, runpy, sys, torch; "
              "torch.compile = functools.partial(torch.compile, backend='eager'); "
              f"runpy.run_path({str(ROOT / 'train_gpt.py')!r}, run_name='__main__')")
    counts = {}
    for steps, val_every in ((16, 0), (8, 4)):
        env = tiny_data.env(RUN_ID=f"graphs{steps}", ITERATIONS=steps, WARMUP_STEPS=3, VAL_LOSS_EVERY=val_every,
                            COMPILE=1, NUM_LAYERS=3, MODEL_DIM=128, LOOP_START=1, LOOP_END=1, LOOP_REPEATS=1,
                            LOOP_START_FRAC=0.25, QUANT_BITS=6, EVAL_SEQ_LEN=128,
                            EVAL_STRIDE=32, TTT=1, TTT_CHUNK_TOKENS=512)  # shapes that training never ran
        out = subprocess.run([sys.executable, "-c", driver], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.count("phase: from step:") == 1
        counts[val_every] = [int(n) for n in re.findall(r"^compile: (\d+) graphs", out.stdout, flags=re.M)]
        total = re.search(r"^final_eval_total eval_time:\d+ms limit:600000ms passes:roundtrip:\d+ms,"
                          r"sliding_window:\d+ms,ttt:\d+ms graphs_compiled_inside:(\d+)$", out.stdout, flags=re.M)
        assert total and total.group(1) == "0", out.stdout[-2000:]
    after_warmup, after_training = counts[0]
    assert after_training == after_warmup + 1, "training compiled graphs beyond the final validation's one"
