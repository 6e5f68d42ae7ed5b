"""Train the built-in toy pair: `toy-diff` (DiffLlama) and `toy-base` (Llama).

    python -m evalsuite.models.train_toy                      # both, into evalsuite/models/
    python -m evalsuite.models.train_toy --steps 30 --out /tmp/toy --kinds diff   # a quick look

What the models learn is retrieval. Every training sequence is `seq_len` (1024)
tokens of needle-task episodes, each prompt built by the needle task's own
builder (`Needle.requests`), so training text has exactly the format the
models are evaluated on: instruction, generated filler with several "The magic
number of <city> is <n>." needles, the question and "Answer: The magic number
of <city> is". Each episode continues with the answer and then asks about
every other needle of the same haystack (dense supervision).

Choices that make retrieval learnable on a CPU budget (the shipped pair took
68 min (Llama) and 104 min (DiffLlama) on one core each; docs/toy-models.md):
- a curriculum: early sequences pack several short episodes, later ones hold
  episodes up to the full length; packed episodes use disjoint cities, so a
  question is never ambiguous;
- next-token loss over the whole sequence, answer digits weighted 1 and every
  other token `text_weight` (0.02);
- AdamW with linear warmup then cosine decay, gradient clipping.

Both models see identical sequences (the data depends only on `data_seed`, the
step and the row) and the same schedule; initial weights come from `seed`.
Data seeds start at 1000, far from the evaluation seeds (0, 1, ...).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError
from evalsuite.modeling import compat
from evalsuite.tasks.needle.task import ANSWER_PREFIX, CITIES, Needle, question_for
from evalsuite.types import Sample

from .toy import ToySize, build_tokenizer, random_model

HERE = Path(__file__).parent
FOLDER_NAMES = {"diff": "toy-diff", "base": "toy-base", "diff2": "toy-diff2"}


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0  # initial weights
    data_seed: int = 1000  # training text; evaluation uses seeds 0, 1, ...
    steps: int = 2000
    batch: int = 8
    seq_len: int = 1024
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 60
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    text_weight: float = 0.02  # loss weight of every token but the answer digits (which weigh 1)
    min_episode: int = 80
    short_episode: int = 160  # longest episode at the start of the curriculum
    ramp_from: float = 0.25  # fraction of training spent on short episodes only
    ramp_until: float = 0.75  # fraction of training after which episodes reach seq_len and max_needles
    max_needles: int = 4
    single_needle_share: float = 0.6  # episodes with one needle, as in single-needle evaluation
    threads: int = 2
    size: ToySize = field(default_factory=ToySize)


# ---- data ------------------------------------------------------------------------------------


class TokenCounter:
    """Just enough of a model adapter for the needle task to build prompts."""

    name = "toy-training"
    chat_template = False

    def __init__(self, tokenizer: Any, max_context: int):
        self.tokenizer = tokenizer
        self.max_context = max_context

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text)["input_ids"])  # BOS included, as the hf backend counts

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        return user + assistant_prefix


def completion(cities: list[str], numbers: list[str], queries: int, rng: random.Random) -> str:
    """The answer to the episode's question, then one question and answer per other needle."""
    first = [numbers[0]] + [ANSWER_PREFIX.format(city=c) + f" {x}" for c, x in zip(cities[1:queries], numbers[1:queries])]
    text = " " + ". ".join(first) + ".\n"
    rest = list(zip(cities[queries:], numbers[queries:]))
    rng.shuffle(rest)
    for city, number in rest:
        text += f"Question: {question_for([city])}\nAnswer: {ANSWER_PREFIX.format(city=city)} {number}.\n"
    return text


