"""Hostile endpoints and damaged run folders: no piece of an API key reaches a file or the
terminal, the key never follows a redirect to another origin, an endpoint whose every reply is
malformed does not look like success, and damaged record fields are quarantined, never a
traceback."""

from __future__ import annotations

import json
import shutil
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from chat_server import ChatServer, LoopbackServer, Reply
from conftest import invoke, run_cli

from evalsuite.backends.common.http import HttpClient, HttpSettings, excerpt, redact
from evalsuite.runs import records
from evalsuite.runs.records import RunFolder

KEY = "sk-9f8E7d6C5b4A3f2E1d0C9b8A7f6E5d"  # 32 characters, mixed case, as a real key
JUDGE = ("--judge", "openai:judge-x", "--judge-retries", "1", "--judge-backoff", "0.001", "--no-progress")


def fragments(text: str | bytes, key: str = KEY, size: int = 8) -> list[str]:
    """Every run of `size` or more of the key's characters found in `text`, in any letter case."""
    lowered = (text.decode("utf-8", "replace") if isinstance(text, bytes) else text).lower()
    return [key[i:i + size] for i in range(len(key) - size + 1) if key[i:i + size].lower() in lowered]


def results_text(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


def xsum_data(folder: Path, n: int = 4) -> Path:
    """XSum-shaped rows for the hallucination task: what a judge is asked about."""
    path = folder / "xsum.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "summary": f"{i} volunteers cleaned a beach.",
                                        "document": f"Officials said {i} volunteers cleaned the beach."}) + "\n"
                            for i in range(n)), encoding="utf-8")
    return path


def judged_run(capsys, tmp_path: Path, url: str, *extra: str):
    data = xsum_data(tmp_path)
    return invoke(capsys, "run", "--model", "fake:echo", "--task", "hallucination", "-T", "dataset=xsum",
                  "-T", f"data={data}", "-T", "samples=4", *JUDGE, "--judge-base-url", url, *extra,
                  "--out", str(tmp_path / "out"))


def one_error_line(result) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ---- no piece of the key anywhere ----------------------------------------------------------------


@pytest.mark.parametrize("text, want", [
    (f"Bearer {KEY}", "Bearer [redacted]"),
    (f"Bearer {KEY.upper()}", "Bearer [redacted]"),
    (f"{KEY[:16]} and {KEY[16:].lower()}", "[redacted] and [redacted]"),
    (f"x{KEY[3:11]}y", "x[redacted]y"),  # 8 characters in a row: a piece
    (f"x{KEY[3:10]}y", f"x{KEY[3:10]}y"),  # 7: too short to tell from ordinary text
    (f"{KEY}{KEY}", "[redacted]"),
    ("nothing of it here", "nothing of it here"),
])
def test_the_key_and_every_piece_of_it_are_redacted(text, want):
    assert redact(text, KEY) == want
    assert redact(text, None) == text


def test_a_key_shorter_than_a_piece_is_redacted_whole():
    assert redact("token abc123 and ABC123", "abc123") == "token [redacted] and [redacted]"


def test_a_body_cut_at_the_read_limit_keeps_no_start_of_the_key():
    for padding in range(65536 - 40, 65536 + 1):  # the key's first 1..32 characters end the part read
        raw = (" " * padding + "Bearer " + KEY).encode()
        assert fragments(excerpt(raw, lambda text: redact(text, KEY), 300), size=2) == [], padding


ECHOES = {  # what a hostile endpoint sends back: padding, then the Authorization header it received
    "past the read limit": lambda auth: " " * 65509 + auth,
    "halves": lambda auth: "x" * 250 + auth[:23] + " ... " + auth[23:],
    "upper-cased": lambda auth: auth.upper() + " " * 100,
    "halves upper-cased at the limit": lambda auth: " " * 65400 + auth[:23].upper() + "\n" * 50 + auth[23:].upper(),
}


