"""The first hour on a GPU in one command: what this project has never measured, as one table (and JSON).

    python bench/gpu_check.py              # on a machine with one or more CUDA GPUs
    python bench/gpu_check.py --dry-run    # anywhere: the same runs at tiny shapes on the CPU (CI runs it)
    python bench/gpu_check.py --parts tests,lora   # some of them (all take more than 8 minutes on one H100)

It needs the offline corpus's shards (python data/build_sotu.py --variant sp1024 sp8192), which is all a
GPU machine that reaches nothing needs to have with it. Every figure comes from train_gpt.py's own log lines:

- the CUDA-only tests (`pytest -m cuda`; skipped without a GPU);
- the default shape (9x512, sp1024) on one GPU: ms/step, tokens/s and peak memory over steady steps, and MFU
  (the logged tok/s times bench/flops.py's FLOPs per token, over the GPU's peak), beside the challenge's
  reference (43.5 ms/step on 8xH100 at one micro-step, so about 8x that on one GPU at 8);
- the record-track shape on one GPU with GRAD_ACCUM_STEPS=16, so that each micro-step holds the 24
  sequences a GPU holds on 8xH100 at 2: ms/step before and after the depth-recurrence switch, peak memory;
  with two or more GPUs also with OPTIMIZE_DDP=0 (dynamo's DDPOptimizer off, as the field runs), else that
  row says why not;
- the evaluation passes at the record shape on a slice of the validation set (round trip, sliding, TTT,
  and the export with GPTQ), extrapolated to 40,540,160 validation tokens on 8 GPUs, with the graphs each
  pass compiled inside its timer (must be 0);
- one record-shape attention layer, forward and backward: SDPA's flash kernel (as train_gpt.py runs it) and
  FlashAttention 4 behind it where pip's flash-attn-4 runs (issue 28: whether train_gpt.py should switch it on);
- per-document LoRA TTT at the record shape: one group of TTT_BATCH_SIZE documents as long as the eval window,
  compiled, then timed: ms per group, token positions per second, MFU, and the graphs compiled while timed;
- two identical short runs, which must agree bit for bit, and the compiled-graph counts after warmup and
  at the run's exit, which must be equal: warmup compiles every graph of the training phases and the final
  passes (which also report the graphs compiled inside their timers).

On a GPU, run this first and put the table in MEASUREMENTS.md with the command and the device.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from flops import count_flops_per_token, peak_flops, ttt_positions
from run_files import ROOT, tg  # puts the repository's root on sys.path
from data.shards import read_datafile, write_datafile  # noqa: E402

PARTS = ("tests", "default", "record", "attention", "lora", "twin")
REFERENCE_MS_8XH100 = 43.5  # the challenge's baseline, 9x512 sp1024, one micro-step per GPU
FULL_VAL_TOKENS = 40_540_160  # sp8192 validation tokens in the field's logs
# The record track's shape (docs/GPU.md, "The record track"), evaluated and exported as it will be.
RECORD = dict(
    VOCAB_SIZE=8192, NUM_LAYERS=11, MODEL_DIM=512, NUM_HEADS=8, NUM_KV_HEADS=4, MLP_MULT=4,
    MLP_LEAKY_SLOPE=0.5, QK_GAIN_INIT=5, ROPE_DIMS=16, LN_SCALE=1, XSA_LAST_N=11,
    SMEAR_GATE_ENABLED=1, SKIP_GATES_ENABLED=1, ORTHO_INIT=1, SPARSE_ATTN_GATE_ENABLED=1,
    LOOP_START=3, LOOP_END=5, NUM_LOOPS=2, PARALLEL_START_LAYER=8,
    TRAIN_SEQ_LEN=2048, TRAIN_BATCH_TOKENS=786432, GRAD_ACCUM_STEPS=16,
    MATRIX_BITS=6, EMBED_BITS=7, ATTN_CLIP_SIGMAS=13, MLP_CLIP_SIGMAS=11.5, EMBED_CLIP_SIGMAS=14,
    GPTQ=1, COMPRESSOR="brotli", EMA_DECAY=0.9965,
    EVAL_STRIDE=64, TTT_ENABLED=1, TTT_LORA_RANK=80, TTT_CHUNK_SIZE=48, TTT_BETA2=0.99, TTT_WEIGHT_DECAY=0.5,
    SLIDING_WINDOW_ENABLED=1,
)
# The shapes of the CPU dry run: the same settings and passes, small enough for seconds.
TINY = dict(
    VOCAB_SIZE=1024, NUM_LAYERS=5, MODEL_DIM=128, NUM_HEADS=4, NUM_KV_HEADS=2, MLP_MULT=2,
    LOOP_START=1, LOOP_END=2, NUM_LOOPS=1, PARALLEL_START_LAYER=3, XSA_LAST_N=5,
    TRAIN_SEQ_LEN=64, TRAIN_BATCH_TOKENS=2048, GRAD_ACCUM_STEPS=4,
    TTT_LORA_RANK=4, TTT_CHUNK_SIZE=64, TTT_BATCH_SIZE=4, VAL_BATCH_SIZE=2048, EVAL_STRIDE=16,
)

STEP = re.compile(r"^step:(\d+)/\d+ train_loss:\S+ train_time:(\d+)ms step_avg:\S+ tok/s:\d+", re.M)
FINAL = re.compile(r"^final_\w+?_(roundtrip|sliding_window|ttt) val_loss:\S+ val_bpb:\S+ "
                   r"eval_time:(\d+)ms", re.M)
TOTAL = re.compile(r"^final_eval_total eval_time:(\d+)ms.*?(?: graphs_compiled_inside:(\d+))?$", re.M)
PEAK_MIB = r"peak memory allocated: (\d+) MiB"
# On the CPU, torch.compile uses the eager backend: dynamo's guards (what decides recompiles) are the same,
# and the dry run stays quick.
EAGER_COMPILE = "torch.compile = functools.partial(torch.compile, backend='eager'); "
# The log counts the graphs after warmup; a single process also prints them at its exit.
AT_EXIT = re.compile(r"^compile: \d+ graphs at exit$", re.M)
GRAPHS = "torch._dynamo.utils.counters['stats']['unique_graphs']"
PRINT_AT_EXIT = f"print('compile:', {GRAPHS}, 'graphs at exit')"


def run(env: dict, cwd: Path, nproc: int = 1, timeout: float = 3600) -> str:
    """One train_gpt.py run, its log in cwd/logs: the log's text after the source (one process: and the
    graphs compiled at its exit)."""
    script = str(ROOT / "train_gpt.py")
    patch = EAGER_COMPILE if env.get("DEVICE") == "cpu" else ""
    launch = f"import functools, runpy, sys, torch, torch._dynamo.utils; {patch}sys.argv = [{script!r}]; "
    body = "runpy.run_path(sys.argv[0], run_name='__main__'); "
    cmd = [sys.executable, "-c", launch + body + PRINT_AT_EXIT]
    if nproc > 1:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd = torchrun + [f"--nproc_per_node={nproc}", script]
    env = {**env, "ARTIFACT_DIR": cwd / "logs"}
    environ = {**os.environ, **{k: str(v) for k, v in env.items()}}
    out = subprocess.run(cmd, env=environ, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{env['RUN_ID']} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    log = cwd / "logs" / f"{env['RUN_ID']}.txt"
    text = log.read_text(errors="replace").split("\n==== end of source ====\n", 1)[-1]
    return text + "".join(line + "\n" for line in AT_EXIT.findall(out.stdout))


def number(pattern: str, text: str, default=None):
    found = re.findall(pattern, text, flags=re.M)
    return float(found[-1]) if found else default


def step_ms(text: str, first: int, last: int) -> float | None:
    """ms per step between two logged steps (TRAIN_LOG_EVERY=1 logs every one)."""
    times = {int(step): int(ms) for step, ms in STEP.findall(text)}
    steps = [s for s in times if first <= s <= last]
    if len(steps) < 2:
        return None
    return (times[max(steps)] - times[min(steps)]) / (max(steps) - min(steps))


def flops_per_token(env: dict) -> float:
    """A run's trained FLOPs per token (bench/flops.py), from the model its settings build."""
    hp = tg.Hyperparameters.from_env({k: str(v) for k, v in env.items()})
    return count_flops_per_token(tg.GPT(hp), hp)


