"""What export settings buy on a trained model: the same weights re-exported and scored under each.

    python bench/export.py checkpoints/<run>/step_NNNNNN logs/<run>.txt \\
        --variants LQER_ENABLED=0 LQER_ENABLED=1 "LQER_ENABLED=1,LQER_RANK=16,LQER_TOP_K=25" MATRIX_BITS=7 \\
        [--sliding]

A checkpoint holds the float weights as trained (SAVE_EVERY=N with N = ITERATIONS keeps the last step's); an
artifact's weights already sit on its export's grid, so re-exporting one measures little. Each variant is the
run's own settings with the named ones changed (comma-separated), exported by train_gpt.save_artifact and read
back by load_artifact, then scored by train_gpt.score: plain windows, and with --sliding the EVAL_STRIDE
windows too.
"""

import argparse
import dataclasses
import time

from run_files import add_run_arguments, cpu_run, read_run, tg


def variant_settings(hp: tg.Hyperparameters, variant: str) -> tg.Hyperparameters:
    """The run's settings with a variant's NAME=VALUE pairs, validated as train_gpt.py validates a run's."""
    environ = {name.upper(): str(value) for name, value in dataclasses.asdict(hp).items()}
    for pair in variant.split(","):
        name, equals, value = pair.partition("=")
        if not equals:
            raise SystemExit(f"--variants {variant!r}: {pair!r} is not NAME=VALUE; write e.g. MATRIX_BITS=6")
        environ[name.strip()] = value
    try:
        return tg.Hyperparameters.from_env(environ)
    except tg.ConfigError as error:
        raise SystemExit(f"--variants {variant!r}: train_gpt.py: {error}") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("--variants", nargs="+", default=["LQER_ENABLED=0", "LQER_ENABLED=1"],
                        help="NAME=VALUE[,NAME=VALUE]")
    parser.add_argument("--sliding", action="store_true",
                        help="also score with EVAL_STRIDE (64 if the run had none)")
    args = parser.parse_args()
    hp, state = read_run(args)
    run = cpu_run(hp, state)
    for variant in args.variants:
        variant_hp = variant_settings(hp, variant)
        variant_hp.eval_stride = variant_hp.eval_stride or min(64, variant_hp.train_seq_len)
        t0 = time.perf_counter()
        blob = tg.save_artifact(state, None, variant_hp)
        export_s = time.perf_counter() - t0
        model = tg.GPT(variant_hp)
        model.load_state_dict(tg.load_artifact(blob), strict=True)
        sums = tg.score(model, run.val, run.layout, *variant_hp.windows(False))
        _, bpb = tg.metrics(sums)
        line = f"{variant}: {len(blob):,} bytes (export {export_s:.1f} s), round trip {bpb:.5f}"
        if args.sliding:
            sums = tg.score(model, run.val, run.layout, *variant_hp.windows(True))
            line += f" sliding {tg.metrics(sums)[1]:.5f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