@pytest.mark.parametrize("status", [400, 500])
@pytest.mark.parametrize("echo", list(ECHOES))
def test_no_piece_of_the_key_reaches_the_results_or_the_terminal(capsys, tmp_path, monkeypatch, status, echo):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ChatServer(lambda n, body, headers: Reply(status=status,
                                                   raw=ECHOES[echo](headers["Authorization"]).encode())) as server:
        result = judged_run(capsys, tmp_path, server.url)
    assert server.count >= 1 and server.headers[0]["Authorization"] == f"Bearer {KEY}"
    assert "HTTP " + str(status) in one_error_line(result)  # every call failed: exit 2, one line
    assert fragments(results_text(tmp_path / "out")) == []
    assert fragments(result.stdout + result.stderr) == []


# ---- no key across origins -----------------------------------------------------------------------


class Redirector(LoopbackServer):
    """Answers a request for /moved/... with an empty JSON object, and any other with a redirect to
    `target` + /moved + its path; records the headers of each request."""

    def __init__(self, status: int = 302):
        self.target = ""
        redirector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def answer(self) -> None:
                redirector.seen.append((self.command, self.path, dict(self.headers.items())))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                moved = self.path.startswith("/moved/")
                self.send_response(200 if moved else status)
                if not moved:
                    self.send_header("Location", f"{redirector.target or redirector.origin}/moved{self.path}")
                self.send_header("Content-Length", "2" if moved else "0")
                self.end_headers()
                if moved:
                    self.wfile.write(b"{}")

            do_GET = do_POST = answer  # noqa: N815 (http.server's naming)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"


def port_of(server: LoopbackServer) -> int:
    return server.httpd.server_address[1]


