"""`evalsuite convert STATE_DICT --out FOLDER`: a plain state dict into a loadable model folder."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("convert")
@click.argument("state_dict", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Folder to write (config.json, model.safetensors, the tokenizer); must not hold files.")
@click.option("--key-map", "key_map", metavar="FILE|builtin:NAME", default=None,
              help="TOML of regular expression = new name rules ([rename]; '' drops a tensor), or a built-in map: "
              "builtin:diff-v2 (a standalone DIFF V2 model: the public attention module's names, "
              "evalsuite's around it), builtin:archscale-diff (DIFF V1 from lit-gpt/ArchScale into "
              "--arch diffllama). Default: names kept as they are.")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="A config.json whose fields (and model_type) describe the model.")
@click.option("--arch", type=click.Choice(["diffllama_v2", "diffllama", "llama"]), default=None,
              help="The model: DIFF V2, DIFF V1 (DiffLlama) or Llama (default: --config's model_type).")
@click.option("-C", "fields", multiple=True, metavar="KEY=VALUE",
              help="A config field, repeatable, over --config's (values read as JSON: 8, 1e-5, true, null).")
@click.option("--tokenizer", type=click.Path(path_type=Path), default=None,
              help="A folder whose tokenizer is copied into --out.")
@click.option("--allow-pickle", is_flag=True,
              help="Read a torch (pickle) file, which can run code when loaded: only for a file you trust.")
def convert(state_dict: Path, out: Path, key_map: str | None, config_file: Path | None, arch: str | None,
            fields: tuple[str, ...], tokenizer: Path | None, allow_pickle: bool) -> None:
    """Turn STATE_DICT (a .safetensors file, or a torch file with --allow-pickle) into a folder that
    `evalsuite run --model FOLDER` and AutoModelForCausalLM load: tensors renamed by --key-map, the
    config from --config and/or --arch with -C fields, every tensor checked against the shape the
    config gives it. A missing, unexpected or misshapen tensor is one line naming it (exit 2), and
    nothing is written."""
    from evalsuite import api
    from evalsuite.params import split_pairs

    done = api.convert(state_dict, out, key_map=key_map, config_file=config_file, arch=arch,
                       fields=split_pairs(fields, "-C"), tokenizer=tokenizer, allow_pickle=allow_pickle)
    click.echo(f"written: {done.folder} ({done.model_type}, {done.tensors} tensors, {done.parameters:,} parameters)")
