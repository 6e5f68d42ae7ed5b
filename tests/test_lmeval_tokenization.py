"""Continuations tokenized as lm-eval tokenizes them, on a legacy SentencePiece-style
tokenizer (a normalizer that prepends "▁" to every string it encodes, loaded as a generic
fast tokenizer): there " yes" encoded alone is ['▁', '▁yes'], a spurious first token, while
after its context it is ['▁yes']. Log-likelihoods must equal lm-eval's hf backend, and
constrained answers must be the same token ids."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_zeroshot import BENCHMARKS, lm_eval_run, write_fixtures

from evalsuite.backends.common.choices import END
from evalsuite.backends.hf import HFModel
from evalsuite.engine.runner import RunOptions, run_task
from evalsuite.runs.records import RunFolder
from evalsuite.tasks.zeroshot.task import ZeroShot
from evalsuite.types import GenerationRequest

pytest.importorskip("lm_eval")

SPECIALS = ["<unk>", "<s>", "</s>"]


def legacy_tokenizer(corpus: list[str]):
    """A BPE tokenizer shaped like Llama's legacy tokenizer.json: Prepend("▁") and spaces as
    "▁" in the normalizer, no pre-tokenizer, BOS added by the post-processor. Merges are
    learned within words (a pre-tokenizer only while training), as SentencePiece learns them."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS))
    tok.pre_tokenizer = None
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module")
def legacy(tmp_path_factory) -> tuple[Path, Path]:
    """(model folder, data folder): a tiny random Llama with the legacy tokenizer, trained on
    the fixtures' own text so that no character is unknown."""
    from evalsuite.models.toy import ToySize, save_random_model

    root = tmp_path_factory.mktemp("legacy")
    data = write_fixtures(root / "data")
    corpus = [line for f in sorted(data.glob("*.jsonl")) for line in f.read_text().splitlines()]
    tokenizer = legacy_tokenizer(corpus)
    size = ToySize(hidden=32, layers=2, heads=4, intermediate=64, max_context=512)
    return save_random_model("base", root / "legacy-llama", tokenizer, size, seed=3), data


def test_the_tokenizer_marks_the_start_of_every_string(legacy):
    model = HFModel.load(str(legacy[0]), {"dtype": "float32"}, device="cpu")
    alone = model.tokenizer.tokenize(" farmer")
    assert alone == ["▁", "▁farmer"]  # what encoding a continuation on its own adds
    assert model.tokens.encode_after("the", " farmer", first=True) == model.encode(" farmer", first=False)[1:]


def test_loglikelihoods_equal_lm_eval_hf_backend_per_document(legacy, tmp_path):
    folder, data = legacy
    reference = lm_eval_run("hf", f"pretrained={folder},dtype=float32", data)
    model = HFModel.load(str(folder), {"dtype": "float32"}, device="cpu", batch_size=3)
    run = run_task(ZeroShot(benchmarks=BENCHMARKS, data_dir=str(data)), model, RunOptions(out=tmp_path, progress=False))
    records = RunFolder(run.path).read_records()
    for benchmark in BENCHMARKS:
        ours = {r.info["doc_id"]: r for r in records if r.axes["benchmark"] == benchmark}
        for sample in reference["samples"][benchmark]:
            logprobs = [resp[0][0] for resp in sample["resps"]]
            assert [o["logprob"] for o in ours[sample["doc_id"]].outputs] == pytest.approx(logprobs, abs=1e-4)


def _sequences(node: dict, path: tuple[int, ...] = ()):
    for key, child in node.items():
        if key == END:
            yield path
        else:
            yield from _sequences(child, path + (key,))


def test_constrained_answers_are_the_ids_that_follow_the_prompt(legacy):
    model = HFModel.load(str(legacy[0]), {"dtype": "float32"}, device="cpu")
    prompt, choices = "The farmer gave the map to the baker because _ was tired. Answer:", (" the farmer", " the baker")
    start = len(model.encode(prompt))
    expected = sorted(tuple(model.encode(prompt + c)[start:]) for c in choices)
    assert all(tuple(model.encode(c, first=False)) not in expected for c in choices)  # alone: a spurious "▁"
    trie = model.decoder.choice_trie(GenerationRequest(prompt=prompt, choices=choices))
    assert sorted(_sequences(trie.root)) == expected
    assert model.generate([GenerationRequest(prompt=prompt, choices=choices)])[0] in choices