def test_a_redirect_to_another_origin_is_refused_and_the_key_never_sent(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with ChatServer() as other, Redirector() as redirector:
        redirector.target = f"http://localhost:{port_of(other)}"
        result = judged_run(capsys, tmp_path, redirector.url)
    assert redirector.seen and redirector.seen[0][2]["Authorization"] == f"Bearer {KEY}"
    assert other.seen == []  # nothing reached the other origin, the key least of all
    line = one_error_line(result)
    assert "redirects to another origin" in line and f"localhost:{port_of(other)}" in line
    assert fragments(results_text(tmp_path / "out")) == [] and fragments(result.stdout + result.stderr) == []


@pytest.mark.parametrize("status", [302, 307])
@pytest.mark.parametrize("where", ["same origin", "another host", "another port", "another scheme"])
def test_redirects_are_followed_within_the_origin_only(monkeypatch, status, where):
    monkeypatch.setenv("THE_KEY", KEY)
    with ChatServer() as other, Redirector(status) as redirector:
        redirector.target = {"same origin": "", "another host": f"http://localhost:{port_of(redirector)}",
                             "another port": f"http://127.0.0.1:{port_of(other)}",
                             "another scheme": f"https://127.0.0.1:{port_of(redirector)}"}[where]
        client = HttpClient(HttpSettings(base_url=redirector.url, api_key_env="THE_KEY", retries=0))
        result = client.call("/models", None, lambda raw: raw)
    if where == "same origin":
        assert result.outcome == "ok" and result.content == b"{}"
        assert [(method, path) for method, path, _ in redirector.seen] == [("GET", "/v1/models"),
                                                                           ("GET", "/moved/v1/models")]
        assert redirector.seen[1][2]["Authorization"] == f"Bearer {KEY}"  # within the origin the key goes along
    else:
        assert result.outcome == "fatal" and "redirects to another origin" in result.error
        assert len(redirector.seen) == 1 and other.seen == []


# ---- an endpoint that only ever answers badly -------------------------------------------------------


def chat_body(content: object) -> bytes:
    return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()


@pytest.mark.parametrize("reply", [
    Reply(raw=b"<!DOCTYPE html><html><body>Welcome to nginx!</body></html>"),
    Reply(raw=b""),
    Reply(raw=chat_body("")),
    Reply(raw=chat_body("   \n")),
    Reply(raw=chat_body(None)),
    Reply(raw=chat_body(["Conclusion: True"])),
], ids=["an html page", "an empty 200", "empty content", "blank content", "null content", "a list"])
def test_an_endpoint_whose_every_reply_is_malformed_is_an_error_not_success(capsys, tmp_path, reply):
    with ChatServer(lambda n, body, headers: reply) as server:
        result = judged_run(capsys, tmp_path, server.url)
    assert server.count == 8  # each of the 4 samples: the first try and one retry
    line = one_error_line(result)
    assert "all 4 judge calls failed" in line and "run the same command again" in line, line
    assert "new verdicts" not in result.stdout
    [run] = (tmp_path / "out").glob("hallucination-*")
    verdicts = [json.loads(v) for v in (run / "judgements" / "openai_judge-x.jsonl").read_text().splitlines()]
    assert [v["status"] for v in verdicts] == ["error"] * 4  # recorded per sample, judged again on a rerun
    with ChatServer() as healthy:  # the endpoint is mended: the same command finishes the job
        again = judged_run(capsys, tmp_path, healthy.url)
    assert again.returncode == 0, again.stderr
    assert healthy.count == 4
    latest = {v["id"]: v["status"] for v in map(json.loads, (run / "judgements" / "openai_judge-x.jsonl")
                                                 .read_text().splitlines())}
    assert list(latest.values()) == ["judged"] * 4


def test_one_good_reply_among_malformed_ones_is_not_an_endpoint_failure(capsys, tmp_path):
    def mostly_broken(n, body, headers):
        return Reply(content="It is supported.\nConclusion: True") if "Officials said 2 " in json.dumps(body) \
            else Reply(raw=b"<html>")

    with ChatServer(mostly_broken) as server:
        result = judged_run(capsys, tmp_path, server.url)
    assert result.returncode == 0, result.stderr
    assert server.count == 7  # three samples retried once, one answered at once


# ---- damaged record fields -------------------------------------------------------------------------

SMALL = ("--task", "needle", "-T", "lengths=1024", "-T", "depths=0,1", "-T", "samples=2", "--no-progress")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[str, Path]:
    """Two finished needle runs of 4 samples: the oracle's (to damage) and a wrong model's."""
    out = tmp_path_factory.mktemp("finished")
    runs = {}
    for model in ("fake", "fake:wrong"):
        result = run_cli("run", "--model", model, *SMALL, "--out", str(out / model.replace(":", "-")))
        assert result.returncode == 0, result.stderr
        [runs[model]] = (out / model.replace(":", "-")).glob("needle-*")
    return runs


def damaged_copy(finished: dict[str, Path], tmp_path: Path, damage) -> tuple[Path, bytes]:
    """A copy of the oracle's run whose second line is damaged; the damaged line."""
    folder = Path(shutil.copytree(finished["fake"], tmp_path / "out" / finished["fake"].name))
    lines = (folder / "samples.jsonl").read_bytes().splitlines(keepends=True)
    record = json.loads(lines[1])
    damage(record)
    lines[1] = (json.dumps(record) + "\n").encode()
    (folder / "samples.jsonl").write_bytes(b"".join(lines))
    return folder, lines[1]


def setter(section: str | None, key: str, value: object):
    def apply(record: dict) -> None:
        (record[section] if section else record)[key] = value
    return apply


DAMAGES = {  # what a line holds -> what the warning says of it
    "target null": (setter(None, "target", None), "'target' is not a list of strings"),
    "target a number": (setter(None, "target", 2497472), "'target' is not a list of strings"),
    "target of numbers": (setter(None, "target", [2497472]), "'target' is not a list of strings"),
    "score text": (setter("scores", "correct_all", "yes"), "scores 'correct_all' is text where"),
    "score a list": (setter("scores", "correct_all", [1, 2]), "scores 'correct_all' is a list or object where"),
    "score an object": (setter("scores", "correct_mean", {"mean": 1}), "scores 'correct_mean' is a list or object"),
    "axis an object": (setter("axes", "context_length", {"a": 1}), "axis 'context_length' is not text, a number"),
    "axis a list": (setter("axes", "depth", [0.5]), "axis 'depth' is not text, a number"),
    "axis text for numbers": (setter("axes", "context_length", "abc"), "axes 'context_length' is text where"),
    "no run hash": (lambda record: record.pop("run"), "'run' is not a non-empty string"),
    "an empty run hash": (setter(None, "run", ""), "'run' is not a non-empty string"),
    "id a number": (setter(None, "id", 7), "'id' is not a non-empty string"),
    "outputs null": (setter(None, "outputs", None), "'outputs' is not a list"),
    "error a number": (setter(None, "error", 3), "'error' is neither text nor null"),
    "scores a list": (setter(None, "scores", [1]), "'scores' is not an object"),
    "an unknown field": (setter(None, "extra", 1), "unexpected keyword argument 'extra'"),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_damaged_field_is_left_out_then_quarantined_with_one_warning(capsys, finished, tmp_path, case):
    damage, why = DAMAGES[case]
    folder, bad = damaged_copy(finished, tmp_path, damage)
    run = RunFolder(folder)
    for _ in range(3):  # a command reads a run several times: it warns once
        assert len(run.read_records()) == 3
    warned = capsys.readouterr().err
    assert warned.count("warning: ") == 1 and "left out 1 damaged line(s)" in warned and why in warned, warned
    assert len(run.read_records(repair=True)) == 3
    moved = capsys.readouterr().err
    assert moved.count("warning: ") == 1 and "moved 1 damaged line(s) to samples.rejected.jsonl" in moved, moved
    assert (folder / "samples.rejected.jsonl").read_bytes() == bad
    assert len((folder / "samples.jsonl").read_bytes().splitlines()) == 3
    run.read_records()
    assert capsys.readouterr().err == ""  # nothing left to warn about


def test_a_record_of_the_same_task_and_model_with_another_seeds_hash_is_foreign(capsys, finished, tmp_path):
    folder, bad = damaged_copy(finished, tmp_path, setter(None, "run", "0" * 64))
    assert len(RunFolder(folder).read_records(repair=True)) == 3
    assert "1 from another run" in capsys.readouterr().err
    assert (folder / "samples.rejected.jsonl").read_bytes() == bad


@pytest.mark.parametrize("kinds, odd", [
    ([1024, 1024, "abc"], [2]),
    (["abc", 1024], [0]),  # a tie counts for numbers
    (["a", "b", 7], [2]),  # a number where the others hold text is damage too
    ([True, 1, 0.5, None], []),  # true/false, numbers and null are of one kind
    ([[1], [2], 3], [2]),  # a list that most records hold (the needle's per-needle hits) stays
])
def test_a_field_holds_one_kind_of_value_across_the_run(kinds, odd):
    from evalsuite.runs.record_format import odd_kinds
    from evalsuite.runs.records import Record

    records = [Record(id=str(i), task="t", model="m", axes={}, target=(), prompt={}, info={}, outputs=(),
                      scores={"x": value}, run="h") for i, value in enumerate(kinds)]
    assert sorted(odd_kinds(records)) == odd


ISSUE_CASES = ["target null", "target a number", "score text", "score a list", "axis an object",
               "axis text for numbers", "no run hash"]


@pytest.mark.parametrize("case", ISSUE_CASES)
def test_report_compare_and_check_read_the_good_lines_and_a_resume_quarantines_the_bad(capsys, finished, tmp_path,
                                                                                      case):
    folder, bad = damaged_copy(finished, tmp_path, DAMAGES[case][0])
    commands = {"report": ("report", str(folder), "--no-plots"),
                "compare": ("compare", str(folder), str(finished["fake:wrong"]), "--out", str(tmp_path / "cmp")),
                # three good pairs reach p = 0.13 at best: at alpha 0.2 the check has something to test
                "check": ("check", str(folder), "--baseline", str(finished["fake"]), "--alpha", "0.2")}
    for name, args in commands.items():
        records._WARNED.clear()  # a user's every command is a process of its own, which has warned of nothing
        result = invoke(capsys, *args)
        assert "Traceback" not in result.stderr, (name, result.stderr)
        assert result.returncode == 0, (name, result.stderr)
        assert result.stderr.count("warning: ") == 1 and "1 damaged" in result.stderr, (name, result.stderr)
    assert "n=3)" in invoke(capsys, "report", str(folder), "--no-plots").stdout  # the three good lines
    (folder / "summary.json").unlink()
    resumed = invoke(capsys, "run", "--model", "fake", *SMALL, "--out", str(folder.parent))
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count("warning: ") == 1 and "moved 1 damaged" in resumed.stderr, resumed.stderr
    assert (folder / "samples.rejected.jsonl").read_bytes() == bad
    ids = [json.loads(line)["id"] for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert sorted(ids) == sorted(json.loads(line)["id"] for line in
                                 (finished["fake"] / "samples.jsonl").read_text().splitlines())
