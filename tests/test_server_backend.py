"""The `server:` backend against a real completions server on loopback that runs toy-base
(tests/completions_server.py): the same needle outputs and log-likelihoods as the hf backend,
a server without echo support, token counts, capabilities, the API key, bad addresses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_server import closed_port_url
from completions_server import CompletionsServer, Modes
from conftest import invoke
from test_icl import write_trec

from evalsuite.backends import load_model
from evalsuite.backends.server.echo import EchoedToken, EchoMismatch, continuation_loglikelihood
from evalsuite.errors import UserError
from evalsuite.types import GenerationRequest, LoglikelihoodRequest

KEY = "sk-server-4b3c2d1e0f-never-on-disk"
NEEDLE = ("--task", "needle", "-T", "lengths=256", "-T", "depths=0,1", "-T", "samples=2", "--no-progress")
REQUESTS = [
    LoglikelihoodRequest("The magic number of Paris is", " 42."),
    LoglikelihoodRequest("Hello world. ", "The magic"),  # trailing space moves to the continuation
    LoglikelihoodRequest("a b c", " d e f", prefix="Numbers and letters:\n"),  # tokens do not merge across the seam
    LoglikelihoodRequest("", "Hello"),
]


@pytest.fixture(scope="module")
def hf():
    return load_model("toy-base", {}, device="cpu")


@pytest.fixture(scope="module")
def server(hf):
    with CompletionsServer(hf) as running:
        yield running


def connect(url: str, **options: str):
    return load_model("server:toy-base", {"base_url": url, "retries": "0", **options})


def outputs(out: Path) -> dict[str, list]:
    (samples,) = out.glob("*/samples.jsonl")
    return {r["id"]: r["outputs"] for r in map(json.loads, samples.read_text().splitlines())}


# ---- the same answers as the hf backend --------------------------------------------------------


def test_needle_run_gives_the_hf_backends_outputs(server, tmp_path, capsys):
    code, _, err = invoke(capsys, "run", "--model", "server:toy-base", "-M", f"base_url={server.url}",
                          "-M", "tokenizer=toy-base", *NEEDLE, "--out", str(tmp_path / "server"))
    assert code == 0, err
    code, _, err = invoke(capsys, "run", "--model", "toy-base", *NEEDLE, "--device", "cpu", "--out", str(tmp_path / "hf"))
    assert code == 0, err
    served, local = outputs(tmp_path / "server"), outputs(tmp_path / "hf")
    assert len(served) == 4 and served == local
    assert any(any(o.strip() for o in outs) for outs in served.values())  # real text, not empty answers
    generation = [b for b in server.bodies if "max_tokens" in b and not b.get("echo")]
    assert generation and all(b["temperature"] == 0 and b["model"] == "toy-base" for b in generation)


def test_loglikelihoods_equal_the_hf_backends(server, hf):
    model = connect(server.url)
    greedy = hf.generate([GenerationRequest("The magic number of Paris is 42. The magic number of Paris is",
                                            max_new_tokens=3)])[0]
    requests = REQUESTS + [LoglikelihoodRequest("The magic number of Paris is 42. The magic number of Paris is", greedy)]
    served, local = model.loglikelihood(requests), hf.loglikelihood(requests)
    for s, h in zip(served, local):
        assert s.logprob == pytest.approx(h.logprob, abs=1e-4)
        assert (s.tokens, s.is_greedy) == (h.tokens, h.is_greedy)
    assert served[-1].is_greedy and not served[0].is_greedy  # both values occur
    assert all(b["echo"] is True and b["logprobs"] == 1 for b in server.bodies[-len(requests):])


def test_choices_are_the_likeliest_by_loglikelihood(server, hf):
    model = connect(server.url)
    requests = [GenerationRequest("Q: is the sky green? A:", choices=(" yes", " no", " maybe")),
                GenerationRequest(" 1 2 3", prefix="Count:", choices=(" 4", " 5"))]
    for request, answer in zip(requests, model.generate(requests)):
        scores = hf.loglikelihood([LoglikelihoodRequest(request.prompt, c, request.prefix) for c in request.choices])
        assert answer == request.choices[max(range(len(scores)), key=lambda i: scores[i].logprob)]


def test_token_counts_from_a_tokenizer_or_the_servers_tokenize(server, hf):
    texts = ["", "Hello world", "The magic number of Paris is 42.\n" * 5]
    for model in (connect(server.url), connect(server.url, tokenizer="toy-base")):
        assert [model.count_tokens(t) for t in texts] == [hf.count_tokens(t) for t in texts]
    assert connect(server.url, tokenizer="toy-base").fingerprint()["tokenizer_sha256"] == hf.fingerprint()["tokenizer_sha256"]


def test_fingerprint_names_the_served_model_and_no_key(server, monkeypatch):
    monkeypatch.setenv("SERVER_KEY", KEY)
    fingerprint = connect(server.url, api_key_env="SERVER_KEY").fingerprint()
    assert fingerprint["backend"] == "server" and fingerprint["base_url"] == server.url
    assert fingerprint["served_model"] == {"id": "toy-base", "root": "/models/toy-base", "max_model_len": 8192}
    assert KEY not in json.dumps(fingerprint) and fingerprint["tokenizer"] == "server /tokenize"


# ---- lesser servers ----------------------------------------------------------------------------


@pytest.mark.parametrize("modes", [Modes(echo=False), Modes(echo_status=400)], ids=["no-logprobs", "echo-refused"])
def test_a_server_without_echo_refuses_loglikelihood_in_one_line_and_still_generates(hf, modes, tmp_path, capsys):
    with CompletionsServer(hf, modes=modes) as lesser:
        model = connect(lesser.url)
        with pytest.raises(UserError, match="log-likelihood tasks need prompt log-probabilities") as caught:
            model.loglikelihood(REQUESTS[:1])
        assert "\n" not in str(caught.value)
        request = GenerationRequest("The magic number of Paris is 42. The magic number of Paris is", max_new_tokens=4)
        assert model.generate([request]) == hf.generate([request])
        trec = write_trec(tmp_path / "trec.jsonl")
        code, _, err = invoke(capsys, "run", "--model", "server:toy-base", "-M", f"base_url={lesser.url}",
                              "-M", "tokenizer=toy-base", "--task", "icl", "-T", f"data={trec}", "-T", "shots=2",
                              "-T", "test_size=2", "-T", "method=loglikelihood", "--no-progress", "--out", str(tmp_path))
    assert code == 2 and "log-likelihood tasks need prompt log-probabilities" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_without_tokenize_or_tokenizer_counting_is_refused_in_one_line(hf):
    with CompletionsServer(hf, modes=Modes(tokenize=False)) as lesser:
        with pytest.raises(UserError, match="offers no /tokenize.*-M tokenizer="):
            connect(lesser.url).count_tokens("Hello")


@pytest.mark.parametrize("modes, words", [
    (Modes(fixed_count=7), "counts that do not grow with the text"),
    (Modes(fixed_count=10**9), "more than any tokenizer makes"),
    (Modes(count_times=1000), "more than any tokenizer makes"),
])
def test_a_tokenize_whose_counts_are_nonsense_is_refused_before_prompts_are_built(hf, tmp_path, capsys, modes, words):
    with CompletionsServer(hf, modes=modes) as broken:
        code, out, err = invoke(capsys, "run", "--model", "server:toy-base", "-M", f"base_url={broken.url}",
                                "-M", "retries=0", "--task", "needle", "-T", "lengths=256", "--no-progress",
                                "--out", str(tmp_path))
    assert code == 2 and words in err and "-M tokenizer=" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not list(tmp_path.rglob("summary.json"))


def test_without_models_endpoint_max_context_must_be_given(hf):
    with CompletionsServer(hf, modes=Modes(models=False)) as lesser:
        with pytest.raises(UserError, match="give -M max_context"):
            connect(lesser.url)
        assert connect(lesser.url, max_context="512").max_context == 512


def test_capability_tasks_are_refused_before_the_run(server, tmp_path, capsys):
    code, _, err = invoke(capsys, "run", "--model", "server:toy-base", "-M", f"base_url={server.url}", "--task",
                          "outliers", "--no-progress", "--out", str(tmp_path))
    assert code == 2 and "needs activation_probe" in err and "(server backend) does not offer" in err
    assert not list(tmp_path.glob("*/samples.jsonl"))


# ---- the key and bad input ---------------------------------------------------------------------


def key_fragments(data: bytes, size: int = 8) -> list[str]:
    return [KEY[i:i + size] for i in range(len(KEY) - size + 1) if KEY[i:i + size].encode() in data]


def test_the_key_is_sent_but_never_written_or_shown(hf, server, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SERVER_KEY", KEY)
    code, _, err = invoke(capsys, "run", "--model", "server:toy-base", "-M", f"base_url={server.url}", "-M",
                          "api_key_env=SERVER_KEY", "-M", "tokenizer=toy-base", *NEEDLE, "--out", str(tmp_path))
    assert code == 0, err
    assert server.headers[-1]["Authorization"] == f"Bearer {KEY}"
    assert key_fragments(b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())) == []
    with CompletionsServer(hf, modes=Modes(error_status=400)) as echoing:  # a server that echoes the header
        with pytest.raises(UserError) as caught:
            connect(echoing.url, api_key_env="SERVER_KEY").generate([GenerationRequest("Hello")])
    assert "HTTP 400" in str(caught.value) and "[redacted]" in str(caught.value)
    assert key_fragments(str(caught.value).encode()) == []


@pytest.mark.parametrize("options, message", [
    ({}, "needs -M base_url"),
    ({"base_url": "ftp://127.0.0.1/v1"}, "http:// or https://"),
    ({"base_url": "notaurl"}, "http:// or https://"),
    ({"base_url": closed_port_url()}, "connection failed"),
    ({"base_url": "http://127.0.0.1:1/v1", "concurrency": "0"}, "concurrency must be >= 1"),
    ({"base_url": "http://127.0.0.1:1/v1", "chat_template": "true"}, "needs -M tokenizer"),
])
def test_bad_options_fail_in_one_line_with_exit_2(options, message, tmp_path, capsys):
    args = [arg for key, value in {"retries": "0", **options}.items() for arg in ("-M", f"{key}={value}")]
    code, _, err = invoke(capsys, "run", "--model", "server:toy-base", *args, *NEEDLE, "--out", str(tmp_path))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_an_unknown_served_model_is_named(server):
    with pytest.raises(UserError, match="unknown model on server .* 'toy-bse' \\(did you mean 'toy-base'"):
        load_model("server:toy-bse", {"base_url": server.url})


# ---- reading echoed tokens ---------------------------------------------------------------------


def tokens(*pieces: tuple[str, float | None]) -> list[EchoedToken]:
    out, at = [], 0
    for text, logprob in pieces:
        out.append(EchoedToken(at, text, logprob, {text: logprob} if logprob is not None else None))
        at += len(text)
    return out


def test_echoed_tokens_after_a_bos_and_before_generated_ones():
    echoed = tokens(("<s>", None), ("Hi", -1.0), (" there", -2.0), ("!", -0.5), (" Bye", -3.0))
    result = continuation_loglikelihood(echoed, "Hi there!", len("Hi"))
    assert (result.logprob, result.tokens, result.is_greedy) == (-2.5, 2, True)


@pytest.mark.parametrize("prompt", ["Hi thera!", "Hi there!!"])
def test_echoed_tokens_that_do_not_spell_the_prompt_are_refused(prompt):
    with pytest.raises(EchoMismatch):
        continuation_loglikelihood(tokens(("Hi", None), (" there", -2.0), ("!", -0.5)), prompt, 2)