def tiny_valset(data: Path, out: Path, tokens: int) -> Path:
    """data's training shards and its first `tokens` validation tokens (cut at a document start): a folder."""
    out.mkdir(parents=True, exist_ok=True)
    for shard in sorted(data.glob("fineweb_train_*.bin")):
        (out / shard.name).unlink(missing_ok=True)
        (out / shard.name).symlink_to(shard.resolve())
    val = read_datafile(sorted(data.glob("fineweb_val_0*.bin"))[0])
    bos = np.flatnonzero(val[:tokens] == tg.BOS_ID)
    end = bos[-1] if len(bos) > 1 else tokens
    write_datafile(out / "fineweb_val_000000.bin", val[:end])
    return out


def attention_ms(layout, seqs: int, seq_len: int, reps: int = 10) -> float:
    """ms per forward + backward of one record-shape attention layer on seqs x seq_len tokens."""
    hp = tg.Hyperparameters(**dict({k.lower(): v for k, v in RECORD.items()}, train_seq_len=seq_len))
    attn = tg.CausalSelfAttention(hp, layer=hp.num_layers - 1).to(layout.device)
    x = torch.randn(seqs, seq_len, hp.model_dim, device=layout.device, requires_grad=True)
    for rep in range(reps + 2):  # two untimed
        if rep == 2:
            tg.synchronize(layout.device)
            t0 = time.perf_counter()
        with tg.autocast(layout):
            attn(x).float().square().mean().backward()
    tg.synchronize(layout.device)
    return tg.ms_since(t0) / reps


