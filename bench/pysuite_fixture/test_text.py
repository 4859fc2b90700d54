import pytest

from pysuite.text import CORPUS, encode, train_bpe


@pytest.mark.parametrize("merges", [20, 40, 60, 80])
def test_bpe_round_trips(merges):
    learned = train_bpe(CORPUS, merges)
    assert "".join(encode(CORPUS, learned)) == CORPUS
    assert len(encode(CORPUS, learned)) < len(CORPUS)


def test_merges_are_deterministic():
    assert train_bpe(CORPUS, 30) == train_bpe(CORPUS, 30)
