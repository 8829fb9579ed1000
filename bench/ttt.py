"""What score-first test-time training (TTT_ENABLED=1) gains on a real model, and what it costs.

    python bench/ttt.py logs/<run>_model.<export>.ptz logs/<run>.txt [--reader old/train_gpt.py]
        [--chunks 8192 32768] [--lrs 0.002 0.005] [--epochs 1] [--stride 0] [--compile]

The run's exported model is read back and evaluated by train_gpt.py's own code: once without TTT
(score(), plain windows or sliding with --stride), then with test_time_train() for every combination
of chunk size, learning rate and epochs, each from the same exported weights.
Each line gives val_bpb, its change against no TTT, and the wall time of the whole evaluation.
"""

import argparse
import dataclasses
import itertools
import time

from run_files import add_run_arguments, cpu_run, load_model, read_run, tg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("--chunks", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.002, 0.005])
    parser.add_argument("--epochs", type=int, nargs="+", default=[1])
    parser.add_argument("--stride", type=int, default=0,
                        help="EVAL_STRIDE for the scoring (0: plain windows)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model (faster on CPU for width 256+)")
    args = parser.parse_args()
    hp, state = read_run(args)
    hp.eval_stride = args.stride
    run = cpu_run(hp, state, args.compile)
    t0 = time.perf_counter()
    sums = tg.score(run.scorer, run.val, run.layout, *hp.windows(args.stride > 0))
    _, reference = tg.metrics(sums)
    windows = f"sliding, stride {args.stride}" if args.stride else "plain"
    print(f"no TTT: val_bpb {reference:.5f} ({windows}), {time.perf_counter() - t0:.0f} s", flush=True)
    for chunk, lr, epochs in itertools.product(args.chunks, args.lrs, args.epochs):
        settings = dict(ttt_enabled=True, ttt_chunk_tokens=chunk, ttt_lr=lr, ttt_epochs=epochs)
        ttt_hp = dataclasses.replace(hp, **settings)
        try:
            ttt_hp.validate()
        except tg.ConfigError as error:
            raise SystemExit(f"--chunks {chunk} --lrs {lr} --epochs {epochs}: {error}") from None
        ttt_run = dataclasses.replace(run, hp=ttt_hp)
        load_model(ttt_run, state)  # fresh weights: TTT trains them
        t0 = time.perf_counter()
        _, bpb = tg.metrics(tg.test_time_train(ttt_run).sum(0))
        print(f"TTT chunk {chunk} lr {lr} epochs {epochs}: val_bpb {bpb:.5f} "
              f"(Δ {bpb - reference:+.5f}), {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
