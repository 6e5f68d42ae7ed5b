"""The vllm adapter: a checkpoint in an in-process `vllm.LLM`, fed evalsuite's own token ids."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from evalsuite.backends import resolve_spec
from evalsuite.backends.common.checkpoint import (
    config_content_sha256,
    locate,
    refuse_pickle,
    sha256_json,
    vocabulary_sha256,
    weight_files,
    weights_fingerprint,
)
from evalsuite.backends.common.tokens import TokenRules, eos_ids
from evalsuite.errors import UserError, first_line
from evalsuite.params import build_params
from evalsuite.types import GenerationRequest, Loglikelihood, LoglikelihoodRequest

from . import scoring
from .choices import constrained
from .options import VLLMOptions, check_device, engine_arguments, quiet_defaults


class VLLMModel:
    """A checkpoint served by an in-process `vllm.LLM` behind the model adapter interface.

    Prompts reach vLLM as token ids made by `tokens`, the token rules the hf backend follows
    too (backends.common.tokens), so that the two backends see the same tokens and their
    records compare; answers end where hf's decoding loop ends them. Its capabilities, all from
    vLLM's outputs (prompt log-probs, its tokenizer, its prefix cache): TOKEN_IDS,
    TOKEN_LOGLIKELIHOOD, TOKEN_NLL and PREFIX_CACHE; no hooks into its kernels, so none of the
    attention or activation ones."""

    def __init__(self, llm: Any, tokenizer: Any, options: VLLMOptions, source: dict[str, Any]):
        self.llm = llm
        self.tokenizer = tokenizer
        self.options = options
        self.source = source
        self.name = source["label"]
        self.chat_template = options.chat_template
        self.max_context = int(llm.model_config.max_model_len)
        self.eos_ids = eos_ids(tokenizer, generation_eos(source["path"]))
        self.tokens = TokenRules(tokenizer, self.chat_template, self.eos_ids)
        self.cached_prompt_tokens = 0  # prompt tokens served from vLLM's prefix cache so far (benchmarks, tests)
        if self.chat_template and not getattr(tokenizer, "chat_template", None):
            raise UserError(f"-M chat_template=true but {self.name} has no chat template")

    # ---- what was loaded ------------------------------------------------------------------

    def fingerprint(self) -> dict[str, Any]:
        import transformers
        import vllm

        config = self.llm.model_config
        return {
            "backend": "vllm",
            "name": self.name,
            "spec": self.source["spec"],
            "path": self.source["path"],
            "architecture": (config.hf_config.architectures or ["?"])[0],
            "config_sha256": sha256_json(config.hf_config.to_dict()),
            "config_content_sha256": config_content_sha256(config.hf_config.to_dict()),
            "tokenizer_sha256": vocabulary_sha256(self.tokenizer),
            **weights_fingerprint(weight_files(self.source["path"])),
            "dtype": str(config.dtype).removeprefix("torch."),
            "device": self.source["device"],
            "tensor_parallel_size": self.options.tensor_parallel_size,
            "enforce_eager": self.options.enforce_eager,
            "chat_template": self.chat_template,
            "max_context": self.max_context,
            "quantization": config.quantization,
            "vllm": vllm.__version__,
            "transformers": transformers.__version__,
        }

    # ---- tokens ---------------------------------------------------------------------------

    def encode(self, text: str, first: bool = True) -> list[int]:
        return self.tokens.encode(text, first)

    def count_tokens(self, text: str) -> int:
        return self.tokens.count(text)

    def format_user_turn(self, user: str, assistant_prefix: str = "") -> str:
        return self.tokens.user_turn(user, assistant_prefix)

    @property
    def prefix_token_id(self) -> int:
        return self.tokens.prefix_token_id

    # ---- generation -----------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        """Greedy answers; a request with a closed answer set walks its choices' trie."""
        outputs = [""] * len(requests)
        prompts = [self.tokens.encode_pair(r.prefix, r.prompt) for r in requests]
        open_ = [i for i, r in enumerate(requests) if not r.choices and r.max_new_tokens > 0]
        for i, output in zip(open_, self._run([prompts[i] for i in open_], [self._greedy(requests[i]) for i in open_])):
            outputs[i] = self.tokens.answer_text(output.outputs[0].token_ids, requests[i])
        closed = [i for i, r in enumerate(requests) if r.choices]
        answers = constrained([requests[i] for i in closed], [prompts[i] for i in closed], self.tokens.choice_ids,
                              self._run)
        for i, answer in zip(closed, answers):
            outputs[i] = answer
        return outputs

    def _greedy(self, request: GenerationRequest) -> Any:
        """vLLM stops at EOS and at stop strings, as our decoding loop does; `answer_text` then cuts
        the tokens exactly where the hf backend's loop would (`TokenRules.answer_text`)."""
        from vllm import SamplingParams

        return SamplingParams(temperature=0.0, max_tokens=request.max_new_tokens, stop=list(request.stop) or None,
                              stop_token_ids=sorted(self.eos_ids), skip_special_tokens=True,
                              detokenize=bool(request.stop))

    # ---- log-likelihood -------------------------------------------------------------------

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[Loglikelihood]:
        pairs = []
        for request in requests:
            context, continuation = self.tokens.split_continuation(request)
            pairs.append((self.tokens.encode_pair(request.prefix, context), continuation))
        return self.loglikelihood_tokens(pairs)

    def loglikelihood_tokens(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Loglikelihood]:
        """Each (context ids, continuation ids), cut from the left to the context window as the
        hf backend cuts them (here the window is max_context - 1 tokens, hf's max_context + 1)."""
        window = self.max_context - 1  # vLLM's prompt holds the last continuation token, and one token is generated
        rows = [(list(c) + list(k))[-window:] for c, k in pairs]
        if any(len(k) >= len(row) for row, (_, k) in zip(rows, pairs)):
            raise UserError(f"a continuation is as long as {self.name}'s context window ({window} tokens here)")
        outputs = self._prompt_logprobs(rows, [len(k) for _, k in pairs])
        return [scoring.loglikelihood(out, row, len(k)) for out, row, (_, k) in zip(outputs, rows, pairs)]

    def token_nll(self, windows: Sequence[Sequence[int]]) -> list[list[float]]:
        """-log p(window[i] | window[:i]) for i >= 1, from the windows' prompt log-probs."""
        rows = [list(w) for w in windows]
        scored = [i for i, row in enumerate(rows) if len(row) >= 2]
        outputs = self._prompt_logprobs([rows[i] for i in scored], [len(rows[i]) - 1 for i in scored])
        out: list[list[float]] = [[] for _ in rows]
        for i, output in zip(scored, outputs):
            out[i] = [-lp for lp, _ in scoring.token_logprobs(output, rows[i], len(rows[i]) - 1)]
        return out

    def use_prefix_cache(self, on: bool) -> None:
        """Off: every prompt read whole (vLLM's cache stays enabled; no request reads from it)."""
        self.options = replace(self.options, prefix_cache=on)

    def _prompt_logprobs(self, rows: list[list[int]], scored: list[int]) -> list[Any]:
        """Outputs with prompt log-probs; where a prefix-cache hit covered a needed row, again
        without reading the cache."""
        read_cache = self.options.prefix_cache
        outputs = self._run(rows, [scoring.scoring_params(read_cache)] * len(rows))
        again = [i for i, out in enumerate(outputs) if read_cache and scoring.cache_too_long(out, rows[i], scored[i])]
        for i, output in zip(again, self._run([rows[i] for i in again], [scoring.scoring_params(False)] * len(again))):
            outputs[i] = output
        return outputs

    # ---- the engine -----------------------------------------------------------------------

    def _run(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        """One batched engine call: vLLM schedules the prompts itself (continuous batching)."""
        if not prompts:
            return []
        from vllm.exceptions import VLLMValidationError
        from vllm.inputs import TokensPrompt

        try:
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        except (ValueError, VLLMValidationError) as exc:  # a prompt longer than max_model_len...
            raise UserError(f"vllm refused a request for {self.name}: {first_line(exc)}") from None
        self.cached_prompt_tokens += sum(out.num_cached_tokens or 0 for out in outputs)
        return outputs


def load_vllm(rest: str, raw_options: dict[str, str], device: str, label: str | None) -> VLLMModel:
    options = build_params(VLLMOptions, raw_options, flag="-M")
    kind, path, named = resolve_spec(rest)  # vllm:toy-diff, a named model's folder
    if kind != "hf":
        raise UserError(f"the vllm backend loads checkpoint folders and hub ids, not {kind} models")
    folder, _ = locate(path, gguf=False)
    refuse_pickle(folder, options.allow_pickle)
    quiet_defaults(options.tensor_parallel_size)
    from transformers import AutoTokenizer
    from vllm import LLM
    from vllm.platforms import current_platform

    from .plugin import register

    device_type = str(current_platform.device_type)
    check_device(device, device_type)
    register()  # DiffLlama, also where the package's vllm.general_plugins entry point is not installed
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=options.trust_remote_code)
        llm = LLM(**engine_arguments(folder, options, device_type))
    except Exception as exc:  # vLLM, torch and transformers each raise their own types for a bad checkpoint or setting
        raise UserError(f"vllm could not load {rest}: {first_line(exc)}") from None
    name = label or named or Path(folder).name
    source = {"label": name, "spec": rest, "path": folder, "device": device_type}
    return VLLMModel(llm, tokenizer, options, source)


def generation_eos(folder: str) -> Any:
    """The generation config's EOS id or ids (what the hf backend stops on besides the
    tokenizer's), None without a generation_config.json, as transformers reads it."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(folder).eos_token_id
    except OSError:
        return None

