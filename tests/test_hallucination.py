"""The hallucination task: data loading, prompts, document-only truncation, judging as its own
step (run --judge, score), the tables, and the failure modes seen from the command line."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pandas as pd
import pytest
from chat_server import ChatServer, Reply, closed_port_url, document_of, output_of
from conftest import invoke

from evalsuite.analysis.report import report_runs
from evalsuite.analysis.stats import mcnemar_exact
from evalsuite.backends.fake import FakeModel, FakeOptions
from evalsuite.engine.runner import RunOptions, make_task, run_models
from evalsuite.errors import UserError
from evalsuite.tasks.hallucination.judges import JudgementFile, JudgeSettings, make_judge
from evalsuite.tasks.hallucination.judges.tables import judge_table, paired_rows, verdict_frame
from evalsuite.tasks.hallucination.step import JudgeStep
from evalsuite.tasks.kit.document import fit_document, kept_document

KEY = "sk-test-0a1b2c3d4e5f-never-on-disk"


def xsum_rows(n: int) -> list[dict]:
    """XSum-shaped rows; documents of odd rows mention a zebra (the test judge's marker)."""
    return [{"id": str(i), "summary": f"{100 + i} volunteers cleaned a beach in Riverton.",
             "document": f"Officials in Riverton said on Monday that {100 + i} volunteers cleaned the beach. "
                         f"The mayor, Anna Berg, thanked them." + (" A zebra was seen nearby." if i % 2 else "")}
            for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def task(**params: str):
    return make_task("hallucination", params)


def plan(the_task) -> list:
    """The task's samples, planned as a run plans them (prepare, then plan)."""
    return the_task.plan(the_task.prepare(None))


def fake(max_context: int = 1 << 20, chat: bool = False) -> FakeModel:
    return FakeModel("echo", FakeOptions(max_context=max_context, chat_template=chat))


def files_text(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


# ---- data ------------------------------------------------------------------------------------


def test_local_files_in_every_format_with_field_names(tmp_path):
    write_jsonl(tmp_path / "x.jsonl", xsum_rows(4))  # xsum's own field names
    pd.DataFrame({"text": ["Doc A.", "Doc B."], "gold": ["A", "B"]}).to_csv(tmp_path / "g.csv", index=False)
    pd.DataFrame({"context": ["Passage one. Passage two."], "input": ["Which passage?"],
                  "answers": [["one", "two"]]}).to_parquet(tmp_path / "lb.parquet")
    rows = task(dataset="xsum", data=str(tmp_path / "x.jsonl")).read_rows()
    assert [r.references for r in rows[:2]] == [("100 volunteers cleaned a beach in Riverton.",),
                                                ("101 volunteers cleaned a beach in Riverton.",)]
    generic = task(data=str(tmp_path / "g.csv"), document_field="text", reference_field="gold").read_rows()
    assert [(r.document, r.references) for r in generic] == [("Doc A.", ("A",)), ("Doc B.", ("B",))]
    longbench = task(dataset="hotpotqa", data=str(tmp_path / "lb.parquet")).read_rows()
    assert longbench[0].question == "Which passage?" and longbench[0].references == ("one", "two")


def test_missing_fields_and_files_are_clear_errors(tmp_path):
    pd.DataFrame({"text": ["Doc."], "gold": ["A"]}).to_csv(tmp_path / "g.csv", index=False)
    with pytest.raises(UserError, match=r"no document column .*columns: text, gold; name it with -T document_field"):
        task(data=str(tmp_path / "g.csv")).read_rows()
    with pytest.raises(UserError, match=r"-T reference_field=answer: no such column"):
        task(data=str(tmp_path / "g.csv"), document_field="text", reference_field="answer").read_rows()
    write_jsonl(tmp_path / "qa.jsonl", [{"document": "d", "reference": "r"}])
    with pytest.raises(UserError, match="no question column"):
        task(dataset="qasper", data=str(tmp_path / "qa.jsonl")).read_rows()
    with pytest.raises(UserError, match="data file not found"):
        task(data=str(tmp_path / "nope.jsonl")).read_rows()
    with pytest.raises(UserError, match=r"did you mean '2wikimqa'"):
        task(dataset="2wikiqa")
    with pytest.raises(UserError, match="truncate must be middle or end"):
        task(truncate="start")


def test_a_relative_data_path_is_kept_absolute_and_the_task_keeps_no_state(tmp_path, monkeypatch):
    """`evalsuite score` finds the data from any folder: the run's parameters name it absolutely."""
    from evalsuite.params import to_jsonable

    write_jsonl(tmp_path / "x.jsonl", xsum_rows(3))
    monkeypatch.chdir(tmp_path)
    the_task = task(data="x.jsonl")
    assert to_jsonable(the_task)["data"] == str((tmp_path / "x.jsonl").resolve()) == the_task.data
    assert task(data="").data == "" and to_jsonable(task())["data"] == ""
    assert the_task.prepare(None) == the_task.prepare(None)  # read afresh into the state each time
    assert set(vars(the_task)) == {f.name for f in dataclasses.fields(the_task)}  # nothing cached on the task


def test_the_hub_copy_is_only_reached_through_datasets_and_fails_clearly_offline():
    assert os.environ["HF_DATASETS_OFFLINE"] == "1"  # set by conftest: no test reaches the hub
    with pytest.raises(UserError, match=r"could not load cnn_dailymail \(abisee/cnn_dailymail\): .*pass -T data=PATH"):
        task(dataset="cnn_dailymail").read_rows()


def test_qasper_in_its_nested_form_gives_the_full_paper(tmp_path):
    def answer(**fields):
        base = {"unanswerable": False, "extractive_spans": [], "yes_no": None, "free_form_answer": "",
                "evidence": [], "highlighted_evidence": []}
        return {"answer": {**base, **fields}, "annotation_id": "a", "worker_id": "w"}

    paper = {
        "id": "p1", "title": "Sparse Widgets", "abstract": "We study widgets.",
        "full_text": [{"section_name": "Introduction", "paragraphs": ["Widgets matter."]},
                      {"section_name": "Results", "paragraphs": ["Accuracy rose to 91 percent.", ""]}],
        "qas": [{"question": "Is it open source?", "question_id": "q0", "answers": [answer(unanswerable=True)]},
                {"question": "What accuracy?", "question_id": "q1",
                 "answers": [answer(extractive_spans=["91 percent"]), answer(free_form_answer="About 91%.")]}],
    }
    unanswerable = {**paper, "id": "p2", "qas": [paper["qas"][0]]}
    write_jsonl(tmp_path / "qasper.jsonl", [paper, unanswerable, paper])
    rows = task(dataset="qasper", data=str(tmp_path / "qasper.jsonl")).read_rows()
    assert [r.index for r in rows] == [0, 2]  # a paper with no answerable question is skipped
    row = rows[0]
    assert row.question == "What accuracy?" and row.references == ("91 percent", "About 91%.")
    assert row.document.startswith("Sparse Widgets\n\nAbstract\nWe study widgets.")
    assert "Results\nAccuracy rose to 91 percent." in row.document  # beyond the abstract


def test_the_plan_is_a_fixed_seeded_sample(tmp_path):
    data = str(write_jsonl(tmp_path / "x.jsonl", xsum_rows(40)))
    ids = [s.id for s in plan(task(data=data, samples="5"))]
    assert ids == [s.id for s in plan(task(data=data, samples="5"))]
    assert ids != [s.id for s in plan(task(data=data, samples="5", seed="1"))]
    assert len(set(ids)) == 5 and all(i.startswith("xsum-0000") for i in ids)
    assert len(plan(task(data=data))) == 40  # fewer rows than samples: all of them
    assert task().samples == 100  # the paper's sample size


# ---- prompts and truncation ------------------------------------------------------------------


def test_prompts_hold_instruction_document_question_and_cue(tmp_path):
    qa = task(dataset="hotpotqa")
    prompt = qa.render(fake(), "Passage about Oslo.", "Where?")
    assert prompt.startswith(qa.source.instruction + "\n\nPassages:\nPassage about Oslo.")
    assert prompt.endswith("\n\nQuestion: Where?\n\nAnswer:")
    assert task().render(fake(), "An article.", "").endswith("Article:\nAn article.\n\nSummary:")
    chat = qa.render(fake(chat=True), "Passage.", "Where?")
    assert chat.startswith("<user>") and chat.endswith("Question: Where?</user><assistant>")
    data = str(write_jsonl(tmp_path / "x.jsonl", xsum_rows(3)))
    xsum = task(data=data)
    state = xsum.prepare(fake())
    [request], info = xsum.requests(xsum.plan(state)[0], fake(), state)
    assert request.max_new_tokens == 64 and request.stop == ("\n",)
    assert info["doc_tokens_cut"] == 0 and not info["truncated"] and info["prompt_tokens"] == len(request.prompt) + 1


@pytest.mark.parametrize("mode", ["middle", "end"])
def test_only_the_document_is_cut_and_the_cut_is_counted(mode):
    document = " ".join(f"word{i}" for i in range(400))
    model = fake(max_context=700)
    qa = task(dataset="hotpotqa", truncate=mode, max_new_tokens="20")
    render = lambda doc: qa.render(model, doc, "Which word comes first?")  # noqa: E731
    full = model.count_tokens(render(document))
    fitted = fit_document(document, render, model.count_tokens, 700 - 20, mode)
    assert fitted.tokens <= 680 < model.count_tokens(render(kept_document(document, (fitted.keep[0] + 1,
                                                                                    fitted.keep[1]))))
    assert fitted.cut_tokens == full - fitted.tokens > 0
    assert fitted.prompt.startswith(qa.source.instruction) and fitted.prompt.endswith(
        "Question: Which word comes first?\n\nAnswer:")
    head, tail = fitted.keep
    kept = kept_document(document, fitted.keep)
    words = kept.split()
    if mode == "middle":
        assert abs(head - tail) <= 1 and words[head] == "[...]"
        assert words[:head] + words[head + 1 :] == document.split()[:head] + document.split()[400 - tail :]
    else:
        assert tail == 0 and words == document.split()[:head]


def test_truncation_uses_the_models_own_tokenizer(tiny_models):
    from evalsuite.backends import load_model

    model = load_model(str(tiny_models["base"]), {"max_context": "160"}, device="cpu")
    document = " ".join(["The farmer carried a wooden basket near the river in the morning."] * 40)
    qa = task(dataset="hotpotqa", max_new_tokens="16")
    render = lambda doc: qa.render(model, doc, "Who carried the basket?")  # noqa: E731
    fitted = fit_document(document, render, model.count_tokens, 160 - 16)
    assert fitted.tokens == len(model.encode(fitted.prompt)) <= 144
    assert fitted.cut_tokens == len(model.encode(render(document))) - fitted.tokens > 0
    assert "Who carried the basket?" in fitted.prompt


def test_an_instruction_and_question_that_cannot_fit_are_an_error():
    qa = task(dataset="hotpotqa")
    model = fake(max_context=120)
    with pytest.raises(UserError, match="instruction and question alone take"):
        fit_document("some text " * 50, lambda d: qa.render(model, d, "Why? " * 30), model.count_tokens, 100)


# ---- judging end to end ----------------------------------------------------------------------


def test_run_with_the_lexical_judge_then_score_with_an_openai_endpoint(capsys, tmp_path, tiny_models):
    """The done-when: run + lexical judge writes records and a table; `score` re-judges them
    through a real local chat-completions server, beside the old verdicts."""
    data = write_jsonl(tmp_path / "xsum.jsonl", xsum_rows(12))
    out = tmp_path / "out"
    env_key = {**os.environ, "OPENAI_API_KEY": KEY}
    result = invoke(capsys, "run", "--model", str(tiny_models["base"]), "--task", "hallucination", "-T", "dataset=xsum",
                    "-T", f"data={data}", "-T", "samples=5", "--judge", "lexical", "--out", str(out),
                    "--device", "cpu", "--no-progress")
    assert result.returncode == 0, result.stderr
    [run] = [p for p in out.iterdir() if p.is_dir()]
    assert "| xsum | tiny-base | lexical (heuristic) |" in result.stdout and "heuristic" in result.stdout
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    lexical = JudgementFile(run / "judgements", "lexical").read()
    assert len(records) == 5 and set(lexical) == {r["id"] for r in records}
    assert "lexical (heuristic)" in (run / "judgements.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["judges"]["lexical"]["n"] == 5 and summary["judges"]["lexical"]["heuristic"]

    with ChatServer() as server:
        scored = subprocess_score(run, server.url, env_key)
        assert scored.returncode == 0, scored.stderr
        assert server.count == 5 and all(h["Authorization"] == f"Bearer {KEY}" for h in server.headers)
        assert {output_of(b).strip() for b in server.bodies} == {r["outputs"][0].strip() for r in records}
        assert "0 new verdicts" in score_here(run, server.url)
        assert server.count == 5  # nothing missing: nothing asked again
    verdicts = JudgementFile(run / "judgements", "openai:judge-x").read()
    rows = {r["id"]: r for r in xsum_rows(12)}
    assert {i: v.verdict for i, v in verdicts.items()} == {
        r["id"]: "zebra" in rows[str(int(r["id"].split("-")[1]))]["document"] for r in records}
    assert JudgementFile(run / "judgements", "lexical").read() == lexical  # the old verdicts stay
    summary = json.loads((run / "summary.json").read_text())
    assert set(summary["judges"]) == {"lexical", "openai:judge-x"}
    true = sum(v.verdict is True for v in verdicts.values())
    assert summary["judges"]["openai:judge-x"]["accuracy"] == pytest.approx(true / 5)
    assert "| xsum | tiny-base | openai:judge-x |" in scored.stdout
    assert KEY.encode() not in files_text(out) and KEY not in scored.stdout + scored.stderr


def subprocess_score(run: Path, url: str, env: dict, *extra: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "evalsuite.cli", "score", str(run), "--judge", "openai:judge-x",
                           "--judge-base-url", url, "--judge-backoff", "0.001", "--no-progress", *extra],
                          capture_output=True, text=True, env=env, timeout=300)


def score_here(run: Path, url: str, *extra: str) -> str:
    """`evalsuite score` in this process (faster than a subprocess); returns what it printed."""
    import contextlib
    import io

    from evalsuite.cli import cli

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cli.main(["score", str(run), "--judge", "openai:judge-x", "--judge-base-url", url, "--judge-backoff",
                  "0.001", "--no-progress", *extra], standalone_mode=False)
    return printed.getvalue()


def fake_run(tmp_path: Path, models: list[str], judge=None, n_rows: int = 10, samples: int = 6) -> list[Path]:
    data = write_jsonl(tmp_path / "xsum.jsonl", xsum_rows(n_rows))
    the_task = task(data=str(data), samples=str(samples))
    options = RunOptions(out=tmp_path / "out", progress=False, step=JudgeStep(judge) if judge else None)
    return [r.path for r in run_models(the_task, models, {}, "cpu", 4, options)]


def test_an_endpoint_that_stays_down_exits_with_one_line_and_a_rerun_finishes(tmp_path):
    [run] = fake_run(tmp_path, ["fake:echo"])
    # one request in flight, so exactly one sample uses up the retry budget before the run stops
    down = subprocess_score(run, closed_port_url(), dict(os.environ), "--judge-retries", "1",
                            "--judge-concurrency", "1")
    assert down.returncode == 2
    message = down.stderr.strip()
    assert "\n" not in message and message.startswith("error: judge endpoint http://127.0.0.1:")
    assert "connection failed" in message and "run the same command again" in message
    kept = JudgementFile(run / "judgements", "openai:judge-x").read()
    assert [v.status for v in kept.values()] == ["error"]  # the sample that used up the retry budget
    with ChatServer() as server:
        score_here(run, server.url)
    verdicts = JudgementFile(run / "judgements", "openai:judge-x").read()
    assert server.count == 6 and len(verdicts) == 6  # the failed sample is judged again, with the rest
    assert all(v.status == "judged" for v in verdicts.values())


def test_two_models_on_the_same_samples_get_a_paired_mcnemar_comparison(tmp_path):
    def judge_says(n, body, headers):  # echo writes an output, oracle writes none
        supported = ("zebra" in document_of(body)) == bool(output_of(body).strip())
        return Reply(content=f"Reasoning.\nConclusion: {supported}")

    with ChatServer(judge_says) as server:
        judge = make_judge(JudgeSettings(spec="openai:judge-x", base_url=server.url, progress=False),
                           tmp_path / "cache.sqlite")
        runs = fake_run(tmp_path, ["fake:echo", "fake:oracle"], judge=judge)
    frame = verdict_frame(runs)
    echo = frame[frame["model"] == "fake-echo"].set_index("id")["supported"]
    oracle = frame[frame["model"] == "fake-oracle"].set_index("id")["supported"].loc[echo.index]
    assert (echo != oracle).all()  # every pair is discordant by construction
    [row] = paired_rows(frame)
    assert (row["model_a"], row["model_b"]) == ("fake-echo", "fake-oracle")
    assert row == {**row, **mcnemar_exact(echo.tolist(), oracle.tolist())}
    assert row["only_a"] == int(echo.sum()) and row["only_b"] == int(oracle.sum()) and row["n"] == 6
    table = judge_table(runs, "openai:judge-x")
    assert f"| xsum | openai:judge-x | fake-echo | fake-oracle | 6 | {row['only_a']} | {row['only_b']} |" in table


def test_judged_accuracy_is_a_metric_that_check_gates_and_compare_shows(tmp_path, capsys):
    """A drop in judged accuracy alone (the empty-output rate unchanged) fails the gate."""
    def judge_says(n, body, headers):  # the baseline's outputs are all supported, the candidate's none
        return Reply(content=f"Conclusion: {'volunteers' in output_of(body)}")

    with ChatServer(judge_says) as server:
        judge = make_judge(JudgeSettings(spec="openai:judge-x", base_url=server.url, progress=False),
                           tmp_path / "cache.sqlite")
        data = write_jsonl(tmp_path / "xsum.jsonl", xsum_rows(40))
        runs = {}
        for name, model in (("good", "fake:target"), ("bad", "fake:echo")):
            options = RunOptions(out=tmp_path / name, progress=False, step=JudgeStep(judge))
            [run] = run_models(task(data=str(data), samples="40"), [model], {}, "cpu", 4, options)
            runs[name] = run.path
    metric = "judged_openai_judge-x"
    code, out, err = invoke(capsys, "check", str(runs["bad"]), "--baseline", str(runs["good"]))
    assert code == 1, err
    failed = [line.split("|")[2].strip() for line in out.splitlines() if "REGRESSION" in line]
    assert set(failed) <= {metric, f"{metric}_all"} and metric in failed, out  # empty_output is 0 in both runs
    assert invoke(capsys, "check", str(runs["good"]), "--baseline", str(runs["good"]))[0] == 0
    code, out, err = invoke(capsys, "compare", str(runs["good"]), str(runs["bad"]), "--out", str(tmp_path / "cmp"))
    assert code == 0, err
    assert f"| {metric} | 40 | 1.000 | 0.000 | +1.000" in out, out
    [written] = (tmp_path / "cmp").iterdir()
    assert (written / f"difference_{metric}.png").is_file()
    assert f"| {metric} (95% CI) |" in report_runs([runs["bad"]], plots=False)


def test_the_hf_judge_runs_through_the_adapter_and_unreadable_verdicts_count_apart(tmp_path, tiny_models):
    [run] = fake_run(tmp_path, ["fake:echo"], n_rows=6, samples=3)
    the_task = task(data=str(tmp_path / "xsum.jsonl"), samples="3")
    judge = make_judge(JudgeSettings(spec=f"hf:{tiny_models['diff']}", max_tokens=6, device="cpu"), tmp_path / "c")
    from evalsuite.engine.runner import finish
    from evalsuite.runs.records import RunFolder

    outcome = JudgeStep(judge).judge_run(RunFolder(run), progress=False)
    finish(the_task, RunFolder(run))
    assert outcome.new == 3 and all(v.status == "unparseable" and v.response for v in outcome.verdicts.values())
    summary = json.loads((run / "summary.json").read_text())["judges"][judge.name]
    assert (summary["n"], summary["unparseable"], summary["true"], summary["accuracy"]) == (3, 3, 0, 0.0)
    assert "hf:" in report_runs([run], plots=False) and "| 3 | 3 | 0 | 0 | 0.000" in report_runs([run], plots=False)


def test_unjudged_samples_have_no_judged_value_and_count_as_not_true_over_all_samples(tmp_path):
    """Of 6 samples, one judge call failed and one was never judged: `judged_lexical` has no
    value for those two (a gate sees them), `judged_lexical_all` counts them as not True."""
    from scipy.stats import binomtest

    from evalsuite.analysis.side_scores import scored_records, side_metrics
    from evalsuite.engine.runner import finish
    from evalsuite.runs.records import RunFolder
    from evalsuite.tasks.hallucination.judges import Verdict

    [run] = fake_run(tmp_path, ["fake:target"], judge=make_judge(JudgeSettings(spec="lexical"), tmp_path / "c"))
    store = JudgementFile(run / "judgements", "lexical")
    verdicts = store.read()
    ids = sorted(verdicts)
    assert all(v.verdict is True for v in verdicts.values())  # the references are supported
    store.path.unlink()
    store.append([verdicts[i] for i in ids[:4]] + [Verdict(ids[4], "lexical", "error", None, error="HTTP 400")])
    folder = RunFolder(run)
    finish(task(data=str(tmp_path / "xsum.jsonl"), samples="6"), folder)

    assert side_metrics(folder) == ("judged_lexical", "judged_lexical_all")
    scores = {r.id: (r.scores["judged_lexical"], r.scores["judged_lexical_all"]) for r in scored_records(folder)}
    assert scores == {**{i: (1.0, 1.0) for i in ids[:4]}, ids[4]: (None, 0.0), ids[5]: (None, 0.0)}
    summary = json.loads((run / "summary.json").read_text())["judges"]["lexical"]
    assert {k: summary[k] for k in ("n", "true", "errors", "missing", "unjudged", "n_all")} == {
        "n": 4, "true": 4, "errors": 1, "missing": 1, "unjudged": 2, "n_all": 6}
    assert (summary["accuracy"], summary["accuracy_all"]) == (1.0, pytest.approx(4 / 6))
    wilson = binomtest(4, 6).proportion_ci(method="wilson")
    assert (summary["accuracy_all_low"], summary["accuracy_all_high"]) == pytest.approx((wilson.low, wilson.high))
    table = judge_table([run])
    assert "| accuracy, unjudged not True (95% CI) | all |" in table
    assert "| xsum | fake-target | lexical (heuristic) | 1.000 [0.510, 1.000] | 4 | 0 | 1 | 1 | 0.667 [0.300, 0.903] | 6 |" \
        in table, table
    assert "Unjudged samples (a judge error, or not judged yet): 2." in table
    report = report_runs([run], plots=False)
    assert "judged_lexical_all" in report and "Unjudged samples (a judge error, or not judged yet): 2." in report


def test_judging_resumes_after_a_kill_and_records_are_untouched(tmp_path):
    lexical = make_judge(JudgeSettings(spec="lexical"), tmp_path / "c")
    [run] = fake_run(tmp_path, ["fake:echo"], judge=lexical)
    samples_before = (run / "samples.jsonl").read_bytes()
    store = run / "judgements" / "lexical.jsonl"
    lines = store.read_bytes().splitlines(keepends=True)
    store.write_bytes(b"".join(lines[:2]) + lines[2][:20])  # killed while writing the third verdict
    from evalsuite.runs.records import RunFolder

    outcome = JudgeStep(lexical).judge_run(RunFolder(run), progress=False)
    assert outcome.new == 4 and len(outcome.verdicts) == 6
    assert (run / "samples.jsonl").read_bytes() == samples_before
    assert len(store.read_bytes().splitlines()) == 6


def test_score_refuses_what_it_cannot_judge(tmp_path, capsys):
    from evalsuite.cli import cli

    with pytest.raises(UserError, match="task needle has no judging step; --judge is for tasks such as hallucination"):
        cli.main(["run", "--model", "fake", "--task", "needle", "-T", "lengths=256", "--out", str(tmp_path),
                  "--judge", "lexical"], standalone_mode=False)
    with pytest.raises(UserError, match="--judge-retries works with --task .*not with --suite"):
        cli.main(["run", "--model", "fake", "--suite", "ci-smoke", "--judge-retries", "2"], standalone_mode=False)
    [run] = fake_run(tmp_path, ["fake:echo"])
    code, out, err = invoke(capsys, "score", str(run))  # no step asked for: one line, no traceback
    assert (code, out, err) == (2, "", "error: nothing to do: give --judge (see `evalsuite score --help`)\n")
    with pytest.raises(UserError, match="not a run folder"):
        cli.main(["score", str(tmp_path), "--judge", "lexical"], standalone_mode=False)
    with pytest.raises(UserError, match="did you mean 'lexical'"):
        cli.main(["run", "--model", "fake", "--task", "hallucination", "--out", str(tmp_path),
                  "--judge", "lexicon"], standalone_mode=False)


def test_judging_refuses_a_data_file_that_changed_since_the_run(tmp_path):
    [run] = fake_run(tmp_path, ["fake:echo"])
    rows = xsum_rows(10)
    rows[int(json.loads((run / "samples.jsonl").read_text().splitlines()[0])["id"][-6:])]["document"] += " Edited."
    write_jsonl(tmp_path / "xsum.jsonl", rows)
    from evalsuite.runs.records import RunFolder

    with pytest.raises(UserError, match="differs from .*judge with the data the run was made from"):
        JudgeStep(make_judge(JudgeSettings(spec="lexical"), tmp_path / "c")).judge_run(RunFolder(run))
    assert not (run / "judgements" / "lexical.jsonl").exists()