def attention_rows(report: dict, rows: list, dry_run: bool) -> None:
    """SDPA's flash kernel, then FlashAttention 4 behind it where it runs, at a GPU's micro-step of the record."""
    cuda = not dry_run
    layout = tg.Layout(device=torch.device("cuda" if cuda else "cpu"), use_bf16=cuda)
    seqs, seq_len = (24, 2048) if cuda else (2, 64)
    if not cuda:
        timings = {"sdpa (cpu)": attention_ms(layout, seqs, seq_len)}
    else:
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            timings = {"sdpa flash": attention_ms(layout, seqs, seq_len)}
            try:  # needs pip's flash-attn-4, an SM 9.0/10.0 GPU and a torch with the switch
                torch.nn.attention.activate_flash_attention_impl("FA4")
                timings["FA4"] = attention_ms(layout, seqs, seq_len)
                torch.nn.attention.restore_flash_attention_impl()
            except (AttributeError, ImportError, RuntimeError) as e:
                timings[f"FA4 ({type(e).__name__}: {e})"] = None
    report["attention_ms"] = timings
    shown = ", ".join(f"{name}: {ms:.2f}" if ms else f"{name}: -" for name, ms in timings.items())
    rows.append((f"attention, {seqs}x{seq_len} tokens, one layer fwd+bwd (ms)", shown, "FA4 below flash"))


def tests_rows(report: dict, rows: list) -> None:
    """The CUDA-only tests."""
    pytest = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests"]
    tests = subprocess.run(pytest, cwd=ROOT, capture_output=True, text=True)
    summary = (tests.stdout.strip().splitlines() or ["no output"])[-1]
    report["cuda_tests"] = {"exit": tests.returncode, "summary": summary}
    rows.append(("CUDA-only tests (pytest -m cuda)", summary, "all pass; skipped without a GPU"))


