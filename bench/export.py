"""What export settings buy on a trained model: the same weights re-exported and scored under each.

    python bench/export.py checkpoints/<run>/step_NNNNNN logs/<run>.txt \
        --variants LQER_RANK=0 LQER_RANK=4 "LQER_RANK=16,LQER_TOP_K=25" QUANT_BITS=7 [--sliding]

A checkpoint holds the float weights as trained (SAVE_EVERY=N with N = ITERATIONS keeps the last step's); an
artifact's weights already sit on its export's grid, so re-exporting one measures little. Each variant is the
run's own settings with the named ones changed (comma-separated), exported by train_gpt.save_artifact and read back
by load_artifact, then scored by train_gpt.score: plain windows, and with --sliding the EVAL_STRIDE windows too.
"""

import argparse
import dataclasses
import time

import torch

from run_files import add_run_arguments, read_run, tg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("--variants", nargs="+", default=["LQER_RANK=0", "LQER_RANK=4"], help="NAME=VALUE[,NAME=VALUE]")
    parser.add_argument("--sliding", action="store_true", help="also score with EVAL_STRIDE (64 if the run had none)")
    args = parser.parse_args()
    hp, state = read_run(args)
    layout = tg.Layout(0, 1, 0, False, torch.device("cpu"), 1, False, False)
    tokenizer = tg.load_tokenizer(hp.tokenizer_path, hp.vocab_size)
    val_tokens, val_bytes = tg.load_validation(hp.data_path, hp.train_seq_len, tokenizer)
    for variant in args.variants:
        changes = dict(pair.split("=", 1) for pair in variant.split(","))
        environ = {name.upper(): str(value) for name, value in dataclasses.asdict(hp).items()} | changes
        variant_hp = tg.Hyperparameters.from_env(environ)  # validated as train_gpt.py validates a run's settings
        variant_hp.eval_stride = variant_hp.eval_stride or 64
        t0 = time.perf_counter()
        blob = tg.save_artifact(state, None, variant_hp)
        export_s = time.perf_counter() - t0
        model = tg.GPT(variant_hp)
        model.load_state_dict(tg.load_artifact(blob), strict=True)
        plain = tg.metrics(tg.score(model, val_tokens, val_bytes, variant_hp, layout))[1]
        sliding = f" sliding {tg.metrics(tg.score(model, val_tokens, val_bytes, variant_hp, layout, True))[1]:.5f}" \
            if args.sliding else ""
        print(f"{variant}: {len(blob):,} bytes (export {export_s:.1f} s), round trip {plain:.5f}{sliding}", flush=True)


if __name__ == "__main__":
    main()
