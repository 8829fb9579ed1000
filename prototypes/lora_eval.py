"""Score a run's exported model with per-document LoRA TTT, from a checkout with issue-28.patch applied.

    git apply prototypes/issue-28.patch
    python prototypes/lora_eval.py logs/<run>_model.<export>.ptz logs/<run>.txt ttt_lora_rank=64 ttt_lora_lr=0.001

The run is read back as the benches read it (bench/run_files.py: its log's settings, its weights); name=value
pairs change settings. Prints val_loss and val_bpb of lora_ttt() on the run's validation split, and the pass's
wall time. CPU, one process, from the folder the run ran in.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from run_files import add_run_arguments, cpu_run, read_run, tg  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("settings", nargs="*", metavar="name=value", help="settings changed from the log's")
    args = parser.parse_args()
    if not hasattr(tg, "lora_ttt"):
        sys.exit("lora_eval: this train_gpt.py has no lora_ttt; git apply prototypes/issue-28.patch first")
    hp, state = read_run(args)
    for pair in args.settings:
        name, value = pair.split("=")
        setattr(hp, name, type(getattr(hp, name))(value))
    run = cpu_run(hp, state)
    t0 = time.time()
    val_loss, val_bpb = tg.metrics(tg.lora_ttt(run).view(-1, 3).sum(0))
    print(f"{' '.join(args.settings)} lora_ttt val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f} "
          f"{time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