def default_rows(report: dict, rows: list, args, base: dict, tok: dict, work: Path) -> None:
    """The default shape on one GPU."""
    sp1024 = args.sp1024
    steps = args.steps
    if args.dry_run:
        sp1024 = tiny_valset(args.sp1024, work / "sp1024_slice", 4096)
        steps = 4
    default = dict(base, RUN_ID="default", DATA_PATH=sp1024, TOKENIZER_PATH=tok[1024], ITERATIONS=steps + 20,
                   WARMUP_STEPS=20, VAL_LOSS_EVERY=0, TRAIN_LOG_EVERY=1, MAX_WALLCLOCK_SECONDS=0, SEED=1)
    if args.dry_run:
        default.update(NUM_LAYERS=2, MODEL_DIM=64, TRAIN_SEQ_LEN=64, TRAIN_BATCH_TOKENS=2048,
                       VAL_BATCH_SIZE=2048, WARMUP_STEPS=2, ITERATIONS=steps + 2)
    text = run(default, work)
    ms = step_ms(text, 3 if args.dry_run else 21, 10**9)
    tokens_per_s = number(r"tok/s:(\d+)", text)
    per_token = flops_per_token(default)
    peak = peak_flops(report["device"])
    mfu = 100 * per_token * tokens_per_s / peak if peak else None  # one GPU
    report["default"] = {"ms_per_step": ms, "tokens_per_s": tokens_per_s, "flops_per_token": per_token,
                         "mfu_pct": mfu, "peak_mib": number(PEAK_MIB, text)}
    mfu_text = f"{mfu:.1f}%" if mfu else "-"
    rows.append(("default 9x512: ms/step, one GPU, 8 micro-steps", f"{ms:.1f}" if ms else "-",
                 f"~{8 * REFERENCE_MS_8XH100:.0f} (43.5 on 8xH100)"))
    rows.append(("default: tokens/s, MFU, peak memory",
                 f"{tokens_per_s:.0f}, {mfu_text}, {report['default']['peak_mib'] or '-'} MiB",
                 "baseline: ~10 GiB"))
    report["default_run"] = (default, text)


def record_rows(report: dict, rows: list, args, base: dict, tok: dict, work: Path, gpus: int) -> None:
    """The record shape: step time around the loop switch, then every timed pass on a validation slice."""
    sp1024 = tiny_valset(args.sp1024, work / "sp1024_slice", 4096) if args.dry_run else args.sp1024
    record = dict(base, **RECORD)
    if args.dry_run:
        record.update(TINY, DATA_PATH=sp1024, TOKENIZER_PATH=tok[1024], GPTQ_CALIB_SEQS=4, ITERATIONS=6)
    else:
        slice_path = tiny_valset(args.sp8192, work / "sp8192_slice", args.val_tokens)
        record.update(DATA_PATH=slice_path, TOKENIZER_PATH=tok[8192], GPTQ_CALIB_SEQS=64, ITERATIONS=24)
    record.update(RUN_ID="record", MAX_WALLCLOCK_SECONDS=0, WARMUP_STEPS=4, TRAIN_LOG_EVERY=1,
                  VAL_LOSS_EVERY=0, SEED=1, ENABLE_LOOPING_AT=0.5)
    text = run(record, work)
    switch = int(re.search(r"^phase: from step:(\d+) depth_recurrence:on", text, re.M).group(1))
    before = step_ms(text, 2, switch)
    after = step_ms(text, switch + 2, 10**9)
    report["record"] = {"ms_per_step_before_loop": before, "ms_per_step_after_loop": after,
                        "loop_switch_step": switch, "peak_mib": number(PEAK_MIB, text)}
    rows.append(("record shape, 1 GPU x 16 micro-steps: ms/step before / after the loop switch",
                 f"{before or 0:.0f} / {after or 0:.0f}", "x 1/8 on 8xH100: the field ran ~121.7 ms/step"))
    rows.append(("record shape: peak memory allocated", f"{report['record']['peak_mib'] or '-'} MiB",
                 "field: ~41 GiB at 48 sequences per GPU; 24 here"))
    if gpus >= 2:
        ddp = {}
        for flag in (1, 0):
            ddp_run = dict(record, RUN_ID=f"ddp{flag}", OPTIMIZE_DDP=flag, GRAD_ACCUM_STEPS=16 // 2,
                           TTT_ENABLED=0, GPTQ=0, EVAL_STRIDE=0, GPTQ_CALIB_SEQS=64)
            ddp[flag] = step_ms(run(ddp_run, work, nproc=2), switch + 2, 10**9)
        report["optimize_ddp"] = ddp
        rows.append(("2 GPUs: ms/step after the switch, OPTIMIZE_DDP=1 / 0", f"{ddp[1]:.0f} / {ddp[0]:.0f}",
                     "the field turns it off; keep the faster"))
    else:
        rows.append(("OPTIMIZE_DDP=1 vs 0", "needs 2 GPUs",
                     "DDP wraps the model only with 2 or more processes"))
    val_tokens = int(number(r"^val_tokens:(\d+)", text))
    passes = {name: int(ms) for name, ms in FINAL.findall(text)}
    total = TOTAL.search(text)
    scale = FULL_VAL_TOKENS / val_tokens / 8
    report["eval"] = {
        "val_tokens": val_tokens,
        "passes_ms": passes,
        "graphs_compiled_inside": int(total.group(2) or 0),
        "export_ms": number(r"export_time:(\d+)ms", text),
        "calibration_ms": number(r"calibration_time:(\d+)ms", text),
        "extrapolated_8gpu_s": {name: ms * scale / 1000 for name, ms in passes.items()},
    }
    inside = report["eval"]["graphs_compiled_inside"]
    rows.append((f"eval passes on {val_tokens:,} tokens (ms): " + ", ".join(passes),
                 ", ".join(map(str, passes.values())),
                 f"graphs compiled inside the timers: {inside} (must be 0)"))
    extrapolated = report["eval"]["extrapolated_8gpu_s"].values()
    rows.append(("... extrapolated to 40.5M tokens on 8 GPUs (s)",
                 ", ".join(f"{s:.0f}" for s in extrapolated), "total must stay under 600 s"))
    export_ms = report["eval"]["export_ms"] or "-"
    calibration_ms = report["eval"]["calibration_ms"] or "-"
    rows.append(("export (GPTQ + compression) / calibration, ms", f"{export_ms} / {calibration_ms}",
                 "outside the timers"))
    counts = [int(n) for n in re.findall(r"^compile: (\d+) graphs (?:after warmup|at exit)", text, re.M)]
    report["compile_counts"] = counts
    rows.append(("graphs after warmup / at exit", " / ".join(map(str, counts)),
                 "equal: warmup compiles every graph training and the final passes use"))



