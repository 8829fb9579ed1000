"""The stack's TTT techniques and scoring lengths against the field's own code: which projections per-document LoRA
TTT adapts (stack/ttt-targets.diff), a group's chunk by its longest document (stack/short-doc-chunks.diff), and
windows longer than training with the validation split cut or whole (stack/eval-seq-len.diff).

    python bench/field_conformance.py --field path/to/pr2014 --field path/to/pr2135

--field names a record folder of openai/parameter-golf (its train_gpt.py; the field's code is not in this
repository). Its file is not imported (it needs Triton and FlashAttention-3): the parts compared are read out of
it by name and run alone on CPU, each with its own settings class made from the same environment as ours.

Targets: for every TTT_MASK the field accepts, and every TTT_Q/K/V/O/MLP_LORA the file reads unset, 0 or 1, the
field's BatchedTTTLoRA built on a stand-in model (the switches passed as its run passes them) lists its adapters;
the built frontier's Hyperparameters.lora_targets, with the tied head, must list the same. The one difference the
diff's header names (an explicit switch of 1 against a mask that leaves it out: the field's switch wins, our mask
does) is counted apart. Chunks: for each setting combination below, the field's _score_first_chunk_for_doc and our
Hyperparameters.ttt_chunk must give the same chunk for every longest document of 1 to 4,096 tokens with its BOS.
Windows: for each TTT_EVAL_SEQ_LEN and chunk below, every chunk of documents of WINDOW_DOCS targets gets from
our chunk_windows the window the field's _compute_chunk_window gives it (its first token, its length, where the
chunk's targets sit in it, how many) and the tensor the same width; RoPE's tables at that length are the field's
Rotary's as its command builds it (ROPE_YARN=0: no scaling past training). The split: toy shards (two, and
their byte sidecars) of SPLIT_TOKENS tokens, read by the field's load_validation_tokens and
load_validation_byte_sidecar with its settings from the same EVAL_SEQ_LEN and EVAL_INCLUDE_TAIL, and by our
load_validation: the same tokens and byte counts, the same documents (the field's _find_docs against our
document_spans), and our score() in plain and sliding windows counts the field's targets and bytes. The one
named difference, EVAL_INCLUDE_TAIL unset (the field keeps the tail, we cut), is counted apart.
Exit status 1 on any other difference.
"""

import argparse
import ast
import importlib.util
import inspect
import itertools
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType, SimpleNamespace

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))
import build_trainer  # noqa: E402
from data.shards import write_datafile  # noqa: E402

PROJECTIONS = dict(q="q", k="k", v="v", o="attn_out", mlp="mlp_out")  # the field's switch name: our target
LONGEST = range(1, 4097)
CHUNK_SETTINGS = dict(  # each combination of these is one comparison over LONGEST
    TTT_SHORT_SCORE_FIRST_ENABLED=["0", "1"],
    TTT_SHORT_SCORE_FIRST_STEPS=["", "256:8,2000:24", "2000:24, 256:8", "256=8", "100:6,100:4"],
    TTT_SHORT_DOC_LEN=["512", "2000"],
    TTT_SHORT_CHUNK_SIZE=[None, "0", "24", "64"],
    TTT_CHUNK_SIZE=["48", "32"],
)

WINDOW_LENGTHS = (2048, 2560, 3072)  # TTT_EVAL_SEQ_LEN: #2135's 2560 after training at 2048, #2014's 3072
WINDOW_CHUNKS = (48, 24, 8)
# documents' targets: every count to 600, then a stride through 8,192, and each length's edges
WINDOW_DOCS = sorted(set(range(1, 600)) | set(range(600, 8193, 37))
                     | {k * n + d for n in WINDOW_LENGTHS for k in (1, 2) for d in (-1, 0, 1)})
SPLIT_TOKENS = (3 * 2560 + 1, 3 * 2560 + 2, 3 * 3072 + 700, 4 * 2048 + 2047)  # N: N - 1 targets
FIELD_2135 = dict(TRAIN_SEQ_LEN="2048", ROPE_DIMS="16", ROPE_BASE="10000", ROPE_YARN="0")


