"""Write the small synthetic data files that the `ci-smoke` suite ships with.

    python -m evalsuite.suites.smoke_data          # rewrites evalsuite/suites/data/

The smoke suite must run offline in minutes, so its ICL and zero-shot entries
read these generated files instead of the hub datasets. They exercise the full
pipeline (prompts, constrained decoding, lm-eval's HellaSwag definition) and
give the CI gate paired per-sample outcomes; they are not benchmarks, and no
accuracy on them says anything about the paper's numbers.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DATA = Path(__file__).parent / "data"  # beside this script: evalsuite/suites/data

# TREC-like coarse question classes, each with question templates and fillers
QUESTION_CLASSES = {
    "location": ["Where is the {place} of {town}?", "Which country is {town} in?", "Where can I find a {thing}?"],
    "number": ["How many {thing}s are in a {place}?", "When was the {place} of {town} built?",
               "How far is {town} from the sea?"],
    "person": ["Who built the {place} of {town}?", "Who invented the {thing}?", "Who was the first mayor of {town}?"],
    "description": ["What is a {thing}?", "Why is the {place} of {town} famous?", "How does a {thing} work?"],
    "entity": ["What {thing} is used in the {place}?", "Which animal lives near the {place}?",
               "What colour is the {thing} of {town}?"],
    "abbreviation": ["What does {abbr} stand for?", "What is the abbreviation for the {place} of {town}?",
                     "What is {abbr} short for?"],
}
FILLERS = {
    "place": ["harbour", "market", "bridge", "cathedral", "library", "museum", "station", "castle"],
    "town": ["Arden", "Belmont", "Corrin", "Dunmore", "Elswick", "Farley", "Glenrock", "Hollins"],
    "thing": ["lantern", "compass", "telescope", "loom", "windmill", "kettle", "barometer", "sextant"],
    "abbr": ["NATO", "UNESCO", "RAM", "GPS", "DNA", "NASA", "ISBN", "HTML"],
}

# HellaSwag-shaped items: a context and four endings, the first one right before shuffling
STORIES = [
    ("Baking bread", "The baker kneads the dough on the table.", "She", "places it in the hot oven to bake.",
     ["swims across the river with it.", "paints the dough bright blue.", "sings to the empty street."]),
    ("Washing a car", "A man sprays water over a dusty car.", "He", "scrubs the doors with a soapy sponge.",
     ["eats the steering wheel.", "plants a tree on the roof.", "reads the tyres a story."]),
    ("Planting a tree", "A girl digs a hole in the garden.", "She", "sets the young tree in it and adds soil.",
     ["fills it with orange juice.", "flies over the fence.", "knits a scarf for the hole."]),
    ("Fishing", "An old sailor sits at the end of the pier with a rod.", "He", "casts the line into the water.",
     ["throws the pier into the sea.", "cooks the rod for dinner.", "paints the clouds green."]),
    ("Making tea", "A woman fills the kettle and switches it on.", "She", "pours the hot water over the tea leaves.",
     ["wears the kettle as a hat.", "mails the tea to the moon.", "builds a wall of cups."]),
    ("Riding a bike", "A boy puts on his helmet beside his bike.", "He", "climbs on and pedals down the road.",
     ["folds the bike into a letter.", "swallows the helmet whole.", "rides the road up to the sky."]),
    ("Cleaning windows", "A cleaner climbs a ladder to a dirty window.", "He", "wipes the glass until it shines.",
     ["eats the ladder slowly.", "turns the window into a fish.", "sleeps on the glass."]),
    ("Reading", "A student opens a heavy book at the library.", "She", "reads the first page carefully.",
     ["throws the library into a lake.", "cooks the book in a pan.", "dances on the ceiling."]),
    ("Painting a fence", "A man opens a can of white paint by the fence.", "He", "brushes paint along each board.",
     ["drinks the paint with a straw.", "mails the fence to his aunt.", "hides the sun in the can."]),
    ("Walking a dog", "A woman clips a lead to her dog's collar.", "They", "walk together along the path.",
     ["fly to the moon in a cup.", "turn into two chairs.", "swim through the pavement."]),
]


def icl_rows(seed: int = 0, per_class_train: int = 30, per_class_test: int = 7) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for label, templates in QUESTION_CLASSES.items():
        seen: set[str] = set()
        while len(seen) < per_class_train + per_class_test:
            template = rng.choice(templates)
            seen.add(template.format(**{k: rng.choice(v) for k, v in FILLERS.items()}))
        texts = sorted(seen)
        rng.shuffle(texts)
        rows += [{"text": t, "label": label, "split": "train"} for t in texts[:per_class_train]]
        rows += [{"text": t, "label": label, "split": "test"} for t in texts[per_class_train:]]
    rng.shuffle(rows)
    return rows


def hellaswag_rows(seed: int = 0, count: int = 20) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        activity, ctx_a, ctx_b, right, wrong = STORIES[i % len(STORIES)]
        endings = [right] + list(wrong)
        order = list(range(4))
        rng.shuffle(order)
        rows.append({"ind": i, "activity_label": activity, "ctx_a": ctx_a, "ctx_b": ctx_b,
                     "ctx": f"{ctx_a} {ctx_b}", "endings": [endings[j] for j in order],
                     "label": str(order.index(0)), "split": "validation", "split_type": "indomain",
                     "source_id": f"smoke-{i}"})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows), encoding="utf-8")


def main() -> None:
    write_jsonl(DATA / "icl-smoke.jsonl", icl_rows())
    write_jsonl(DATA / "zeroshot" / "hellaswag.jsonl", hellaswag_rows())
    print(f"wrote {DATA}")


if __name__ == "__main__":
    main()
