"""Text utilities: a byte-pair-encoding tokenizer trained on a fixed corpus."""

from __future__ import annotations

from collections import Counter

CORPUS = ("the quick brown fox jumps over the lazy dog " * 8
          + "training small language models on tiny corpora is a test of patience " * 6)


def pairs(tokens: list[str]) -> Counter[tuple[str, str]]:
    return Counter(zip(tokens, tokens[1:]))


def merge(tokens: list[str], pair: tuple[str, str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(tokens):
        if i + 1 < len(tokens) and (tokens[i], tokens[i + 1]) == pair:
            out.append(tokens[i] + tokens[i + 1])
            i += 2
        else:
            out.append(tokens[i])
            i += 1
    return out


def train_bpe(text: str, merges: int) -> list[tuple[str, str]]:
    tokens = list(text)
    learned = []
    for _ in range(merges):
        counts = pairs(tokens)
        if not counts:
            break
        best = max(counts, key=lambda p: (counts[p], p))
        learned.append(best)
        tokens = merge(tokens, best)
    return learned


def encode(text: str, learned: list[tuple[str, str]]) -> list[str]:
    tokens = list(text)
    for pair in learned:
        tokens = merge(tokens, pair)
    return tokens