def frontier():
    """The built frontier (tools/build_trainer.py) imported from a temporary folder: no settings.py beside it."""
    script = Path(tempfile.mkdtemp(prefix="field_conformance_")) / "train_gpt.py"
    script.write_bytes(build_trainer.build(build_trainer.Tree(ROOT)))
    spec = importlib.util.spec_from_file_location("train_gpt_frontier", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class Field:
    """The parts of a field train_gpt.py this bench runs, found by name in its syntax tree."""

    def __init__(self, folder: Path):
        self.path = folder / "train_gpt.py" if folder.is_dir() else folder
        if not self.path.is_file():
            sys.exit(f"--field {folder}: no train_gpt.py there; name a record folder of openai/parameter-golf")
        self.text = self.path.read_text()
        tree = ast.parse(self.text)
        self.nodes, self.code = {}, {}  # each class and function (nested ones too) by name; compiled, once used
        for node in ast.walk(tree):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                self.nodes.setdefault(node.name, node)
        self.imported = {}  # what the top-level imports bind, of the modules this machine has (not Triton, FA3)
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                try:
                    exec(compile(ast.Module([node], []), str(self.path), "exec"), self.imported)
                except ImportError:
                    pass

    def has(self, *names):
        return all(name in self.nodes for name in names)

    def define(self, namespace: dict, *names) -> dict:
        """Run the definitions of these names in namespace, over the file's imports."""
        namespace = self.imported | namespace
        for name in names:
            if name not in self.code:  # its source alone, dedented
                source = inspect.cleandoc("\n" + ast.get_source_segment(self.text, self.nodes[name], padded=True))
                self.code[name] = compile(source, str(self.path), "exec")
            exec(self.code[name], namespace)
        return namespace

    def settings(self, environ: dict):
        """The field's Hyperparameters as this environment makes them (its class body reads os.environ)."""
        fake_os = ModuleType("os")
        fake_os.__dict__.update(vars(os), environ=environ)
        return self.define(dict(os=fake_os), "Hyperparameters")["Hyperparameters"]()


def ours(module, environ):
    """Our Hyperparameters from this environment, or the refusal's text."""
    try:
        return module.Hyperparameters.from_env(environ)
    except module.STOPS + (ValueError,) as error:
        return f"refused: {error}"


def field_adapters(field: Field, h) -> set:
    """The adapters the field's BatchedTTTLoRA makes with these settings, on a stand-in model of two layers."""
    namespace = field.define({}, "BatchedLinearLoRA", "BatchedTTTLoRA")
    cls = namespace["BatchedTTTLoRA"]
    attn = SimpleNamespace(num_heads=4, num_kv_heads=2)
    model = SimpleNamespace(qo_bank=torch.zeros(2, 16, 16), tok_emb=nn.Embedding(32, 16),
                            blocks=[SimpleNamespace(attn=attn)] * 2, looping_active=False)
    switches = [p.removesuffix("_lora") for p in inspect.signature(cls).parameters if p.endswith("_lora")]
    for switch in switches:  # the run passes each switch from its setting
        assert f"{switch}_lora=h.ttt_{switch}_lora" in field.text, (field.path, switch)
    lora = cls(2, model, 4, **{f"{s}_lora": getattr(h, f"ttt_{s}_lora") for s in switches})
    return {name.removesuffix("_loras").removesuffix("_lora") for name, child in lora.named_children()}


def compare_targets(field: Field, module) -> int:
    masks = ["", "all", "baseline_all", "no_q", "no_v", "no_qv"] if "TTT_MASK" in field.text else [""]
    switches = [s for s in PROJECTIONS if f'"TTT_{s.upper()}_LORA"' in field.text]
    same = known = wrong = 0
    for mask, values in itertools.product(masks, itertools.product([None, "0", "1"], repeat=len(switches))):
        environ = {f"TTT_{s.upper()}_LORA": v for s, v in zip(switches, values) if v is not None}
        environ |= {"TTT_MASK": mask} if mask else {}
        theirs = field_adapters(field, field.settings(environ))
        hp = ours(module, environ)
        mine = {"lm_head"} | {field_name for field_name, name in PROJECTIONS.items() if name in hp.lora_targets}
        if theirs == mine:
            same += 1
        elif all(environ.get(f"TTT_{s.upper()}_LORA") == "1" for s in theirs - mine) and not mine - theirs:
            known += 1  # an explicit 1 the mask overrides here (the diff's header says so)
        else:
            wrong += 1
            if wrong <= 5:
                print(f"  differs: {environ}: field {sorted(theirs)}, ours {sorted(mine)}")
    print(f"targets ({field.path}): {same} settings alike, {known} the named difference (an explicit 1 under a "
          f"mask), {wrong} other differences; switches read: {switches}, masks: {masks}")
    return wrong


def field_chunks(field: Field, h):
    """The field's _score_first_chunk_for_doc with these settings, as its TTT loop defines it."""
    namespace = field.define(dict(h=h, chunk_size=h.ttt_chunk_size), "_parse_short_score_first_steps")
    namespace["short_score_steps"] = namespace["_parse_short_score_first_steps"](h.ttt_short_score_first_steps)
    return field.define(namespace, "_score_first_chunk_for_doc")["_score_first_chunk_for_doc"]


def compare_chunks(field: Field, module) -> int:
    names = list(CHUNK_SETTINGS)
    same = wrong = 0
    for values in itertools.product(*CHUNK_SETTINGS.values()):
        environ = {name: v for name, v in zip(names, values) if v is not None}
        chunk_for = field_chunks(field, field.settings(environ))
        hp = ours(module, environ)
        theirs = [chunk_for(n) for n in LONGEST]
        mine = [hp.ttt_chunk(n) for n in LONGEST] if not isinstance(hp, str) else hp
        if theirs == mine:
            same += 1
            continue
        wrong += 1
        if isinstance(mine, str):
            print(f"  differs: {environ}: the field runs, ours is {mine}")
            continue
        first = next(n for n in LONGEST if theirs[n - 1] != mine[n - 1])
        print(f"  differs: {environ}: longest {first}: field {theirs[first - 1]}, ours {mine[first - 1]}")
    print(f"chunks ({field.path}): {same} of {same + wrong} setting combinations give the field's chunk for every "
          f"longest document of {LONGEST.start} to {LONGEST.stop - 1} tokens")
    return wrong


def compare_windows(field: Field, module) -> int:
    window_for = field.define({}, "_compute_chunk_window")["_compute_chunk_window"]
    # the documents end to end in a stream of their indices: a document of n targets is its BOS and n tokens
    lengths = torch.tensor(WINDOW_DOCS)
    starts = (torch.cumsum(lengths, 0) - lengths + 1).tolist()
    spans = [(a, a + n) for a, n in zip(starts, WINDOW_DOCS)]
    index = torch.arange(spans[-1][1] + 1)
    stream = module.Validation(index, index, 0)
    same = wrong = 0
    for length, chunk in itertools.product(WINDOW_LENGTHS, WINDOW_CHUNKS):
        for group in (spans[i:i + 64] for i in range(0, len(spans), 64)):  # as our groups: similar lengths
            longest = max(b - a for a, b in group)
            for lo in range(0, longest, chunk):
                ci = lo // chunk
                tokens, counted, _ = module.chunk_windows(stream, group, lo, chunk, length, len(group))
                width = window_for(ci, (ci + 1) * chunk, ci + 1, chunk, length)[1]
                for row, (a, b) in enumerate(group):
                    if lo >= b - a:
                        continue
                    targets = (counted[row] >= 0).nonzero().flatten()
                    first = int(tokens[row, 0])
                    ours = (first - (a - 1), int(counted[row, targets[-1]]) - first, int(targets[0]), len(targets))
                    theirs = window_for(ci, b - a, -(-(b - a) // chunk), chunk, length)
                    contiguous = bool((targets.diff() == 1).all())
                    if ours == tuple(theirs) and contiguous and tokens.size(1) - 1 == width:
                        same += 1
                        continue
                    wrong += 1
                    if wrong <= 5:
                        print(f"  differs: L={length} chunk={chunk} document of {b - a} targets, chunk {ci}: "
                              f"field {theirs} (width {width}), ours {ours} (width {tokens.size(1) - 1})")
    print(f"windows ({field.path}): {same} of {same + wrong} chunks get the field's window (TTT_EVAL_SEQ_LEN "
          f"{WINDOW_LENGTHS}, chunks {WINDOW_CHUNKS}, {len(WINDOW_DOCS)} documents of 1 to {max(WINDOW_DOCS)} "
          f"targets)")
    return wrong + compare_rope(field, module)


def compare_rope(field: Field, module) -> int:
    """RoPE's tables at each length: the field's Rotary, built as its model builds it, against ours."""
    h = field.settings(FIELD_2135)
    rotary = field.define({}, "Rotary")["Rotary"]
    wrong = 0
    for length in WINDOW_LENGTHS:
        # as the field's model builds it (head dim 64: 512 / 8)
        theirs = rotary(64, base=h.rope_base, train_seq_len=h.train_seq_len, rope_dims=h.rope_dims,
                        yarn=h.rope_yarn)
        cos, sin = theirs(length, torch.device("cpu"), torch.float32)  # (1, T, 1, rope_dims / 2)
        ours = module.rotary_cos_sin(length, h.rope_dims, h.rope_base)  # (1, 1, T, rope_dims / 2)
        equal = torch.equal(ours[0][0, 0], cos[0, :, 0]) and torch.equal(ours[1][0, 0], sin[0, :, 0])
        wrong += not equal
        print(f"rope ({field.path}): {length} positions, {h.rope_dims} dims, yarn {h.rope_yarn}: "
              f"{'the same tables, bit for bit' if equal else 'DIFFERENT tables'}")
    return wrong


class Unit(nn.Module):
    """A stand-in scorer: a loss of 1 for every target (score() counts them, and their bytes)."""

    def forward(self, x, y, reduction="none"):
        return torch.ones(y.numel(), dtype=torch.float64)


def toy_split(folder: Path, length: int) -> None:
    """Two validation shards of BOS-led documents, `length` tokens in all, and their byte sidecars, in folder."""
    g = torch.Generator().manual_seed(length)
    tokens = torch.randint(2, 8192, (length,), generator=g)
    tokens[torch.randperm(length, generator=g)[:length // 400]] = 1
    tokens[0] = 1
    counted = torch.randint(0, 9, (length,), generator=g)
    half = length // 2
    for name, values in (("fineweb_val_{:06d}.bin", tokens), ("fineweb_val_bytes_{:06d}.bin", counted)):
        for i, part in enumerate((values[:half], values[half:])):
            write_datafile(folder / name.format(i), part.tolist())


def compare_split(field: Field, module) -> int:
    namespace = field.define(dict(BOS_ID=1), "load_data_shard", "load_validation_tokens",
                             "load_validation_byte_sidecar", "_find_docs")
    tails = [None, "0", "1"] if "EVAL_INCLUDE_TAIL" in field.text else [None, "0"]
    same = known = wrong = 0
    for length, tail, tokens in itertools.product(WINDOW_LENGTHS, tails, SPLIT_TOKENS):
        folder = Path(tempfile.mkdtemp(prefix="field_split_"))
        toy_split(folder, tokens)
        environ = {"EVAL_SEQ_LEN": str(length)} | ({"EVAL_INCLUDE_TAIL": tail} if tail else {})
        h = field.settings(environ)
        pattern = str(folder / "fineweb_val_*.bin")
        kept = {"include_tail": h.eval_include_tail} if hasattr(h, "eval_include_tail") else {}
        theirs = namespace["load_validation_tokens"](pattern, h.eval_seq_len, **kept)
        sidecar = namespace["load_validation_byte_sidecar"](str(folder / "fineweb_val_bytes_*.bin"), h.eval_seq_len,
                                                             theirs.numel())
        docs = namespace["_find_docs"](theirs)
        ours_environ = dict(DATA_PATH=str(folder), TRAIN_SEQ_LEN="2048", EVAL_STRIDE="512", SIDECAR_BYTES="trust")
        hp = ours(module, environ | ours_environ)
        val = module.load_validation(hp, torch.ones(8192, dtype=torch.int64))
        spans = module.document_spans(val.tokens)
        counts = [module.score(Unit(), val, module.Layout(), *hp.windows(sliding)) for sliding in (False, True)]
        alike = (torch.equal(val.tokens.long(), theirs.long()) and torch.equal(val.bytes.long(), sidecar.long())
                 and spans == [(start + 1, start + n) for start, n in docs]
                 and all(c[1] == theirs.numel() - 1 and c[2] == sidecar[1:].sum() for c in counts))
        if alike:
            same += 1
        elif tail is None and val.tokens.numel() < theirs.numel():
            known += 1  # the field's default keeps the tail; ours cuts (the diff's header says so)
        else:
            wrong += 1
            if wrong <= 5:
                print(f"  differs: {environ}, {tokens} tokens: field {theirs.numel()} tokens, "
                      f"{len(docs)} documents; ours {val.tokens.numel()}, {len(spans)}")
    print(f"split ({field.path}): {same} setting combinations and splits alike (tokens, byte counts, documents, "
          f"targets and bytes scored), {known} the named difference (EVAL_INCLUDE_TAIL unset: the field keeps the "
          f"tail), {wrong} other differences; EVAL_SEQ_LEN {WINDOW_LENGTHS}, EVAL_INCLUDE_TAIL {tails}, splits of "
          f"{SPLIT_TOKENS} tokens")
    return wrong


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--field", type=Path, action="append", required=True,
                        help="a record folder of openai/parameter-golf (or its train_gpt.py); repeat for several")
    args = parser.parse_args(argv)
    module = frontier()
    wrong = 0
    for folder in args.field:
        field = Field(folder)
        if field.has("BatchedTTTLoRA", "BatchedLinearLoRA", "Hyperparameters"):
            wrong += compare_targets(field, module)
        if field.has("_score_first_chunk_for_doc", "_parse_short_score_first_steps"):
            wrong += compare_chunks(field, module)
        if field.has("_compute_chunk_window", "Rotary"):
            wrong += compare_windows(field, module)
        if field.has("load_validation_tokens", "load_validation_byte_sidecar", "load_data_shard", "_find_docs"):
            wrong += compare_split(field, module)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
