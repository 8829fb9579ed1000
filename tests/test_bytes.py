"""val_bpb's bytes for any SentencePiece model: for each option that changes how spaces and bytes are
written, a tokenizer is trained here and the bytes train_gpt.py counts for every document must equal
the UTF-8 bytes of the document's text; what it cannot count exactly it refuses before training."""

import pytest
import torch

import train_gpt as tg
from conftest import sotu_speeches

# each document is already in the form the tokenizer's normalizer leaves it, so its bytes are the truth
PLAIN = ["Fellow citizens, the state of the Union is strong.", "Crème brûlée costs 12 €; 東京 is far 🚀.",
         "Numbers: 3141592653, 1.5e-3", "a"]
RAW_SPACES = [" leading space", "trailing space ", "two  spaces and\ta tab", "   ", "line\nbreak  "]

OPTIONS = {
    "bpe, dummy prefix": dict(),
    "unigram": dict(model_type="unigram"),
    "no dummy prefix, spaces kept": dict(add_dummy_prefix=False, remove_extra_whitespaces=False),
    "dummy prefix, spaces kept": dict(remove_extra_whitespaces=False),
    "pieces across words": dict(split_by_whitespace=False),
    "whitespace-only pieces": dict(allow_whitespace_only_pieces=True, remove_extra_whitespaces=False),
    "user-defined symbols": dict(user_defined_symbols=["<sep>", "\u2581the\u2581"]),
}
KEEPS_SPACES = {name for name, o in OPTIONS.items() if o.get("remove_extra_whitespaces") is False}
# retired, refused at startup: a space added after each document (treat_whitespace_as_suffix: its decoder keeps it,
# so the bytes alone would agree; load_tokenizer refuses the option), and a space written as the byte pieces E2 96 81
# (counted 3, decoded 1: the byte check names the document)
SUFFIX = r"TOKENIZER_PATH=.*tok.model adds a space after every document \(treat_whitespace_as_suffix\)"
REFUSED = {
    "whitespace as suffix": (dict(treat_whitespace_as_suffix=True), SUFFIX),
    "suffix, spaces kept": (dict(treat_whitespace_as_suffix=True, remove_extra_whitespaces=False), SUFFIX),
    "no standalone space piece": (dict(control_symbols=["\u2581"]),
                                  r"test: document \d+ .* decodes to \d+ bytes but the byte tables count \d+"),
    "no space piece, suffix": (dict(control_symbols=["\u2581"], treat_whitespace_as_suffix=True), SUFFIX),
}


@pytest.fixture(scope="module")
def corpus():
    return [p.read_text(encoding="utf-8") for p in sotu_speeches()[230:233]]


def train_tokenizer(path, corpus, **options):
    import sentencepiece as spm

    settings = dict(model_type="bpe", vocab_size=400, byte_fallback=True, normalization_rule_name="identity", character_coverage=0.995,
                    pad_id=0, bos_id=1, eos_id=2, unk_id=3, num_threads=1, minloglevel=2, max_sentence_length=65536)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(line for doc in corpus for line in doc.splitlines()),
                                   model_prefix=str(path), **{**settings, **options})
    return tg.load_tokenizer(f"{path}.model", spm.SentencePieceProcessor(model_file=f"{path}.model").vocab_size())


def stream(tok, docs):
    ids = [t for doc in docs for t in [tg.BOS_ID] + tok.encode(doc)]
    return torch.tensor(ids)


def per_document(tokens, counted):
    starts = (tokens == tg.BOS_ID).nonzero().flatten().tolist() + [len(tokens)]
    return [int(counted[a + 1:b].sum()) for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("name", OPTIONS)
def test_bytes_equal_the_text_for_every_option(tmp_path, corpus, name):
    tok = train_tokenizer(tmp_path / "tok", corpus, **OPTIONS[name])
    docs = [corpus[0][:3000], corpus[1][-2000:]] + PLAIN + (RAW_SPACES if name in KEEPS_SPACES else [])
    for doc in docs:  # the premise: each document survives the tokenizer unchanged
        assert tok.decode(tok.encode(doc)).replace("\u2581", " ").strip(" ") == doc.strip(" "), (name, doc)
    tokens = stream(tok, docs)
    counted = tg.token_bytes(tokens, tok)
    assert per_document(tokens, counted) == [len(doc.encode("utf-8")) for doc in docs], name
    assert (counted >= 0).all()
    tg.check_token_bytes(tokens, counted, tok, "test")  # the startup check agrees


@pytest.mark.parametrize("name", REFUSED)
def test_retired_options_are_refused_at_startup(tmp_path, corpus, name):
    options, message = REFUSED[name]
    with pytest.raises(tg.ConfigError, match=message):
        tok = train_tokenizer(tmp_path / "tok", corpus, **options)
        docs = [corpus[0][:3000], corpus[1][-2000:]] + PLAIN
        tokens = stream(tok, docs)
        tg.check_token_bytes(tokens, tg.token_bytes(tokens, tok), tok, "test")


def test_options_exercise_what_they_claim(tmp_path, corpus):
    """The refused vocabulary really writes spaces as bytes: its decoder keeps their symbol."""
    no_space = train_tokenizer(tmp_path / "a", corpus, control_symbols=["\u2581"])
    assert no_space.dummy_prefix
    assert no_space.decode(no_space.encode("a b")) == "\u2581a\u2581b", "the decoder keeps the bytes' symbol"


def test_the_check_refuses_tables_that_miscount(tmp_path, corpus):
    tok = train_tokenizer(tmp_path / "tok", corpus)
    tokens = stream(tok, PLAIN)
    tok.leading_space[:] = False  # forget that the added space starts the first piece of a document
    with pytest.raises(tg.ConfigError, match=r"test: document 0 .* decodes to 50 bytes but the byte tables count 51"):
        tg.check_token_bytes(tokens, tg.token_bytes(tokens, tok), tok, "test")


def test_unknown_tokens_are_refused(tmp_path, corpus):
    tok = train_tokenizer(tmp_path / "tok", corpus, byte_fallback=False)
    tokens = stream(tok, PLAIN)
    assert (tok.piece_bytes[tokens] < 0).any(), "CJK and emoji are not in this vocabulary"
    with pytest.raises(tg.ConfigError, match=r"test: token \d+ is <unk>.*byte_fallback=True"):
        tg.check_token_bytes(tokens, tg.token_bytes(tokens, tok), tok, "test")


def test_ranks_share_the_documents(tmp_path, corpus):
    """Each of 3 ranks decodes every third document; together they check them all, and each miscount is
    found by the rank that owns its document."""
    tok = train_tokenizer(tmp_path / "tok", corpus)
    docs = [corpus[0][i:i + 300].strip() for i in range(0, 3000, 300)]
    tokens = stream(tok, docs)
    counted = tg.token_bytes(tokens, tok)
    bos = (tokens == tg.BOS_ID).nonzero().flatten()
    counted[bos[4] + 1] += 1  # document 4 miscounted
    for rank in range(3):
        if rank == 4 % 3:
            with pytest.raises(tg.ConfigError, match="document 4 "):
                tg.check_token_bytes(tokens, counted, tok, "test", (rank, 3))
        else:
            tg.check_token_bytes(tokens, counted, tok, "test", (rank, 3))
