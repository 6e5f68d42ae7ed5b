"""The toy model family: tokenizer and matched DIFF / baseline configurations.

The tokenizer is a small byte-level BPE trained here, on text this module
generates, so nothing is downloaded. Digits are split one per token so that a
7-digit magic number is copied digit by digit. The same builders make the
shipped toy pair (see `train_toy.py`) and the random-init models that tests
use as a control.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")


def tokenizer_corpus(sentences: int = 4000, seed: int = 0) -> list[str]:
    """Filler, needles and questions in the shapes the tasks produce."""
    from evalsuite.tasks.kit.filler import builtin_sentences
    from evalsuite.tasks.needle.task import CITIES, INSTRUCTION, NEEDLE, question_for

    rng = random.Random(seed)
    stream = builtin_sentences(rng)
    lines = [" ".join(next(stream) for _ in range(8)) for _ in range(sentences // 8)]
    for city in CITIES:
        lines.append(NEEDLE.format(city=city, number=rng.randrange(10**6, 10**7)))
        lines.append(f"Question: {question_for([city, rng.choice(CITIES)])}\nAnswer: The magic number of {city} is")
    lines.append(INSTRUCTION)
    return lines


def build_tokenizer(vocab_size: int = 1024, seed: int = 0) -> Any:
    """A fresh byte-level BPE tokenizer (a transformers fast tokenizer) that adds <bos>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(tokenizer_corpus(seed=seed), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    assert tok.token_to_id("<bos>") == 1, "special token ids are fixed by their order"
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


@dataclass(frozen=True)
class ToySize:
    hidden: int = 128
    layers: int = 4
    heads: int = 4  # baseline heads; DiffLlama counts component heads, so the DIFF model has heads/2;
    # DIFF V2 keeps them as output heads, each of 2 query heads sharing one KV head
    intermediate: int = 384
    max_context: int = 8192


def toy_config(kind: str, vocab_size: int, size: ToySize = ToySize()) -> Any:
    """Matched configs: same hidden size, layers and num_attention_heads (so the same
    head_dim d); DiffLlama then has heads/2 differential heads with Q/K halves of width
    d and values of width 2d, as in the paper. Parameter counts differ only by the lambdas.

    DIFF V2 (`diff2`) is matched as its authors match it (the DIFF V2 README, microsoft/unilm
    `Diff-Transformer/Diff-Transformer-V2/README.md`): the baseline's h heads become the h output
    heads, so 2h query heads of the baseline's width d; the baseline's h KV heads are kept, so
    the two heads of a pair lie in one GQA group and share key and value; o_proj is the
    baseline's (h*d inputs). The extra parameters are the h more query heads and lambda_proj."""
    from transformers import DiffLlamaConfig, LlamaConfig

    from evalsuite.modeling.diffllama_v2 import DiffLlamaV2Config

    common: dict[str, Any] = dict(
        vocab_size=vocab_size, hidden_size=size.hidden, intermediate_size=size.intermediate,
        num_hidden_layers=size.layers, num_attention_heads=size.heads, num_key_value_heads=size.heads,
        max_position_embeddings=size.max_context, rope_theta=10000.0, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    if kind == "diff":
        return DiffLlamaConfig(**common)
    if kind == "base":
        return LlamaConfig(**common)
    if kind == "diff2":
        return DiffLlamaV2Config(**common, head_dim=size.hidden // size.heads)
    raise ValueError(f"toy kind must be diff, diff2 or base, got {kind!r}")


def random_model(kind: str, vocab_size: int, size: ToySize = ToySize(), seed: int = 0) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(toy_config(kind, vocab_size, size))


def save_random_model(kind: str, folder: Path, tokenizer: Any, size: ToySize = ToySize(), seed: int = 0) -> Path:
    """A randomly initialised toy model saved as an ordinary HF folder (tests, controls)."""
    model = random_model(kind, len(tokenizer), size, seed)
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
