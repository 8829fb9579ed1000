"""Score a run's exported model with per-document LoRA TTT, from a checkout with issue-28.patch applied.

    git apply prototypes/issue-28.patch
    python prototypes/lora_eval.py logs/<run>.txt logs/<run>_model.<export>.ptz ttt_lora_rank=64 ttt_lora_lr=0.001

The run's settings come from its log's hyperparameters line; name=value pairs change them. Prints val_loss and
val_bpb of lora_ttt() on the run's validation split, and the pass's wall time. CPU, one process.
"""

import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_gpt as tg  # noqa: E402


def main() -> None:
    log, artifact, *pairs = sys.argv[1:]
    logged = json.loads(re.search(r"^hyperparameters: (.*)$", Path(log).read_text(), re.M).group(1))
    hp = tg.Hyperparameters(**{k: v for k, v in logged.items() if k in tg.Hyperparameters.__dataclass_fields__})
    for pair in pairs:
        name, value = pair.split("=")
        setattr(hp, name, type(getattr(hp, name))(value))
    if not hasattr(tg, "lora_ttt"):
        sys.exit("lora_eval: this train_gpt.py has no lora_ttt; git apply prototypes/issue-28.patch first")
    val = tg.load_validation(hp, tg.load_tokenizer(hp.tokenizer_path, hp.vocab_size))
    model = tg.GPT(hp)
    model.load_state_dict(tg.load_artifact(artifact), strict=True)
    run = tg.Run(hp, tg.Layout(), val, b"", model=model, scorer=model, trainer=model)
    t0 = time.time()
    val_loss, val_bpb = tg.metrics(tg.lora_ttt(run).view(-1, 3).sum(0))
    print(f"{' '.join(pairs)} lora_ttt val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f} {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
