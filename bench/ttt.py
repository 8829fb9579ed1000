"""What score-first test-time training (TTT_ENABLED=1: per-document LoRA TTT, with PHASED_TTT_ENABLED=1 its
global phases) gains on a real model, and what it costs, for a grid of its settings.

    python bench/ttt.py logs/<run>_model.<export>.ptz logs/<run>.txt [--reader old/train_gpt.py]
        [--stride 64] [--compile] [--bf16] [TTT_LORA_RANK=64 TTT_LORA_LR=0.0005,0.001 PHASED_TTT_ENABLED=0,1 ...]

The run's exported model is read back and evaluated by train_gpt.py's own code: once without TTT (score(), plain
windows or sliding with --stride), then with lora_ttt() for every combination of the settings given (NAME=values,
comma-separated; the others as the run's log has them), each from the same exported weights. Each line gives
val_bpb, its change against no TTT, and the wall time of the pass. Run it from the folder the run ran in.
"""

import argparse
import dataclasses
import itertools
import time

from run_files import add_run_arguments, cpu_run, load_model, read_run, settings, tg


def grid(pairs: list[str], hp: tg.Hyperparameters) -> list[dict]:
    """Every combination of NAME=v1,v2 pairs, as {field: value} parsed as train_gpt.py parses its settings."""
    axes = []
    for pair in pairs:
        name, _, values = pair.partition("=")
        if name.lower() not in vars(hp):
            raise SystemExit(f"{pair}: {name} is not a setting of train_gpt.py (python train_gpt.py --help)")
        default = getattr(tg.Hyperparameters(), name.lower())
        for value in values.split(","):
            problems = settings.environ_problems({name: value}, tg.Hyperparameters())
            if problems:
                raise SystemExit(f"{pair}: {problems[0]}")
        axes.append([(name.lower(), tg.as_setting(value, default)) for value in values.split(",")])
    return [dict(combination) for combination in itertools.product(*axes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("settings", nargs="*", metavar="NAME=v1,v2", help="TTT settings to try, all combinations")
    parser.add_argument("--stride", type=int, default=0, help="EVAL_STRIDE of the reference score (0: plain)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast, as a run with BF16=1")
    args = parser.parse_intermixed_args()
    hp, state = read_run(args)
    hp.eval_stride = args.stride
    run = cpu_run(hp, state, args.compile)
    run.layout.use_bf16 = args.bf16
    t0 = time.perf_counter()
    _, reference = tg.metrics(tg.score(run.scorer, run.val, run.layout, *hp.windows(args.stride > 0)))
    windows = f"sliding, stride {args.stride}" if args.stride else "plain"
    print(f"no TTT: val_bpb {reference:.5f} ({windows}), {time.perf_counter() - t0:.0f} s", flush=True)
    for chosen in grid(args.settings, hp):
        ttt_hp = dataclasses.replace(hp, ttt_enabled=True, **chosen)
        try:
            ttt_hp.validate()
        except tg.ConfigError as error:
            raise SystemExit(f"{chosen}: {error}") from None
        ttt_run = dataclasses.replace(run, hp=ttt_hp)
        load_model(ttt_run, state)  # fresh weights: global phases train them
        t0 = time.perf_counter()
        _, bpb = tg.metrics(tg.lora_ttt(ttt_run))
        shown = " ".join(f"{name.upper()}={value}" for name, value in chosen.items()) or "the log's settings"
        print(f"TTT {shown}: val_bpb {bpb:.5f} (Δ {bpb - reference:+.5f}), {time.perf_counter() - t0:.0f} s",
              flush=True)


if __name__ == "__main__":
    main()
