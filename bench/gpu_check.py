"""The first hour on a GPU in one command: what this project has never measured, as one table (and JSON).

    python bench/gpu_check.py                    # on a machine with one or more CUDA GPUs
    python bench/gpu_check.py --dry-run          # anywhere: the same runs at tiny shapes on the CPU (CI runs it)

It needs the offline corpus's shards (python data/build_sotu.py --variant sp1024 sp8192), which is all a GPU
machine that reaches nothing needs to have with it. Every figure comes from train_gpt.py's own log lines:

- the CUDA-only tests (`pytest -m cuda`; skipped without a GPU);
- the default shape (9x512, sp1024) on one GPU: ms/step, tokens/s, MFU and peak memory over steady steps, beside
  the challenge's reference (43.5 ms/step on 8xH100 at one micro-step, so about 8x that on one GPU at 8);
- the record-track shape on one GPU with GRAD_ACCUM_STEPS=16, so that each micro-step holds the 24 sequences a
  GPU holds on 8xH100 at 2: ms/step before and after the depth-recurrence switch, peak memory; with two or more
  GPUs also with OPTIMIZE_DDP=0 (dynamo's DDPOptimizer off, as the field runs), else that row says why not;
- the evaluation passes at the record shape on a slice of the validation set (round trip, sliding, TTT, and the
  export with GPTQ), extrapolated to 40,540,160 validation tokens on 8 GPUs, with the graphs each pass compiled
  inside its timer (must be 0);
- two identical short runs, which must agree bit for bit, and the compiled-graph counts through warmup, the loop
  switch (the final passes report theirs inside their timers).

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data.shards import write_datafile  # noqa: E402

REFERENCE_MS_8XH100 = 43.5  # the challenge's baseline, 9x512 sp1024, one micro-step per GPU
FULL_VAL_TOKENS = 40_540_160  # sp8192 validation tokens in the field's logs
# The record track's shape (README, "The record track"), evaluated and exported as it will be.
RECORD = dict(VOCAB_SIZE=8192, NUM_LAYERS=11, MODEL_DIM=512, NUM_HEADS=8, NUM_KV_HEADS=4, MLP_MULT=4,
              MLP_LEAKY_SLOPE=0.5, QK_GAIN_INIT=5, ROPE_DIMS=16, LN_SCALE=1, XSA_LAST_N=11, SMEAR_GATE=1, SKIP_GATES=1,
              ORTHO_INIT=1, ATTN_GATE=1, LOOP_START=3, LOOP_END=5, LOOP_REPEATS=2, PARALLEL_FROM=8, TRAIN_SEQ_LEN=2048,
              TRAIN_BATCH_TOKENS=786432, GRAD_ACCUM_STEPS=16, QUANT_BITS=6, EMBED_QUANT_BITS=7, ATTN_QUANT_SIGMAS=13,
              MLP_QUANT_SIGMAS=11.5, EMBED_QUANT_SIGMAS=14, GPTQ=1, COMPRESSOR="brotli", EMA_DECAY=0.9965,
              EVAL_STRIDE=64, TTT=1, TTT_LR=0.005, TTT_EPOCHS=3, SLIDING_EVAL=1)
# The shapes of the CPU dry run: the same settings and passes, small enough for seconds.
TINY = dict(VOCAB_SIZE=1024, NUM_LAYERS=5, MODEL_DIM=128, NUM_HEADS=4, NUM_KV_HEADS=2, MLP_MULT=2, LOOP_START=1,
            LOOP_END=2, LOOP_REPEATS=1, PARALLEL_FROM=3, TRAIN_SEQ_LEN=64, TRAIN_BATCH_TOKENS=2048, GRAD_ACCUM_STEPS=4,
            XSA_LAST_N=5, TTT_CHUNK_TOKENS=512, VAL_BATCH_SIZE=2048, EVAL_STRIDE=16)

STEP = re.compile(r"^step:(\d+)/\d+ train_loss:\S+ train_time:(\d+)ms step_avg:\S+ tok/s:(\d+)(?: mfu:([\d.]+)%)?", re.M)
FINAL = re.compile(r"^final_\w+?_(roundtrip|sliding_window|ttt) val_loss:\S+ val_bpb:\S+ eval_time:(\d+)ms", re.M)


def run(env: dict, cwd: Path, nproc: int = 1, timeout: float = 3600) -> str:
    """One train_gpt.py run; its log's text. On the CPU, torch.compile uses the eager backend: dynamo's guards (what
    decides recompiles) are the same, and the dry run stays quick."""
    cmd = [sys.executable, "-c", "import functools, runpy, sys, torch; "
           + ("torch.compile = functools.partial(torch.compile, backend='eager'); " if env.get("DEVICE") == "cpu" else "")
           + f"sys.argv = [{str(ROOT / 'train_gpt.py')!r}]; runpy.run_path(sys.argv[0], run_name='__main__')"]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(ROOT / "train_gpt.py")]
    out = subprocess.run(cmd, env={**os.environ, **{k: str(v) for k, v in env.items()}}, cwd=cwd, capture_output=True,
                         text=True, timeout=timeout)
    log = cwd / "logs" / f"{env['RUN_ID']}.txt"
    if out.returncode != 0:
        raise RuntimeError(f"{env['RUN_ID']} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    return log.read_text(errors="replace").split("\n==== end of source ====\n", 1)[-1]


def number(pattern: str, text: str, default=None):
    found = re.findall(pattern, text, flags=re.M)
    return float(found[-1]) if found else default


def step_ms(text: str, first: int, last: int) -> float | None:
    """ms per step between two logged steps (TRAIN_LOG_EVERY=1 logs every one)."""
    times = {int(s): int(t) for s, t, _, _ in STEP.findall(text)}
    steps = [s for s in times if first <= s <= last]
    return (times[max(steps)] - times[min(steps)]) / (max(steps) - min(steps)) if len(steps) > 1 else None


def tiny_valset(data: Path, out: Path, tokens: int) -> Path:
    """data's training shards and the first `tokens` validation tokens (cut at a document start), as a folder."""
    out.mkdir(parents=True, exist_ok=True)
    for shard in sorted(data.glob("fineweb_train_*.bin")):
        (out / shard.name).unlink(missing_ok=True)
        (out / shard.name).symlink_to(shard.resolve())
    import numpy as np

    val = np.fromfile(sorted(data.glob("fineweb_val_0*.bin"))[0], dtype="<u2", offset=1024)
    bos = np.flatnonzero(val[:tokens] == 1)
    write_datafile(out / "fineweb_val_000000.bin", val[:bos[-1] if len(bos) > 1 else tokens])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU: the same runs and table")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--data-dir", type=Path, default=ROOT / "data", help="holds datasets/ and tokenizers/")
    parser.add_argument("--sp1024", type=Path, help="default: DATA_DIR/datasets/sotu_sp1024")
    parser.add_argument("--sp8192", type=Path, help="default: DATA_DIR/datasets/sotu_sp8192")
    parser.add_argument("--steps", type=int, default=60, help="timed steps of the default shape (after 20 of warmup)")
    parser.add_argument("--val-tokens", type=int, default=262_144, help="validation slice for the record-shape passes")
    args = parser.parse_args()
    args.sp1024 = args.sp1024 or args.data_dir / "datasets/sotu_sp1024"
    args.sp8192 = args.sp8192 or args.data_dir / "datasets/sotu_sp8192"
    import torch

    gpus = 0 if args.dry_run else torch.cuda.device_count()
    if not gpus and not args.dry_run:
        sys.exit("gpu_check: no CUDA GPU is visible; run with --dry-run for the CPU rehearsal")
    base = dict(DEVICE="cpu", COMPILE=1, BF16=0) if args.dry_run else dict(DEVICE="cuda")
    tok = {v: args.data_dir / f"tokenizers/sotu_{v}_bpe.model" for v in (1024, 8192)}
    for path in (args.sp1024, args.sp8192 if not args.dry_run else args.sp1024, *tok.values()):
        if not path.exists() and (path != tok[8192] or not args.dry_run):
            sys.exit(f"gpu_check: {path} is missing: python data/build_sotu.py --variant sp1024 sp8192")
    rows, report = [], {"device": torch.cuda.get_device_name(0) if gpus else "cpu (dry run)", "gpus": gpus}
    work = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    t_start = time.time()

    # 1. the CUDA-only tests
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "cuda", "tests"], cwd=ROOT, capture_output=True,
                           text=True)
    summary = (tests.stdout.strip().splitlines() or ["no output"])[-1]
    report["cuda_tests"] = {"exit": tests.returncode, "summary": summary}
    rows.append(("CUDA-only tests (pytest -m cuda)", summary, "all pass; skipped without a GPU"))

    # 2. the default shape on one GPU
    sp1024 = tiny_valset(args.sp1024, work / "sp1024_slice", 4096) if args.dry_run else args.sp1024
    steps = 4 if args.dry_run else args.steps
    default = dict(base, RUN_ID="default", DATA_PATH=sp1024, TOKENIZER_PATH=tok[1024], ITERATIONS=steps + 20,
                   WARMUP_STEPS=20, VAL_LOSS_EVERY=0, TRAIN_LOG_EVERY=1, MAX_WALLCLOCK_SECONDS=0, SEED=1)
    if args.dry_run:
        default.update(NUM_LAYERS=2, MODEL_DIM=64, TRAIN_SEQ_LEN=64, TRAIN_BATCH_TOKENS=2048, VAL_BATCH_SIZE=2048,
                       WARMUP_STEPS=2, ITERATIONS=steps + 2)
    text = default_text = run(default, work)
    ms = step_ms(text, 3 if args.dry_run else 21, 10**9)
    report["default"] = {"ms_per_step": ms, "tokens_per_s": number(r"tok/s:(\d+)", text),
                         "mfu_pct": number(r"mfu:([\d.]+)%", text),
                         "peak_mib": number(r"peak memory allocated: (\d+) MiB", text)}
    rows.append(("default 9x512: ms/step, one GPU, 8 micro-steps", f"{ms:.1f}" if ms else "-",
                 f"~{8 * REFERENCE_MS_8XH100:.0f} (43.5 on 8xH100)"))
    rows.append(("default: tokens/s, MFU, peak memory", f"{report['default']['tokens_per_s']:.0f}, "
                 f"{report['default']['mfu_pct'] or '-'}%, {report['default']['peak_mib'] or '-'} MiB", "baseline: ~10 GiB"))

    # 3 and 4. the record shape: step time around the loop switch, then every timed pass on a validation slice
    record = dict(base, **{**RECORD, **(TINY if args.dry_run else {})}, RUN_ID="record", DATA_PATH=sp1024 if args.dry_run
                  else tiny_valset(args.sp8192, work / "sp8192_slice", args.val_tokens), TOKENIZER_PATH=tok[
                  1024 if args.dry_run else 8192], MAX_WALLCLOCK_SECONDS=0, WARMUP_STEPS=4, TRAIN_LOG_EVERY=1,
                  VAL_LOSS_EVERY=0, SEED=1, GPTQ_CALIB_SEQS=4 if args.dry_run else 64,
                  LOOP_START_FRAC=0.5, ITERATIONS=6 if args.dry_run else 24)
    text = run(record, work)
    switch = int(re.search(r"^phase: from step:(\d+) depth_recurrence:on", text, re.M).group(1))
    before, after = step_ms(text, 2, switch), step_ms(text, switch + 2, 10**9)
    report["record"] = {"ms_per_step_before_loop": before, "ms_per_step_after_loop": after, "loop_switch_step": switch,
                        "peak_mib": number(r"peak memory allocated: (\d+) MiB", text)}
    rows.append(("record shape, 1 GPU x 16 micro-steps: ms/step before / after the loop switch",
                 f"{before or 0:.0f} / {after or 0:.0f}", "x 1/8 on 8xH100: the field ran ~121.7 ms/step"))
    rows.append(("record shape: peak memory allocated", f"{report['record']['peak_mib'] or '-'} MiB",
                 "field: ~41 GiB at 48 sequences per GPU; 24 here"))
    if gpus >= 2:
        ddp = {}
        for flag in (1, 0):
            text2 = run(dict(record, RUN_ID=f"ddp{flag}", OPTIMIZE_DDP=flag, GRAD_ACCUM_STEPS=16 // 2, TTT=0, GPTQ=0,
                             EVAL_STRIDE=0, GPTQ_CALIB_SEQS=64), work, nproc=2)
            ddp[flag] = step_ms(text2, switch + 2, 10**9)
        report["optimize_ddp"] = ddp
        rows.append(("2 GPUs: ms/step after the switch, OPTIMIZE_DDP=1 / 0", f"{ddp[1]:.0f} / {ddp[0]:.0f}",
                     "the field turns it off; keep the faster"))
    else:
        rows.append(("OPTIMIZE_DDP=1 vs 0", "needs 2 GPUs", "DDP wraps the model only with 2 or more processes"))
    val_tokens = int(number(r"^val_tokens:(\d+)", text))
    passes = {name: int(ms) for name, ms in FINAL.findall(text)}
    total = re.search(r"^final_eval_total eval_time:(\d+)ms.*?(?: graphs_compiled_inside:(\d+))?$", text, re.M)
    scale = FULL_VAL_TOKENS / val_tokens / 8
    report["eval"] = {"val_tokens": val_tokens, "passes_ms": passes, "graphs_compiled_inside": int(total.group(2) or 0),
                      "export_ms": number(r"export_time:(\d+)ms", text), "calibration_ms":
                      number(r"calibration_time:(\d+)ms", text), "extrapolated_8gpu_s": {
                          name: ms * scale / 1000 for name, ms in passes.items()}}
    rows.append((f"eval passes on {val_tokens:,} tokens (ms): " + ", ".join(passes), ", ".join(map(str, passes.values())),
                 "graphs compiled inside the timers: " + str(report["eval"]["graphs_compiled_inside"]) + " (must be 0)"))
    rows.append(("... extrapolated to 40.5M tokens on 8 GPUs (s)", ", ".join(
        f"{s:.0f}" for s in report["eval"]["extrapolated_8gpu_s"].values()), "total must stay under 600 s"))
    rows.append(("export (GPTQ + compression) / calibration, ms",
                 f"{report['eval']['export_ms'] or '-'} / {report['eval']['calibration_ms'] or '-'}", "outside the timers"))
    counts = [int(n) for n in re.findall(r"^compile: (\d+) graphs", text, re.M)]
    report["compile_counts"] = counts
    rows.append(("graphs after warmup / training", " / ".join(map(str, counts)),
                 "training adds one (the last validation's)"))

    # 5. two identical runs agree bit for bit: the default run, once more
    finals = [re.findall(r"^final_\w+_exact .*$", t, re.M) for t in (default_text, run(dict(default, RUN_ID="twin"), work))]
    report["bitwise"] = finals[0] == finals[1] and bool(finals[0])
    rows.append(("two identical runs: same final val_loss bit for bit", str(report["bitwise"]), "True"))

    report["rows"], report["wall_s"] = rows, time.time() - t_start
    width = max(len(r[0]) for r in rows)
    print(f"gpu_check on {report['device']} ({gpus} GPU(s)), {report['wall_s']:.0f} s\n")
    print(f"| {'check':<{width}} | measured | expected |\n|{'-' * (width + 2)}|---|---|")
    for check, measured, expected in rows:
        print(f"| {check:<{width}} | {measured} | {expected} |")
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print(f"\nwritten: {args.out}")


if __name__ == "__main__":
    main()
