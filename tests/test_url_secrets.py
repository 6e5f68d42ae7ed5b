"""No credential or query value of a URL in any output, and no path built from a run folder's
fields outside its root.

A `server:` run, the reports of it, an openai judge and a webhook are given URLs with
`user:password@` and a token among their query values, against local servers
(tests/completions_server.py, tests/chat_server.py); every output (stdout, stderr, every file
written) is searched for the secrets. The servers still get them: the token in each request's
query, user:password as Basic authorization. A run folder whose config.json names its model
`../../..` has its TensorBoard files written under --tensorboard-dir and its lm-eval export
refused.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from chat_server import ChatServer, closed_port_url
from completions_server import CompletionsServer
from conftest import invoke

from evalsuite.backends import load_model
from evalsuite.integrations.webhook import message, post
from evalsuite.runs.urls import REDACTED, public_url, scrub_url

USER, PASSWORD, TOKEN = "evaluser", "pw-5f4e3d2c1b-never-shown", "tok-9a8b7c6d5e-never-shown"
SECRETS = (PASSWORD, TOKEN)
NEEDLE = ("--task", "needle", "-T", "lengths=256", "-T", "depths=0,1", "-T", "samples=2", "--no-progress")


def with_secrets(url: str) -> str:
    """`url` (http://127.0.0.1:PORT/...) carrying a user:password and a token in its query."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{USER}:{PASSWORD}@{rest}?api-key={TOKEN}&region=eu"


def leaks(*texts: str, folder: Path | None = None) -> list[str]:
    """Each secret (whole, or its first half) found in `texts` or in any file under `folder`."""
    blobs = [text.encode() for text in texts]
    if folder is not None:
        blobs += [path.read_bytes() for path in folder.rglob("*") if path.is_file()]
    found = []
    for secret in SECRETS:
        for piece in (secret, secret[:len(secret) // 2]):
            if any(piece.encode() in blob for blob in blobs):
                found.append(piece)
    return found


# ---- the one redaction -------------------------------------------------------------------------

@pytest.mark.parametrize(("url", "shown"), [
    ("http://u:p%40ss@127.0.0.1:8000/v1?api-key=abc&x=1#frag",
     f"http://127.0.0.1:8000/v1?api-key={REDACTED}&x={REDACTED}#{REDACTED}"),
    ("https://host.example/v1?sk-bare-token", f"https://host.example/v1?{REDACTED}"),
    ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ("not a url at all", REDACTED),
])
def test_public_url_leaves_out_credentials_and_query_values(url, shown):
    assert public_url(url) == shown


def test_a_webhooks_path_is_its_secret_and_messages_are_scrubbed():
    hook = "https://hooks.example/services/T000/B000/XXXXsecretXXXX?token=abcdef"
    assert public_url(hook, path=False) == f"https://hooks.example/{REDACTED}?token={REDACTED}"
    said = "nonnumeric port: 'pw-5f4e3d2c1b@host' at /services/T000/B000/XXXXsecretXXXX (abcdef, HTTP 401)"
    scrubbed = scrub_url(said, "http://user:pw-5f4e3d2c1b@host/services/T000/B000/XXXXsecretXXXX?token=abcdef",
                         path=False)
    assert "pw-5f4e3d2c1b" not in scrubbed and "XXXXsecret" not in scrubbed and "abcdef" not in scrubbed
    assert "HTTP 401" in scrubbed  # a short value is not hunted through the message


# ---- a server run, its reports and a judge ------------------------------------------------------

@pytest.fixture(scope="module")
def hf():
    return load_model("toy-base", {}, device="cpu")


def test_a_server_run_and_everything_made_of_it_hold_no_secret(hf, tmp_path, capsys):
    out = tmp_path / "results"
    said = []
    with CompletionsServer(hf) as server:
        code, stdout, err = invoke(capsys, "run", "--model", "server:toy-base", "-M",
                                   f"base_url={with_secrets(server.url)}", "-M", "tokenizer=toy-base", *NEEDLE,
                                   "--out", str(out), "--log-to", "tensorboard")
        said += [stdout, err]
        assert code == 0, err
    # the server got what the URL carries: the token in every request's query, the password as Basic authorization
    assert server.seen and all(f"api-key={TOKEN}" in path for _, path, _ in server.seen)
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert all(headers.get("Authorization") == basic for _, _, headers in server.seen)
    (run,) = (p for p in out.iterdir() if p.name.startswith("needle-"))
    recorded = json.loads((run / "config.json").read_text())["model"]["base_url"]
    assert recorded == server.url + f"?api-key={REDACTED}&region={REDACTED}"
    for command in (["report", str(run), "--html", str(tmp_path / "report.html")],
                    ["view", str(out), "--write", str(tmp_path / "page.html")],
                    ["export", str(run), "--out", str(tmp_path / "export")],
                    ["log", str(run), "--to", "tensorboard", "--tensorboard-dir", str(tmp_path / "tb")]):
        code, stdout, err = invoke(capsys, *command)
        assert code == 0, (command, err)
        said += [stdout, err]
    assert leaks(*said, folder=tmp_path) == []


def test_a_server_that_fails_is_named_without_its_secrets(tmp_path, capsys):
    for url in (with_secrets(closed_port_url()), with_secrets("http://127.0.0.1:notaport/v1")):
        code, stdout, err = invoke(capsys, "run", "--model", "server:toy-base", "-M", f"base_url={url}", "-M",
                                   "retries=0", *NEEDLE, "--out", str(tmp_path))
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        assert leaks(stdout, err, folder=tmp_path) == [], err


def test_a_judge_endpoint_is_written_and_named_without_its_secrets(tmp_path, capsys):
    data = tmp_path / "xsum.jsonl"
    data.write_text("".join(json.dumps({"id": str(i), "summary": "A beach was cleaned.",
                                        "document": "Volunteers cleaned a beach. A zebra was seen."}) + "\n"
                            for i in range(3)), encoding="utf-8")
    code, _, err = invoke(capsys, "run", "--model", "fake:echo", "--task", "hallucination", "-T", "dataset=xsum",
                          "-T", f"data={data}", "-T", "samples=3", "--out", str(tmp_path / "out"), "--no-progress")
    assert code == 0, err
    (run,) = (p for p in (tmp_path / "out").iterdir() if p.is_dir())
    with ChatServer() as judge:
        code, stdout, err = invoke(capsys, "score", str(run), "--judge", "openai:judge-x", "--judge-base-url",
                                   with_secrets(judge.url), "--no-progress")
    assert code == 0 and judge.count == 3, err
    assert all(f"api-key={TOKEN}" in path for _, path, _ in judge.seen)
    settings = json.loads((run / "judgements" / "openai_judge-x.json").read_text())["settings"]
    assert settings["endpoint"] == judge.url + f"?api-key={REDACTED}&region={REDACTED}"
    code, stdout2, err2 = invoke(capsys, "score", str(run), "--judge", "openai:judge-y", "--judge-base-url",
                                 with_secrets(closed_port_url()), "--judge-retries", "0", "--no-progress")
    assert code == 2 and "judge endpoint" in err2, err2
    assert leaks(stdout, err, stdout2, err2, folder=tmp_path) == []


# ---- a webhook --------------------------------------------------------------------------------

@pytest.fixture
def failing_webhook():
    """A local webhook that refuses every post with a 403, after noting its path and headers."""
    seen: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append((self.path, dict(self.headers.items())))
            self.send_response(403)
            self.end_headers()
            self.wfile.write(b"forbidden")

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/services/T0/B0/{TOKEN}", seen
    server.shutdown()
    server.server_close()


def test_a_webhook_that_fails_is_named_without_its_secrets(failing_webhook, capsys):
    url, seen = failing_webhook
    assert not post(with_secrets(url), message("REGRESSED at step 3", []))
    err = capsys.readouterr().err
    assert err.startswith("warning: webhook http://127.0.0.1:") and "did not take" in err and "403" in err, err
    [(path, headers)] = seen  # it was posted, with its credentials
    assert TOKEN in path and headers["Authorization"].startswith("Basic ")
    assert not post(with_secrets(closed_port_url() + "/hook"), message("x", []))  # nobody listening
    assert not post(f"http://{USER}:{PASSWORD}@127.0.0.1:notaport/hook?token={TOKEN}", message("x", []))
    err += capsys.readouterr().err
    assert err.count("warning: webhook") == 3 and leaks(err) == [], err


def test_a_bad_webhook_url_is_refused_without_showing_it(tmp_path, capsys):
    (tmp_path / "train").mkdir()
    code, _, err = invoke(capsys, "watch", str(tmp_path / "train"), *NEEDLE, "--out", str(tmp_path / "out"), "--once",
                          "--webhook", f"ftp://{USER}:{PASSWORD}@hooks.example/x?token={TOKEN}")
    assert code == 2 and "--webhook takes an http" in err and leaks(err) == [], err


# ---- paths from a run folder's fields -----------------------------------------------------------

@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    from evalsuite.engine.runner import RunOptions, make_task, run_task

    root = tmp_path_factory.mktemp("crafted")
    task = make_task("needle", {"lengths": "1024", "depths": "0,1", "samples": "2"})
    return run_task(task, load_model("fake:oracle", {}, "cpu"), RunOptions(out=root / "runs", progress=False)).path


def _crafted(finished: Path, where: Path, name: str, family: str | None = None) -> Path:
    run = shutil.copytree(finished, where / "runs" / finished.name)
    config = json.loads((run / "config.json").read_text())
    config["model"]["name"] = name
    if family is not None:
        config["checkpoint"] = {"step": 1, "family": family}
    (run / "config.json").write_text(json.dumps(config), encoding="utf-8")
    # the records name their run's model too: rewritten alike, they stay the crafted run's own
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines() if line]
    lines = [json.dumps({**record, "model": name}) for record in records]
    (run / "samples.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return run


@pytest.mark.parametrize(("name", "family"), [("../../../escaped", None), ("/tmp/escaped", None),
                                              ("m", "../../../escaped"), ("..", "..")])
def test_tensorboard_files_stay_under_their_folder_whatever_config_json_names(finished, tmp_path, capsys, name,
                                                                             family):
    work = tmp_path / "a" / "b" / "c"
    run = _crafted(finished, work, name, family)
    code, _, err = invoke(capsys, "log", str(run), "--to", "tensorboard", "--tensorboard-dir", str(work / "tb"))
    assert code == 0, err
    written = [p for p in tmp_path.rglob("*") if p.is_file() and "events.out.tfevents" in p.name]
    assert written and all(p.resolve().is_relative_to((work / "tb").resolve()) for p in written), written
    assert [p.parent.parent for p in written] == [work / "tb"]  # one folder under it


@pytest.mark.parametrize("name", ["..", "."])
def test_an_export_whose_model_name_would_leave_its_folder_is_refused(finished, tmp_path, capsys, name):
    run = _crafted(finished, tmp_path, name)
    code, _, err = invoke(capsys, "export", str(run), "--out", str(tmp_path / "export" / "here"))
    assert code == 2 and err.count("\n") == 1 and "cannot name a folder" in err, err
    assert not (tmp_path / "export").exists()
