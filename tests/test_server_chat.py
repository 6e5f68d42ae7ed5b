"""The `server:` backend through the chat API (`-M api=chat`) against a real chat-completions server
on loopback that runs toy-base behind a chat template (tests/chat_model_server.py): needle and nolima
end to end, prompts at their lengths with the template's tokens counted, three ways of counting that
agree, a local template unlike the server's refused, busy answers retried, log-likelihoods refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_model_server import ChatModelServer, ChatModes, with_template
from conftest import invoke
from test_icl import write_trec

from evalsuite.backends import load_model
from evalsuite.backends.server.api import APIS, prompt_tokens
from evalsuite.errors import UserError
from evalsuite.types import GenerationRequest, LoglikelihoodRequest

TOKEN = "chat-token-5e6f7a8b9c"
SMALL = ("-T", "lengths=256", "-T", "depths=0,1", "--no-progress", "--log-prompts")
TEXTS = ["", "Hello world", "The magic number of Paris is 42.\n" * 5]


@pytest.fixture(scope="module")
def hf():
    return load_model("toy-base", {}, device="cpu")


@pytest.fixture(scope="module")
def server(hf):
    with ChatModelServer(hf) as running:
        yield running


def connect(url: str, **options: str):
    return load_model("server:toy-base", {"base_url": url, "api": "chat", "retries": "0", **options})


def run(capsys, url: str, out: Path, *args: str, options: tuple[str, ...] = ()):
    return invoke(capsys, "run", "--model", "server:toy-base", "-M", f"base_url={url}", "-M", "api=chat",
                  *options, *args, "--out", str(out))


def records(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


def tokenizer_folder(hf, path: Path, template: str | None = None) -> Path:
    """toy-base's tokenizer saved with a chat template (the server's unless another is given)."""
    (with_template(hf.tokenizer, template) if template else with_template(hf.tokenizer)).save_pretrained(path)
    return path


# ---- needle and nolima end to end ----------------------------------------------------------------


@pytest.mark.parametrize("task, args, per_sample", [
    ("needle", ("-T", "samples=2"), 1),
    ("nolima", ("-T", "samples=1"), 2),
], ids=["needle", "nolima"])
def test_a_task_runs_end_to_end_through_the_chat_api(server, hf, tmp_path, capsys, task, args, per_sample):
    """Every prompt goes as one user message and is as long, template included, as the record says
    (the server's own count of what the model read); the outputs are the server's answers."""
    answered = len(server.answers)
    code, out, err = run(capsys, f"{server.url}?api-key={TOKEN}", tmp_path, "--task", task, *args, *SMALL)
    assert code == 0, err
    (folder,) = tmp_path.glob(f"{task}-*")
    rows = records(folder)
    assert len(rows) == 4 and all(r["error"] is None and len(r["outputs"]) == per_sample for r in rows)
    by_content = {a.content: a for a in server.answers[answered:]}
    assert len(by_content) == 4 * per_sample
    config = json.loads((folder / "config.json").read_text())["model"]
    template = config["template_tokens"]
    assert (config["api"], config["chat_template"]) == ("chat", "server") and template > 0
    for row in rows:
        first, *_ = answers = [by_content[text] for text in row["prompt"]["text"]]
        assert row["outputs"] == [a.text for a in answers]
        # the prompt fills the length beside the answer budget counting the template's tokens, which
        # the user's text alone (as /v1/completions would read it) leaves out
        assert first.prompt_tokens == row["info"]["prompt_tokens"]
        assert 0 <= row["axes"]["context_length"] - row["info"]["answer_budget"] - first.prompt_tokens <= 3
        plain = len(hf.tokenizer(first.content)["input_ids"])
        assert first.prompt_tokens - plain >= template - 2
    messages = [b["messages"] for b in server.bodies if "messages" in b and "max_tokens" in b and b["max_tokens"] > 1]
    assert all(len(m) == 1 and m[0]["role"] == "user" for m in messages)
    if task == "needle":
        assert all(a.content.rsplit("\n", 1)[1].startswith("Answer: The magic number of ") for a in by_content.values())
    written = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert TOKEN.encode() not in written and TOKEN not in out + err
    assert all(f"api-key={TOKEN}" in path for _, path, _ in server.seen[-3:])  # the server still gets it


# ---- counting ------------------------------------------------------------------------------------


def test_tokenize_a_local_template_and_usage_count_alike(server, hf, tmp_path):
    """/tokenize with the text as a message, the local tokenizer's chat template, a one-token
    request's usage: the same counts, each the server's length of the rendered prompt."""
    folder = tokenizer_folder(hf, tmp_path / "templated")
    models = [connect(server.url), connect(server.url, tokenizer=str(folder)), connect(server.url, counts="usage")]
    expected = [len(server.render([{"role": "user", "content": t}])[1]) for t in TEXTS]
    for model in models:
        assert [model.count_tokens(t) for t in TEXTS] == expected
    assert [m.fingerprint()["tokenizer"] for m in models] == ["server /tokenize", str(folder), "server usage"]


def test_without_tokenize_counts_come_from_usage_when_asked(hf):
    with ChatModelServer(hf, modes=ChatModes(tokenize=False)) as lesser:
        with pytest.raises(UserError, match="offers no /tokenize.*-M counts=usage"):
            connect(lesser.url).count_tokens("Hello")
        assert connect(lesser.url, counts="usage").count_tokens("Hello") == len(lesser.render(
            [{"role": "user", "content": "Hello"}])[1])


def test_a_tokenize_whose_counts_do_not_grow_is_refused_though_the_config_asked_first(hf, tmp_path, capsys):
    """config.json's template_tokens asks for a count before the task does: its failed check is
    not taken for a passed one, so the prompt builder never fits a haystack by nonsense counts."""
    with ChatModelServer(hf, modes=ChatModes(fixed_count=30)) as broken:
        code, _, err = run(capsys, broken.url, tmp_path, "--task", "needle", "-T", "samples=1", *SMALL,
                           options=("-M", "retries=0"))
    assert code == 2 and "counts that do not grow with the text" in err, err
    assert len(err.strip().splitlines()) == 1 and not list(tmp_path.rglob("summary.json"))


def test_a_local_template_unlike_the_servers_is_refused_at_the_first_answer(server, hf, tmp_path, capsys):
    folder = tokenizer_folder(hf, tmp_path / "other", "{{ bos_token }}{% for m in messages %}{{ m['content'] }}"
                                                      "{% endfor %}")
    code, _, err = run(capsys, server.url, tmp_path / "runs", "--task", "needle", "-T", "samples=1", *SMALL,
                       options=("-M", f"tokenizer={folder}"))
    assert code == 2 and "tokens (usage.prompt_tokens) in a prompt counted as" in err and "-M tokenizer=" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not list((tmp_path / "runs").rglob("summary.json"))


# ---- retries, refusals, bad options --------------------------------------------------------------


def test_busy_answers_are_retried_with_backoff(server, hf):
    request = GenerationRequest("The magic number of Paris is 42. The magic number of Paris is", max_new_tokens=6)
    calm = connect(server.url).generate([request])
    with ChatModelServer(hf, modes=ChatModes(failures=(429, 503, 500))) as busy:
        assert connect(busy.url, retries="3", backoff="0.01").generate([request]) == calm
        assert [path for method, path, _ in busy.seen if method == "POST"] == ["/v1/chat/completions"] * 4
    with ChatModelServer(hf, modes=ChatModes(failures=(503, 503))) as down:
        with pytest.raises(UserError, match=r"HTTP 503.*\(after 2 attempts\)"):
            connect(down.url, retries="1", backoff="0.01").generate([request])


def test_loglikelihoods_and_answer_sets_are_refused_in_one_line(server, tmp_path, capsys):
    model = connect(server.url)
    for call in (lambda: model.loglikelihood([LoglikelihoodRequest("Q: sky? A:", " blue")]),
                 lambda: model.generate([GenerationRequest("Q: sky? A:", choices=(" blue", " green"))])):
        with pytest.raises(UserError, match=r"does not return; serve the model's /v1/completions"):
            call()
    trec = write_trec(tmp_path / "trec.jsonl")
    code, _, err = run(capsys, server.url, tmp_path, "--task", "icl", "-T", f"data={trec}", "-T", "shots=2", "-T",
                       "test_size=2", "-T", "method=loglikelihood", "--no-progress")
    assert code == 2 and "-M api=chat" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("options, message", [
    ({"api": "chta"}, "unknown -M api 'chta' (did you mean 'chat'"),
    ({"api": "chat", "chat_template": "true", "tokenizer": "toy-base"}, "the server applies the model's own"),
    ({"counts": "usage", "tokenizer": "toy-base"}, "not both"),
    ({"counts": "tokens"}, "unknown -M counts 'tokens'"),
])
def test_bad_chat_options_fail_in_one_line_with_exit_2(options, message, tmp_path, capsys):
    args = [arg for key, value in {"base_url": "http://127.0.0.1:1/v1", **options}.items()
            for arg in ("-M", f"{key}={value}")]
    code, _, err = invoke(capsys, "run", "--model", "server:toy-base", *args, "--task", "needle", "--no-progress",
                          "--out", str(tmp_path))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_tokenizer_without_a_chat_template_cannot_count_chat_prompts(server):
    with pytest.raises(UserError, match="-M tokenizer=toy-base has no chat template"):
        connect(server.url, tokenizer="toy-base")


@pytest.mark.parametrize("choice", [{}, {"message": None}, {"message": {"role": "assistant", "content": None}},
                                    {"text": "a completion's text"}])
def test_a_chat_reply_without_message_content_is_named(choice):
    with pytest.raises(UserError, match=r"no choices\[0\]\.message\.content"):
        APIS["chat"].text_of(choice)


@pytest.mark.parametrize("body, count", [
    ({"usage": {"prompt_tokens": 7}}, 7),
    ({"usage": {"prompt_tokens": True}}, None),
    ({"usage": {"prompt_tokens": -1}}, None),
    ({"usage": None}, None),
    ([], None),
])
def test_usage_is_read_only_where_it_is_a_count(body, count):
    assert prompt_tokens(body) == count
