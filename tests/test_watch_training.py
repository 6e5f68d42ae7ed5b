"""The Trainer callback: a few real training steps of the toy model, a save every two, each save
evaluated (in the training process on the trainer's own model, or in a child process) and its
metrics in the trainer's log history at the save's step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from watch_checkpoints import NEEDLE, toy_base

from evalsuite.engine.watch import Ledger

STEPS, EVERY = 4, 2


def train(tmp_path: Path, extra_callbacks: tuple = (), **callback_options) -> tuple[list[dict], Path]:
    """Four steps of toy-base on a few sentences, saved at steps 2 and 4; the log history and the evaluations' folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    from evalsuite.integrations.training import EvalsuiteCallback

    tokenizer = AutoTokenizer.from_pretrained(toy_base())
    model = AutoModelForCausalLM.from_pretrained(toy_base())
    ids = tokenizer("The magic number of Paris is 1234567. " * 4)["input_ids"][:32]
    data = [{"input_ids": ids, "labels": ids} for _ in range(8)]
    out = tmp_path / "evals"
    args = TrainingArguments(output_dir=str(tmp_path / "run1"), max_steps=STEPS, save_steps=EVERY,
                             per_device_train_batch_size=2, learning_rate=1e-5, report_to=[], use_cpu=True,
                             logging_steps=1, disable_tqdm=True, save_strategy="steps")
    callback = EvalsuiteCallback(task="needle", params=NEEDLE, out=out, **callback_options)
    trainer = Trainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                      callbacks=[callback, *extra_callbacks])
    trainer.train()
    return trainer.state.log_history, out


@pytest.mark.parametrize("mode", ["in-process", pytest.param("process", marks=pytest.mark.slow)])  # slow: a process per save
def test_each_save_is_evaluated_and_its_metrics_are_in_the_log_history(tmp_path, mode):
    history, out = train(tmp_path, mode=mode)
    rows = [row for row in history if "evalsuite/needle/correct_all" in row]
    assert [row["step"] for row in rows] == [2, 4], history
    assert any("loss" in row for row in history)  # the trainer's own logs are there too
    entries = {e.step: e for e in Ledger(out).entries()}
    assert sorted(entries) == [2, 4] and all(e.status == "ok" for e in entries.values())
    for row in rows:
        (run,) = entries[row["step"]].runs
        config = json.loads((Path(run) / "config.json").read_text())
        assert config["checkpoint"] == {"step": row["step"], "step_from": "folder name", "family": "run1"}
        summary = json.loads((Path(run) / "summary.json").read_text())
        assert row["evalsuite/needle/correct_all"] == summary["overall"]["correct_all"]
        assert row["evalsuite/needle/n"] == summary["overall"]["n"] == 6
    assert "evalsuite/gate_failed" in rows[1]  # the second save was gated against the first
    assert (out / "trend" / "trend.csv").is_file()
    for step in (2, 4):  # each checkpoint's own state file has its evaluation, though written before it ended
        state = json.loads((tmp_path / "run1" / f"checkpoint-{step}" / "trainer_state.json").read_text())
        assert state["global_step"] == step  # the Trainer's state of that checkpoint, only the row added
        (kept,) = [row for row in state["log_history"] if "evalsuite/needle/correct_all" in row and row["step"] == step]
        assert kept == next(row for row in rows if row["step"] == step)


def test_a_regression_is_said_on_the_training_console(tmp_path, capsys):
    """After the save at step 2, layer 1's queries and keys are zeroed (the retrieval circuit gone,
    as watch_checkpoints' worse copy): the save at step 4 regresses, and the console says so."""
    from transformers import TrainerCallback

    class Damage(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 3:
                for name in ("q_proj", "k_proj"):
                    getattr(model.model.layers[1].self_attn, name).weight.data.zero_()

    capsys.readouterr()
    history, _ = train(tmp_path, extra_callbacks=(Damage(),), mode="in-process")
    err = capsys.readouterr().err
    assert [row["evalsuite/gate_failed"] for row in history if "evalsuite/gate_failed" in row] == [1]
    assert "checkpoint-4 (step 4) REGRESSED against step 2" in err, err[-2000:]


def test_a_suite_cannot_run_in_process_and_modes_are_checked():
    from evalsuite.errors import UserError
    from evalsuite.integrations.training import Evaluations

    with pytest.raises(UserError, match="in-process"):
        Evaluations(suite="smoke", mode="in-process")
    with pytest.raises(UserError, match="mode must be"):
        Evaluations(task="needle", mode="thread")
    with pytest.raises(UserError, match="one of them"):
        Evaluations()


def test_the_lightning_callback_says_what_to_install_when_lightning_is_missing():
    import importlib.util

    if importlib.util.find_spec("lightning") is not None:
        pytest.skip("Lightning is installed here")
    import evalsuite.integrations.training as training
    from evalsuite.errors import UserError

    with pytest.raises(UserError, match="pip install lightning"):
        training.EvalsuiteLightningCallback  # noqa: B018


def test_the_lightning_callback_evaluates_each_save_and_logs_its_metrics(tmp_path):
    lightning = pytest.importorskip("lightning")
    import torch
    from lightning.pytorch.loggers import CSVLogger
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from evalsuite.integrations.training import EvalsuiteLightningCallback

    tokenizer = AutoTokenizer.from_pretrained(toy_base())
    ids = torch.tensor([tokenizer("The magic number of Paris is 1234567. " * 4)["input_ids"][:32]] * 8)

    class ToyModule(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = AutoModelForCausalLM.from_pretrained(toy_base())

        def training_step(self, batch, _index):
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-5)

    out = tmp_path / "evals"
    callback = EvalsuiteLightningCallback(tmp_path / "run1", EVERY, task="needle", params=NEEDLE, out=out,
                                          tokenizer=tokenizer, mode="in-process")
    trainer = lightning.Trainer(max_steps=STEPS, accelerator="cpu", logger=CSVLogger(tmp_path / "logs"),
                                callbacks=[callback], enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(ToyModule(), torch.utils.data.DataLoader(ids, batch_size=2))
    entries = {e.step: e for e in Ledger(out).entries()}
    assert sorted(entries) == [2, 4] and all(e.status == "ok" for e in entries.values())
    (metrics,) = (tmp_path / "logs").rglob("metrics.csv")
    import csv

    rows = [row for row in csv.DictReader(metrics.open()) if row.get("evalsuite/needle/correct_all")]
    assert [int(row["step"]) for row in rows] == [2, 4]
    for row, step in zip(rows, (2, 4)):
        (run,) = entries[step].runs
        summary = json.loads((Path(run) / "summary.json").read_text())
        assert float(row["evalsuite/needle/correct_all"]) == pytest.approx(summary["overall"]["correct_all"])