def lora_rows(report: dict, rows: list, dry_run: bool) -> None:
    """Per-document LoRA TTT at the record shape: one group of documents as long as the eval window, compiled as
    train_gpt.py compiles it (a first pass), then timed; its FLOPs are 2 forwards per token position."""
    cuda = not dry_run
    shape = dict({k.lower(): v for k, v in RECORD.items()}, **({} if cuda else {k.lower(): v for k, v in TINY.items()}))
    hp = tg.Hyperparameters(**shape)
    layout = tg.Layout(device=torch.device("cuda" if cuda else "cpu"), use_compile=True, use_bf16=cuda)
    torch.manual_seed(0)
    model = tg.GPT(hp).to(layout.device)
    model.set_looping(bool(hp.num_loops))
    scorer = torch.compile(model, dynamic=False, fullgraph=True, **({} if cuda else {"backend": "eager"}))
    tokens = torch.randint(2, hp.vocab_size, (hp.ttt_batch_size * hp.eval_window + 1,), dtype=torch.int32)
    tokens[::hp.eval_window] = tg.BOS_ID
    val = tg.Validation(tokens, torch.ones_like(tokens), hp.val_batch_size)
    run = tg.Run(hp, layout, val, b"", model=model, scorer=scorer, trainer=scorer)
    t0 = time.perf_counter()
    tg.lora_ttt(run)
    compile_s = time.perf_counter() - t0
    graphs = tg.compiled_graphs()
    tg.synchronize(layout.device)
    t0 = time.perf_counter()
    tg.lora_ttt(run)
    tg.synchronize(layout.device)
    ms = tg.ms_since(t0)
    positions = ttt_positions(hp.eval_window - 1, hp)
    forward = count_flops_per_token(model, hp) / 3  # after the loop switch
    peak = peak_flops(report["device"])
    mfu = 100 * 2 * forward * positions / (ms / 1000) / peak if peak else None
    report["lora"] = {"ms_per_group": ms, "first_pass_s": compile_s, "positions": positions,
                      "positions_per_s": positions / (ms / 1000), "mfu_pct": mfu,
                      "graphs_compiled_timed": tg.compiled_graphs() - graphs}
    rows.append((f"LoRA TTT, {hp.ttt_batch_size} documents of {hp.eval_window}: ms per group (first pass s), MFU",
                 f"{ms:.0f} ({compile_s:.0f}), {mfu:.1f}%" if mfu else f"{ms:.0f} ({compile_s:.0f})",
                 f"graphs compiled while timed: {report['lora']['graphs_compiled_timed']} (must be 0)"))


