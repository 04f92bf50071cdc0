"""Byte-level BPE tokenizer trained with `tokenizers` on the training split of the corpus."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from nwor_lab.train.corpus import EOT, read


def train_tokenizer(files: list[Path], vocab_size: int = 4096) -> Tokenizer:
    """`<|endoftext|>` gets id 0; byte-level, so any text round-trips."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((read(p) for p in files), trainer=trainer, length=len(files))
    return tok