def episode(
    task: Needle, counter: TokenCounter, rng: random.Random, length: int, pool: list[str], needles: int
) -> tuple[str, str]:
    """(prompt, completion) of about `length` tokens together; the cities come out of `pool`."""
    needles = max(1, min(needles, length // 64, len(pool)))
    queries = 2 if needles >= 2 and rng.random() < 0.2 else 1
    cities = rng.sample(pool, needles)
    numbers = [str(n) for n in rng.sample(range(1_000_000, 10_000_000), needles)]
    answer = completion(cities, numbers, queries, rng)
    prompt_tokens = length - counter.count_tokens(answer)
    depth = rng.random()
    data = {"cities": cities, "numbers": numbers, "others": [rng.random() for _ in cities[1:]],
            "filler_seed": rng.randrange(2**31)}
    state = task.prepare(None)  # the built-in filler: nothing to load
    for target in range(prompt_tokens, prompt_tokens - 8, -1):
        # a short target is sometimes missed by a token (the task allows 1%): aim one lower
        # the task's length holds the prompt and its answer budget: ask for a prompt of `target`
        length = target + task.tokens_per_query * queries
        axes = {"n_needles": needles, "n_queries": queries, "context_length": length, "depth": depth}
        sample = Sample(id="train", task=task.name, axes=axes, target=tuple(numbers[:queries]), data=data)
        try:
            [request], _ = task.requests(sample, counter, state)  # type: ignore[arg-type]  # a tokenizer is all it needs
            break
        except UserError:
            continue
    else:
        raise AssertionError(f"no needle prompt of about {prompt_tokens} tokens")
    for city in cities:
        pool.remove(city)
    return request.prompt, answer


def encode(cfg: TrainConfig, tokenizer: Any, prompt: str, answer: str) -> tuple[list[int], list[float], list[bool]]:
    """Token ids of prompt + answer (BOS first), their loss weights, and which are answer digits."""
    enc = tokenizer(prompt + answer, return_offsets_mapping=True)
    spans = [(len(prompt) + m.start(), len(prompt) + m.end()) for m in re.finditer(r"\d+", answer)]
    digits = [e > s and any(a <= s < b for a, b in spans) for s, e in enc["offset_mapping"]]
    weights = [1.0 if digit else cfg.text_weight for digit in digits]
    return enc["input_ids"], weights, digits


def training_sequence(cfg: TrainConfig, tokenizer: Any, step: int, row: int) -> tuple[list, list, list, list]:
    """Sequence `row` of batch `step`: episodes packed to exactly `seq_len` tokens.

    Returns token ids, loss weights, position ids that restart at every episode (so
    attention stays inside an episode, as at evaluation, where each prompt is alone)
    and the answer-digit mask. Episodes are short and single-needle at first; their
    longest length and needle count grow from `ramp_from` to `ramp_until`.
    """
    rng = random.Random(f"{cfg.data_seed}:{step}:{row}")
    task = Needle(seed=cfg.data_seed)
    counter = TokenCounter(tokenizer, cfg.seq_len)
    progress = min(1.0, max(0.0, (step / cfg.steps - cfg.ramp_from) / (cfg.ramp_until - cfg.ramp_from)))
    longest = round(cfg.short_episode + (cfg.seq_len - cfg.short_episode) * progress)
    most_needles = 1 + round((cfg.max_needles - 1) * progress)
    pool = list(CITIES)
    columns: tuple[list, list, list, list] = ([], [], [], [])
    while len(columns[0]) < cfg.seq_len:
        room = cfg.seq_len - len(columns[0])
        length = rng.randint(cfg.min_episode, max(cfg.min_episode, longest))
        if room - length < cfg.min_episode:
            length = max(room, cfg.min_episode)  # fill the sequence; an overhang is cut below
        needles = 1 if rng.random() < cfg.single_needle_share else rng.randint(1, most_needles)
        prompt, answer = episode(task, counter, rng, length, pool, needles)
        ids, weights, digits = encode(cfg, tokenizer, prompt, answer)
        parts: tuple[Any, ...] = (ids, weights, range(len(ids)), digits)
        for column, values in zip(columns, parts):
            column.extend(values)
    ids, weights, positions, digits = (column[: cfg.seq_len] for column in columns)
    return ids, weights, positions, digits


def training_batch(cfg: TrainConfig, tokenizer: Any, step: int) -> tuple[Any, Any, Any, Any]:
    """(token ids, loss weights, position ids, answer-digit mask), each (batch, seq_len)."""
    import torch

    rows = [training_sequence(cfg, tokenizer, step, row) for row in range(cfg.batch)]
    dtypes = (torch.long, torch.float32, torch.long, torch.bool)
    ids, weights, positions, digits = (torch.tensor([r[i] for r in rows], dtype=dtype) for i, dtype in enumerate(dtypes))
    return ids, weights, positions, digits


# ---- training --------------------------------------------------------------------------------


def lr_at(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    done = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * done)))


