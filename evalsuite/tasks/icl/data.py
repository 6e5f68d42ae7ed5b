"""Classification data for many-shot in-context learning (the `icl` task).

Two sources, one result (`IclData`: a demonstration pool, test candidates,
readable label names and the prompt's field names):

- a named dataset from the Hugging Face hub (`trec`, `trec-fine`,
  `banking77`, `clinic150`); train split for demonstrations, test split for
  questions;
- a local jsonl, csv or parquet file, or a folder of them (`-T data=PATH`). A
  `split` column with `train` and `test` rows chooses the two sets; without
  one, a seeded shuffle holds out min(test_size, rows // 2) rows as the test
  set and the rest is the demonstration pool. A `cluster` column declares
  which questions share order effects (a topic, a source document); the order
  statistics then cluster by it instead of by the label (docs/statistics.md).

Both are read by the task kit's loader (`kit.data.load_table`, on
`datasets.load_dataset`). Texts are collapsed onto one line (a demonstration
is exactly two lines). Hub labels are mapped to readable strings; local labels
are used as written.

Then the seeded choices made from the loaded data: the test questions
(`test_sample`), the label-balanced demonstration pool (`balanced_pool`) and
the order of one demonstration block (`arrange`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsuite.errors import UserError
from evalsuite.tasks.kit.data import Hub, load_table, require_columns


@dataclass(frozen=True)
class Example:
    index: int  # row number in its split: keeps sample ids stable
    text: str
    label: str
    cluster: str | None = None  # a local file's `cluster` column: questions that share order effects


@dataclass(frozen=True)
class IclData:
    name: str
    train: tuple[Example, ...]  # the demonstration pool
    test: tuple[Example, ...]  # candidates for the seeded test sample
    labels: tuple[str, ...]  # readable names, in class order
    fields: tuple[str, str]  # ("Question", "Type"): the two lines of a demonstration
    split_rule: str  # how train and test were chosen, for the record


# ---- readable labels ------------------------------------------------------------------------

TREC_COARSE = {"ABBR": "abbreviation", "ENTY": "entity", "DESC": "description", "HUM": "human",
               "LOC": "location", "NUM": "number"}
TREC_FINE = {"abb": "abbreviation", "exp": "expression", "cremat": "creative work", "dismed": "disease",
             "instru": "instrument", "lang": "language", "techmeth": "technique", "termeq": "equivalent term",
             "veh": "vehicle", "def": "definition", "desc": "description", "gr": "group", "ind": "individual",
             "mount": "mountain", "dist": "distance", "ord": "rank", "perc": "percentage", "temp": "temperature",
             "volsize": "size"}


def trec_readable(name: str) -> str:
    """'LOC' -> 'location'; 'NUM:dist' -> 'number distance'."""
    coarse, _, fine = name.partition(":")
    head = TREC_COARSE.get(coarse, coarse.lower())
    return f"{head} {TREC_FINE.get(fine, fine)}" if fine else head


def words_readable(name: str) -> str:
    """'activate_my_card' -> 'activate my card'."""
    return " ".join(name.replace("_", " ").split())


@dataclass(frozen=True)
class HubDataset:
    path: str
    text_field: str
    label_field: str
    fields: tuple[str, str]
    readable: Callable[[str], str]
    config: str | None = None
    drop_labels: tuple[str, ...] = ()  # e.g. clinc's out-of-scope class: 150 intents remain
    # the hub's parquet export: loads without the datasets' old loading scripts
    revision: str = "refs/convert/parquet"


HUB_DATASETS = {
    "trec": HubDataset("CogComp/trec", "text", "coarse_label", ("Question", "Type"), trec_readable),
    "trec-fine": HubDataset("CogComp/trec", "text", "fine_label", ("Question", "Type"), trec_readable),
    "banking77": HubDataset("PolyAI/banking77", "text", "label", ("Query", "Intent"), words_readable),
    "clinic150": HubDataset("clinc/clinc_oos", "text", "intent", ("Utterance", "Intent"), words_readable,
                            config="plus", drop_labels=("oos",)),
}
LOCAL_FIELDS = ("Question", "Type")


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


# ---- loading --------------------------------------------------------------------------------

def load_icl_data(dataset: str, data: str, text_field: str, label_field: str, test_size: int, seed: int
                  ) -> IclData:
    data_set = load_local(data, text_field, label_field, test_size, seed) if data else load_hub(dataset)
    if len(data_set.labels) < 2:
        found = f" ({data_set.labels[0]!r})" if data_set.labels else ""
        raise UserError(f"{data_set.name} has {len(data_set.labels)} class{found}; in-context classification "
                        f"needs at least 2 labels")
    if not data_set.train or not data_set.test:
        raise UserError(f"{data_set.name} has {len(data_set.train)} train and {len(data_set.test)} test rows; "
                        f"both must be non-empty")
    return data_set


def load_hub(name: str) -> IclData:
    spec = HUB_DATASETS[name]
    splits = load_table(Hub(spec.path, spec.config, split=None, revision=spec.revision), f"dataset {name}",
                        advice="use -T data=PATH for a local copy")
    names = splits["train"].features[spec.label_field].names
    readable = [spec.readable(n) for n in names if n not in spec.drop_labels]
    parts = {}
    for split in ("train", "test"):
        table = splits[split]
        parts[split] = tuple(
            Example(i, one_line(text), spec.readable(names[label]))
            for i, (text, label) in enumerate(zip(table[spec.text_field], table[spec.label_field]))
            if names[label] not in spec.drop_labels
        )
    return IclData(name, parts["train"], parts["test"], tuple(readable), spec.fields,
                   f"hub {spec.path} train/test splits")


def load_local(path_text: str, text_field: str, label_field: str, test_size: int, seed: int) -> IclData:
    table = load_table(path_text, "-T data")
    require_columns(table, (("text", text_field), ("label", label_field)), path_text, hint="set -T {role}_field=NAME")
    label_feature = table.features[label_field]
    names = getattr(label_feature, "names", None)
    rows = []
    splits = table["split"] if "split" in table.column_names else [None] * len(table)
    clusters = table["cluster"] if "cluster" in table.column_names else [None] * len(table)
    for text, label, split, cluster in zip(table[text_field], table[label_field], splits, clusters):
        if text is None or label is None or not str(text).strip() or not str(label).strip():
            continue  # an empty cell cannot make a demonstration
        readable = names[label] if names else one_line(label)
        rows.append((one_line(text), readable, split, None if cluster is None else one_line(cluster)))
    if not rows:
        raise UserError(f"{path_text} has no rows with both {text_field!r} and {label_field!r} filled in")
    labels = tuple(names) if names else tuple(sorted({r[1] for r in rows}))
    name = f"local:{Path(path_text).expanduser().name}"
    if "split" in table.column_names:
        train, test = _by_split_column(rows, path_text)
        rule = "split column"
    else:
        train, test = _held_out(rows, test_size, seed)
        rule = f"seeded hold-out of {len(test)} rows (seed {seed})"
    return IclData(name, train, test, labels, LOCAL_FIELDS, rule)


Row = tuple[str, str, Any, Any]  # text, label, split, cluster (None: not declared)


def _by_split_column(rows: list[Row], path_text: str) -> tuple[tuple[Example, ...], ...]:
    parts: dict[str, list[Example]] = {"train": [], "test": []}
    for text, label, split, cluster in rows:
        key = str(split).strip().lower()
        if key in parts:
            parts[key].append(Example(len(parts[key]), text, label, cluster))
    if not parts["train"] or not parts["test"]:
        raise UserError(f"{path_text}: the split column needs both 'train' and 'test' rows "
                        f"(found {len(parts['train'])} train, {len(parts['test'])} test)")
    return tuple(parts["train"]), tuple(parts["test"])


def _held_out(rows: list[Row], test_size: int, seed: int) -> tuple[tuple[Example, ...], ...]:
    order = list(range(len(rows)))
    random.Random(f"icl-split-{seed}").shuffle(order)
    held = set(order[: min(test_size, len(rows) // 2)])
    train = [Example(i, rows[i][0], rows[i][1], rows[i][3]) for i in range(len(rows)) if i not in held]
    test = [Example(i, rows[i][0], rows[i][1], rows[i][3]) for i in sorted(held)]
    return tuple(train), tuple(test)


# ---- seeded choices from the loaded data --------------------------------------------------------

def test_sample(test: Sequence[Example], size: int, seed: int) -> list[Example]:
    """The test questions: the whole test split when it holds at most `size`, else a seeded
    sample of `size`, in split order."""
    if len(test) <= size:
        return list(test)
    chosen = random.Random(f"icl-test-{seed}").sample(range(len(test)), size)
    return [test[i] for i in sorted(chosen)]


def balanced_pool(train: Sequence[Example], seed: int) -> list[Example]:
    """The whole train split in one seeded, label-balanced order: round-robin over
    classes (in a seeded class order), each class's examples shuffled."""
    rng = random.Random(f"icl-pool-{seed}")
    return _round_robin(_by_class(train, rng), rng)


def arrange(demos: Sequence[Example], order: str, rng: random.Random) -> list[Example]:
    """The same demonstrations in one seeded order of the given kind."""
    if order == "random":
        shuffled = list(demos)
        rng.shuffle(shuffled)
        return shuffled
    groups = _by_class(demos, rng)
    if order == "grouped":
        return [example for group in groups for example in group]
    return _round_robin(groups, rng)


def _by_class(examples: Sequence[Example], rng: random.Random) -> list[list[Example]]:
    """The examples grouped by label: each group shuffled, the groups in a shuffled order."""
    classes: dict[str, list[Example]] = {}
    for example in examples:
        classes.setdefault(example.label, []).append(example)
    groups = [classes[label] for label in sorted(classes)]
    for group in groups:
        rng.shuffle(group)
    rng.shuffle(groups)
    return groups


def _round_robin(groups: list[list[Example]], rng: random.Random) -> list[Example]:
    """One example of each group in turn until every group is used up."""
    out: list[Example] = []
    for depth in range(max((len(g) for g in groups), default=0)):
        out.extend(g[depth] for g in groups if depth < len(g))
    return out