def twin_rows(report: dict, rows: list, work: Path) -> None:
    """Two identical runs agree bit for bit: the default run, once more."""
    default, default_text = report.pop("default_run")
    twin_text = run(dict(default, RUN_ID="twin"), work)
    finals = [re.findall(r"^final_\w+_exact .*$", t, re.M) for t in (default_text, twin_text)]
    report["bitwise"] = finals[0] == finals[1] and bool(finals[0])
    rows.append(("two identical runs: same final val_loss bit for bit", str(report["bitwise"]), "True"))



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny shapes on the CPU: the same runs and table")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data",
                        help="holds datasets/ and tokenizers/")
    parser.add_argument("--sp1024", type=Path, help="default: DATA_DIR/datasets/sotu_sp1024")
    parser.add_argument("--sp8192", type=Path, help="default: DATA_DIR/datasets/sotu_sp8192")
    parser.add_argument("--steps", type=int, default=60,
                        help="timed steps of the default shape (after 20 of warmup)")
    parser.add_argument("--val-tokens", type=int, default=262_144,
                        help="validation slice for the record-shape passes")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which checks, of {','.join(PARTS)}")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        sys.exit(f"gpu_check: --parts {args.parts}: choose from {','.join(PARTS)}")
    args.sp1024 = args.sp1024 or args.data_dir / "datasets/sotu_sp1024"
    args.sp8192 = args.sp8192 or args.data_dir / "datasets/sotu_sp8192"

    gpus = 0 if args.dry_run else torch.cuda.device_count()
    if not gpus and not args.dry_run:
        sys.exit("gpu_check: no CUDA GPU is visible; run with --dry-run for the CPU rehearsal")
    base = dict(DEVICE="cuda")
    if args.dry_run:
        base = dict(DEVICE="cpu", COMPILE=1, BF16=0)
    tok = {v: args.data_dir / f"tokenizers/sotu_{v}_bpe.model" for v in (1024, 8192)}
    needed = [args.sp1024, tok[1024]]
    if not args.dry_run:
        needed += [args.sp8192, tok[8192]]
    for path in needed:
        if not path.exists():
            sys.exit(f"gpu_check: {path} is missing: python data/build_sotu.py --variant sp1024 sp8192")
    device = torch.cuda.get_device_name(0) if gpus else "cpu (dry run)"
    report = {"device": device, "gpus": gpus}
    rows = []
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    t_start = time.time()

    if "tests" in parts:
        tests_rows(report, rows)
    if "default" in parts or "twin" in parts:
        default_rows(report, rows, args, base, tok, work)
    if "record" in parts:
        record_rows(report, rows, args, base, tok, work, gpus)
    if "attention" in parts:
        attention_rows(report, rows, args.dry_run)
    if "lora" in parts:
        lora_rows(report, rows, args.dry_run)
    if "twin" in parts:
        twin_rows(report, rows, work)

    report["rows"] = rows
    report["wall_s"] = time.time() - t_start
    width = max(len(r[0]) for r in rows)
    print(f"gpu_check on {report['device']} ({gpus} GPU(s)), {report['wall_s']:.0f} s\n")
    print(f"| {'check':<{width}} | measured | expected |\n|{'-' * (width + 2)}|---|---|")
    for check, measured, expected in rows:
        print(f"| {check:<{width}} | {measured} | {expected} |")
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
