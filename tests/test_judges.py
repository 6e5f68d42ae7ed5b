"""Judges: verdict parsing, the judge prompt, the lexical heuristic, and the openai judge driven
through a real HTTP server on loopback (retries, timeouts, malformed bodies, an endpoint that
stays down, the concurrency limit, the cache, and the API key kept out of every file)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from chat_server import ChatServer, Reply, by_marker, closed_port_url, document_of

from evalsuite.errors import UserError
from evalsuite.tasks.hallucination.judges import (
    JudgeItem,
    JudgementFile,
    JudgeSettings,
    JudgeUnavailable,
    Verdict,
    judge_missing,
    judge_prompt,
    make_judge,
    parse_verdict,
    verdict_from_text,
)
from evalsuite.tasks.hallucination.judges.local import LexicalJudge

KEY = "sk-test-9f8e7d6c5b4a-never-on-disk"


def items(n: int = 6) -> list[JudgeItem]:
    """Judge items whose documents mention a zebra for even i only."""
    return [JudgeItem(id=f"s{i}", document=f"Document {i}. Volunteers met at the harbour."
                      + (" A zebra walked by." if i % 2 == 0 else ""),
                      reference=(f"reference {i}",), output=f"output {i}") for i in range(n)]


def expected(n: int = 6) -> dict[str, bool]:
    return {f"s{i}": i % 2 == 0 for i in range(n)}


def openai_judge(tmp_path: Path, url: str, model: str = "judge-x", **settings):
    options = dict(retries=3, backoff=0.001, timeout=2.0, concurrency=2, progress=False)
    options.update(settings)
    return make_judge(JudgeSettings(spec=f"openai:{model}", base_url=url, **options), tmp_path / "cache.sqlite")


def run_judge(tmp_path: Path, judge, batch: list[JudgeItem] | None = None):
    return judge_missing(tmp_path / "judgements", batch if batch is not None else items(), judge, progress=False)


def verdict_values(outcome) -> dict[str, bool | None]:
    return {i: v.verdict for i, v in outcome.verdicts.items()}


def files_text(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


# ---- parsing and prompt ----------------------------------------------------------------------


VERDICT_CASES = [  # (judge response, what a careful reader takes as its verdict; None: unparseable)
    # a bare verdict after the label, in the forms judges write it
    ("The summary matches.\nConclusion: True", True),
    ("It invents a date.\nConclusion: False", False),
    ("reasoning\nconclusion: FALSE", False),
    ("reasoning\nCONCLUSION: true", True),
    ("reasoning...\n**Conclusion:** true.", True),
    ("reasoning\n**Conclusion**: **False**", False),
    ("reasoning\nConclusion: *True*", True),
    ("reasoning\nConclusion: `False`", False),
    ('reasoning\nConclusion: "True"', True),
    ("reasoning\n### Conclusion: True", True),
    ("reasoning\nConclusion:True", True),
    ("reasoning\nConclusion: True!", True),
    ("reasoning\nConclusion: False.   ", False),
    ("reasoning\r\nConclusion: False\r\n", False),
    ("reasoning\n**Conclusion:**\nTrue", True),  # the verdict on the line after the label
    ("Conclusion: True", True),
    ("Final conclusion: False", False),
    ("Conclusion: True\n\nI hope this helps.", True),  # a closing line that names no conclusion
    ("Conclusion: False at first.\nOn reflection it is fine.\nConclusion: True", True),  # the last one counts
    ("Conclusion: True\nWait, the date is wrong.\nConclusion: False", False),
    # negated, hedged or qualified: not a bare verdict
    ("reasoning\nConclusion: Not True", None),
    ("reasoning\nConclusion: not true.", None),
    ("reasoning\nConclusion: the summary is not true", None),
    ("reasoning\nConclusion: The summary is not true to the article.", None),
    ("reasoning\nConclusion: Partially true", None),
    ("reasoning\nConclusion: Mostly True", None),
    ("reasoning\nConclusion: True, mostly", None),
    ("reasoning\nConclusion: True (except the date)", None),
    ("reasoning\nConclusion: True. The date is right.", None),
    ("reasoning\nConclusion: False, it is true that the summary is short", None),
    ("reasoning\nConclusion: Untrue", None),
    ("reasoning\nConclusion: Truefalse", None),
    ("reasoning\nConclusion: True/False", None),  # both
    ("reasoning\nConclusion: True or False", None),
    ("reasoning\nConclusion: it depends", None),  # neither
    ("reasoning\nConclusion:", None),
    ("reasoning\nConclusion: Yes", None),
    # a verdict followed by a note that mentions a conclusion: ambiguous
    ("Conclusion: False\nNote: my conclusion would be true if the date were right.", None),
    ("Conclusion: False\n(The conclusion that the summary is true would need the date.)", None),
    ("Conclusion: True\nConclusions drawn above are tentative.", None),
    # a verdict taken back or contradicted after the conclusion: no verdict, never the first one
    ("Conclusion: True\nActually no. False.", None),
    ("Conclusion: True ... Actually no. False.", None),
    ("Conclusion: False\nWait, the date is in the document after all.", None),
    ("Conclusion: True\n\nOn second thought, the summary invents a name.", None),
    ("Conclusion: True\nCorrection: the figure is wrong.", None),
    ("Conclusion: False\nNo, I misread it; it is supported.", None),
    ("Conclusion: True\nI was wrong about the date, though.", None),
    ("**Conclusion:** True\n\n(Revised: False)", None),
    ("Conclusion: True\nThe summary is fine.", True),  # a closing line that takes nothing back
    ("Conclusion: False\nThe date it gives appears nowhere in the document.", False),
    # no label at all, or only prose about a conclusion
    ("The output is supported by the document. True.", None),
    ("True", None),
    ("In conclusion, the summary is true.", None),
    ("In conclusion: the summary is true.", None),
    ("My conclusion is True", None),
    ("Conclusion - True", None),
    ("The conclusion: True is what I would say, but", None),
    ("", None),
]


@pytest.mark.parametrize("text, verdict", VERDICT_CASES)
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) is verdict


@pytest.mark.parametrize("text, verdict", VERDICT_CASES)
def test_a_verdict_is_recorded_as_unparseable_never_as_true_or_false(tmp_path, text, verdict):
    store = JudgementFile(tmp_path, "openai:judge-x")
    store.append([verdict_from_text("s0", "openai:judge-x", text)])
    [line] = store.path.read_text().splitlines()
    written = json.loads(line)
    assert (written["status"], written["verdict"]) == (("judged", verdict) if verdict is not None
                                                       else ("unparseable", None))


def test_verdicts_written_under_a_looser_rule_are_read_by_the_current_one(tmp_path):
    """A file from before the strict rule may hold "Not True" as a True verdict: reading it
    again counts what its stored response says, so old runs are counted as new ones are."""
    store = JudgementFile(tmp_path, "openai:judge-x")
    store.append([Verdict("a", "openai:judge-x", "judged", True, response="Conclusion: Not True"),
                  Verdict("b", "openai:judge-x", "judged", True, response="Conclusion: True"),
                  Verdict("c", "openai:judge-x", "unparseable", None, response="Conclusion: **False**"),
                  Verdict("d", "openai:judge-x", "error", None, error="HTTP 400")])
    assert {k: (v.status, v.verdict) for k, v in store.read().items()} == {
        "a": ("unparseable", None), "b": ("judged", True), "c": ("judged", False), "d": ("error", None)}


def test_judge_prompt_has_document_reference_output_and_asks_reasoning_then_conclusion():
    item = JudgeItem(id="q1", document="The bridge opened in 1932.", reference=("1932",), output="In 1933.",
                     question="When did the bridge open?")
    prompt = judge_prompt(item)
    for part in ("Document:\nThe bridge opened in 1932.", "Question: When did the bridge open?",
                 "Reference answer:\n1932", "Model's answer:\nIn 1933."):
        assert part in prompt
    assert prompt.index("reasoning") < prompt.index('"Conclusion: True"') < prompt.index('"Conclusion: False"')
    assert "differs from" in prompt  # a correct output may differ from the reference
    summary = judge_prompt(JudgeItem(id="d", document="d", reference=("a", "b"), output="o"))
    assert "Reference summary:\n- a\n- b" in summary and "Question:" not in summary


@pytest.mark.parametrize("output, question, supported", [
    ("Anna Berg thanked 120 volunteers.", "", True),
    ("Anna Berg thanked 1,200 volunteers.", "", True),  # separators do not matter
    ("Anna Berg thanked 130 volunteers.", "", False),  # a number the document lacks
    ("Maria Lopez thanked the volunteers.", "", False),  # a name the document lacks
    ("the volunteers of Oslo", "Where did Anna go? Oslo?", True),  # the question counts as context
    ("   ", "", False),  # an empty output is not supported
])
def test_lexical_judge(output, question, supported):
    item = JudgeItem(id="x", document="The mayor, Anna Berg, thanked 120 (or 1200) volunteers.",
                     reference=("r",), output=output, question=question)
    text = LexicalJudge.reasoning(item)
    assert parse_verdict(text) is supported
    assert LexicalJudge.label == "lexical (heuristic)" and LexicalJudge.heuristic


@pytest.mark.parametrize("spec, message", [
    ("opnai:gpt-4o", "did you mean 'openai'"),
    ("openai:", "needs a model name"),
    ("hf", "needs a model name"),
    ("lexical:big", "takes no model name"),
])
def test_bad_judge_specs(spec, message):
    with pytest.raises(UserError, match=message):
        JudgeSettings(spec=spec)


def test_judgement_file_keeps_the_last_verdict_and_repairs_a_torn_line(tmp_path):
    store = JudgementFile(tmp_path, "lexical")
    store.append([Verdict("a", "lexical", "error", None, error="boom"), Verdict("b", "lexical", "judged", True)])
    store.append([Verdict("a", "lexical", "judged", False)])
    with store.path.open("ab") as fh:
        fh.write(b'{"id": "c", "judge": "lexi')  # a run killed mid-write
    latest = store.read(repair=True)
    assert {k: (v.status, v.verdict) for k, v in latest.items()} == {"a": ("judged", False), "b": ("judged", True)}
    assert store.path.read_bytes().endswith(b"\n") and b'"c"' not in store.path.read_bytes()


# ---- the openai judge over real HTTP ---------------------------------------------------------


def test_normal_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ChatServer() as server:
        outcome = run_judge(tmp_path, openai_judge(tmp_path, server.url))
    assert verdict_values(outcome) == expected()
    assert all(v.status == "judged" and v.attempts == 1 and not v.cached for v in outcome.verdicts.values())
    assert server.count == 6
    body = server.bodies[0]
    assert body["model"] == "judge-x" and body["temperature"] == 0 and body["max_tokens"] == 1024
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert all(h["Authorization"] == f"Bearer {KEY}" for h in server.headers)
    # each verdict belongs to its own sample: the request recorded for s0 carries s0's document
    by_sha = {hashlib.sha256(json.dumps(b, sort_keys=True, ensure_ascii=False).encode()).hexdigest(): b
              for b in server.bodies}
    for item in items():
        assert document_of(by_sha[outcome.verdicts[item.id].request_sha256]) == item.document
    assert KEY.encode() not in files_text(tmp_path)


def test_500s_and_429s_clear_after_retries(tmp_path):
    seen: dict[str, int] = {}
    judge_by_marker = by_marker()

    def flaky(n, body, headers):
        key = document_of(body)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 1:
            return Reply(status=500, raw=b"internal error")
        if seen[key] == 2:
            return Reply(status=429, raw=b'{"error": "rate limited"}', headers={"Retry-After": "0"})
        return judge_by_marker(n, body, headers)

    with ChatServer(flaky) as server:
        outcome = run_judge(tmp_path, openai_judge(tmp_path, server.url))
    assert verdict_values(outcome) == expected()
    assert [v.attempts for v in outcome.verdicts.values()] == [3] * 6
    assert server.count == 18


def test_a_timeout_is_retried(tmp_path):
    judge_by_marker = by_marker()

    def slow_first(n, body, headers):
        reply = judge_by_marker(n, body, headers)
        reply.delay = 4.0 if n == 0 else 0.0  # the first request (s0's) outlasts the client's timeout
        return reply

    with ChatServer(slow_first) as server:
        outcome = run_judge(tmp_path, openai_judge(tmp_path, server.url, timeout=1.0, concurrency=1))
    assert verdict_values(outcome) == expected()
    assert outcome.verdicts["s0"].attempts == 2


def test_malformed_bodies_are_retried_then_recorded_as_that_samples_error(tmp_path):
    judge_by_marker = by_marker()
    seen: dict[str, int] = {}

    def garbled(n, body, headers):
        document = document_of(body)
        seen[document] = seen.get(document, 0) + 1
        if "Document 3." in document:
            return Reply(raw=b"<html>not json")  # always: s3 ends as a recorded error
        if "Document 4." in document and seen[document] <= 2:
            return Reply(raw=b'{"choices": []}')  # twice, then s4 recovers
        return judge_by_marker(n, body, headers)

    with ChatServer(garbled) as server:
        outcome = run_judge(tmp_path, openai_judge(tmp_path, server.url, concurrency=1))
    s3 = outcome.verdicts["s3"]
    assert s3.status == "error" and "malformed response body" in s3.error and s3.attempts == 4
    assert {k: v for k, v in verdict_values(outcome).items() if k != "s3"} == {
        k: v for k, v in expected().items() if k != "s3"}
    assert outcome.verdicts["s4"].attempts == 3


def test_an_endpoint_that_stays_down_stops_the_run_and_keeps_what_was_judged(tmp_path):
    judge_by_marker = by_marker()

    def dies_after_two(n, body, headers):
        return judge_by_marker(n, body, headers) if n < 2 else Reply(status=503, raw=b"down for maintenance")

    with ChatServer(dies_after_two) as server:
        with pytest.raises(JudgeUnavailable) as failure:
            run_judge(tmp_path, openai_judge(tmp_path, server.url, concurrency=1, retries=2))
    message = str(failure.value)
    assert "\n" not in message and "HTTP 503" in message and "after 3 attempts" in message
    assert "2 of 6 samples have verdicts" in message and "run the same command again" in message
    kept = JudgementFile(tmp_path / "judgements", "openai:judge-x").read()
    assert {k: v.status for k, v in kept.items()} == {"s0": "judged", "s1": "judged", "s2": "error"}

    with ChatServer() as healthy:  # the endpoint is back: only what has no verdict is judged
        outcome = run_judge(tmp_path, openai_judge(tmp_path, healthy.url))
    assert healthy.count == 4 and outcome.new == 4
    assert verdict_values(outcome) == expected()


def test_a_refused_connection_stops_the_run(tmp_path):
    with pytest.raises(JudgeUnavailable, match=r"connection failed .*after 2 attempts"):
        run_judge(tmp_path, openai_judge(tmp_path, closed_port_url(), retries=1, concurrency=1))
    kept = JudgementFile(tmp_path / "judgements", "openai:judge-x").read()
    assert [v.status for v in kept.values()] == ["error"]  # the sample that used the retry budget


def test_a_rejected_key_stops_the_run_without_revealing_it(tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    with ChatServer(lambda n, body, headers: Reply(status=401, raw=headers["Authorization"].encode())) as server:
        with pytest.raises(JudgeUnavailable) as failure:
            run_judge(tmp_path, openai_judge(tmp_path, server.url, api_key_env="JUDGE_KEY"))
    assert "HTTP 401" in str(failure.value) and "$JUDGE_KEY" in str(failure.value)
    assert KEY not in str(failure.value) and "[redacted]" in str(failure.value)


def test_the_key_is_scrubbed_from_recorded_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)

    def echo_headers(n, body, headers):  # a server that echoes the request headers in a 400
        return Reply(status=400, raw=json.dumps(headers).encode())

    with ChatServer(echo_headers) as server:
        with pytest.raises(JudgeUnavailable, match="all 6 judge calls failed"):  # every call failed: no success
            run_judge(tmp_path, openai_judge(tmp_path, server.url))
    verdicts = JudgementFile(tmp_path / "judgements", "openai:judge-x").read()
    assert len(verdicts) == 6 and all(v.status == "error" and "HTTP 400" in v.error for v in verdicts.values())
    assert server.count == 6  # a 400 is not retried
    written = files_text(tmp_path)
    assert KEY.encode() not in written and b"[redacted]" in written


def test_the_concurrency_limit_holds(tmp_path):
    judge_by_marker = by_marker()

    def slow(n, body, headers):
        reply = judge_by_marker(n, body, headers)
        reply.delay = 0.2
        return reply

    with ChatServer(slow) as server:
        outcome = run_judge(tmp_path, openai_judge(tmp_path, server.url, concurrency=2), items(8))
    assert verdict_values(outcome) == expected(8)
    assert server.max_in_flight == 2


def test_the_cache_is_keyed_by_model_and_request(tmp_path):
    with ChatServer() as server:
        first = run_judge(tmp_path, openai_judge(tmp_path, server.url))
        (tmp_path / "judgements" / "openai_judge-x.jsonl").unlink()
        again = run_judge(tmp_path, openai_judge(tmp_path, server.url))
        assert server.count == 6  # every answer came from the cache
        assert all(v.cached for v in again.verdicts.values())
        assert verdict_values(again) == verdict_values(first)
        other = run_judge(tmp_path, openai_judge(tmp_path, server.url, model="judge-y"))
        assert server.count == 12  # another judge model is never served judge-x's answers
        assert not any(v.cached for v in other.verdicts.values())
        changed = [JudgeItem(i.id, i.document, i.reference, i.output + " (edited)") for i in items()]
        (tmp_path / "judgements" / "openai_judge-x.jsonl").unlink()
        run_judge(tmp_path, openai_judge(tmp_path, server.url), changed)
        assert server.count == 18  # a different request is a different key


# ---- secrets and untrusted endpoints ---------------------------------------------------------


def key_fragments(data: bytes, key: str = KEY, size: int = 8) -> list[str]:
    return [key[i:i + size] for i in range(len(key) - size + 1) if key[i:i + size].encode() in data]


@pytest.mark.parametrize("status", [400, 500])
def test_no_fragment_of_the_key_reaches_disk_wherever_an_error_body_cuts_it(tmp_path, monkeypatch, status):
    """A server echoing the Authorization header at every offset around the 300-byte cut of an
    error body (and the 120-byte excerpt of a malformed one) leaves no 8-character piece of the key."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    offsets = list(range(230, 320)) + list(range(60, 130))

    def echo_at_offset(n, body, headers):
        padding = "x" * offsets[n % len(offsets)]
        return Reply(status=status, raw=(padding + headers["Authorization"] + " trailing").encode())

    def malformed_at_offset(n, body, headers):
        return Reply(status=200, raw=("{" + "y" * offsets[n % len(offsets)] + headers["Authorization"]).encode())

    for index, script in enumerate((echo_at_offset, malformed_at_offset)):
        folder = tmp_path / f"case{index}"
        with ChatServer(script) as server:
            judge = openai_judge(folder, server.url, retries=0, concurrency=1)
            try:
                run_judge(folder, judge, items(len(offsets)))
            except JudgeUnavailable:
                pass  # a 500 with no retries left stops the run; what was recorded is checked below
            finally:
                judge.close()
        assert server.count >= 1
        assert key_fragments(files_text(folder)) == []


@pytest.mark.parametrize("url", ["file:///etc/passwd#", "notaurl", "ftp://127.0.0.1/v1", "http://"])
def test_only_http_endpoints_are_accepted(url):
    with pytest.raises(UserError, match="http:// or https://"):
        JudgeSettings(spec="openai:judge-x", base_url=url)


def test_an_empty_success_body_is_retried_and_never_cached(tmp_path):
    seen: set[str] = set()

    def glitch_then_healthy(n, body, headers):
        key = json.dumps(body, sort_keys=True)
        if key not in seen:  # every request's first attempt gets a proxy's empty 200
            seen.add(key)
            return Reply(status=200, content="")
        return by_marker()(n, body, headers)

    with ChatServer(glitch_then_healthy) as server:
        outcome = run_judge(tmp_path, openai_judge(tmp_path, server.url, retries=3, concurrency=1))
        assert verdict_values(outcome) == expected()
        assert server.count == 12  # each of the 6 items: one empty reply, then a real one
        # judging again from scratch is served from the cache: real answers, not the empty ones
        again = judge_missing(tmp_path / "again", items(), openai_judge(tmp_path, server.url), progress=False)
        assert server.count == 12
    assert verdict_values(again) == expected() and all(v.cached for v in again.verdicts.values())
