"""What score-first test-time training (TTT=1) gains on a real model, and what it costs.

    python bench/ttt.py logs/<run>_model.<export>.ptz logs/<run>.txt [--reader old/train_gpt.py]
        [--chunks 8192 32768] [--lrs 0.002 0.005] [--epochs 1] [--stride 0] [--compile]

The run's exported model is read back and evaluated by train_gpt.py's own code: once without TTT
(score(), plain windows or sliding with --stride), then with test_time_train() for every combination
of chunk size, learning rate, epochs and adapted parameters, each from the same exported weights.
Each line gives val_bpb, its change against no TTT, and the wall time of the whole evaluation.
"""

import argparse
import copy
import itertools
import time

import torch

from run_files import add_run_arguments, read_run, tg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("--chunks", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.002, 0.005])
    parser.add_argument("--epochs", type=int, nargs="+", default=[1])
    parser.add_argument("--stride", type=int, default=0, help="EVAL_STRIDE for the scoring (0: plain windows)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (faster on CPU for width 256+)")
    args = parser.parse_args()
    hp, state = read_run(args)
    hp.eval_stride = args.stride
    layout = tg.Layout(0, 1, 0, False, torch.device("cpu"), 1, args.compile, False)
    tok = tg.load_tokenizer(hp.tokenizer_path, hp.vocab_size)
    val_tokens, val_bytes = tg.load_validation(hp.data_path, max(hp.train_seq_len, hp.eval_seq_len), tok)

    def fresh():
        model = tg.GPT(hp)
        model.load_state_dict(state, strict=True)
        return model, (torch.compile(model, dynamic=False) if args.compile else model)

    t0 = time.perf_counter()
    _, scorer = fresh()
    _, reference = tg.metrics(tg.score(scorer, val_tokens, val_bytes, hp, layout, sliding=args.stride > 0))
    print(f"no TTT: val_bpb {reference:.5f} ({'sliding, stride ' + str(args.stride) if args.stride else 'plain'}), "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    for chunk, lr, epochs in itertools.product(args.chunks, args.lrs, args.epochs):
        settings = dict(ttt_chunk_tokens=chunk, ttt_lr=lr, ttt_epochs=epochs)
        run_hp = copy.deepcopy(hp)
        for name, value in settings.items():
            setattr(run_hp, name, value)
        _, model = fresh()
        t0 = time.perf_counter()
        _, bpb = tg.metrics(tg.test_time_train(model, val_tokens, val_bytes, run_hp, layout).sum(0))
        print(f"TTT chunk {chunk} lr {lr} epochs {epochs}: val_bpb {bpb:.5f} "
              f"(Δ {bpb - reference:+.5f}), {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