def train(
    kind: str, cfg: TrainConfig, tokenizer: Any, log_every: int = 25, checkpoint: Callable[[Any, int], None] | None = None,
    checkpoint_every: int = 0,
) -> tuple[Any, dict[str, Any]]:
    """A trained toy model of `kind` (diff or base) and a summary of its training;
    `checkpoint(model, step)` is called every `checkpoint_every` steps when given."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(cfg.threads)
    model = random_model(kind, len(tokenizer), cfg.size, cfg.seed)
    compat.set_attention_implementation(model.config, "sdpa")
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    start = time.time()
    window: list[tuple[float, float, float]] = []
    for step in range(cfg.steps):
        ids, weights, positions, digit_mask = training_batch(cfg, tokenizer, step)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, step)
        # restarting position ids make transformers mask attention between packed episodes
        # (use_cache=False: transformers only reads packing from position ids without a cache)
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[:, :-1]
        targets, w = ids[:, 1:], weights[:, 1:]
        losses = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none")
        loss = (losses * w.reshape(-1)).sum() / w.sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        with torch.no_grad():
            digits = digit_mask[:, 1:]
            digit_loss = losses.view_as(w)[digits].mean().item()
            digit_acc = (logits.argmax(-1) == targets)[digits].float().mean().item()
        window.append((loss.item(), digit_loss, digit_acc))
        if (step + 1) % log_every == 0 or step + 1 == cfg.steps:
            means = [sum(v) / len(window) for v in zip(*window)]
            print(f"{kind} step {step + 1}/{cfg.steps} loss {means[0]:.3f} answer-digit loss {means[1]:.3f} "
                  f"answer-digit acc {means[2]:.3f} lr {lr_at(cfg, step):.2e} {time.time() - start:.0f}s", flush=True)
            window = []
        if checkpoint and checkpoint_every and (step + 1) % checkpoint_every == 0 and step + 1 < cfg.steps:
            checkpoint(model, step + 1)
    model.eval()
    summary = {"kind": kind, "architecture": type(model).__name__,
               "parameters": sum(p.numel() for p in model.parameters()),
               "wall_seconds": round(time.time() - start, 1), "final_answer_digit_accuracy": round(means[2], 4)}
    return model, summary


def save(model: Any, tokenizer: Any, folder: Path, cfg: TrainConfig, summary: dict[str, Any], command: str) -> None:
    """An ordinary HF folder, weights in float16 (small enough to ship), plus training.json."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    record = {"command": command, "config": asdict(cfg), **summary}
    (folder / "training.json").write_text(json.dumps(record, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m evalsuite.models.train_toy", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder that receives toy-diff/, toy-base/ and toy-diff2/")
    parser.add_argument("--kinds", default="diff,base", help="which models to train: diff, diff2, base, comma-separated")
    defaults = TrainConfig()
    for name in ("seed", "data_seed", "steps", "batch", "threads"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--checkpoint-every", type=int, default=0, help="also save <out>/checkpoints/<name>-step<N>")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    if not kinds or any(k not in FOLDER_NAMES for k in kinds):
        parser.error("--kinds takes diff, diff2 and base, comma-separated")
    cfg = TrainConfig(seed=args.seed, data_seed=args.data_seed, steps=args.steps, batch=args.batch,
                      threads=args.threads, lr=args.lr)
    command = "python -m evalsuite.models.train_toy " + " ".join(sys.argv[1:] if argv is None else argv)
    tokenizer = build_tokenizer()
    for kind in kinds:
        name = FOLDER_NAMES[kind]

        def checkpoint(model: Any, step: int, name: str = name) -> None:
            model.save_pretrained(args.out / "checkpoints" / f"{name}-step{step}")
            tokenizer.save_pretrained(args.out / "checkpoints" / f"{name}-step{step}")

        model, summary = train(kind, cfg, tokenizer, checkpoint=checkpoint, checkpoint_every=args.checkpoint_every)
        save(model, tokenizer, args.out / FOLDER_NAMES[kind], cfg, summary, command.strip())
        print(f"saved {args.out / FOLDER_NAMES[kind]} ({summary['wall_seconds']}s)", flush=True)


if __name__ == "__main__":
    main()
