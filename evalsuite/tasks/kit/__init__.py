"""The task kit: what a task needs besides its own idea, one concern per module.

Long-context prompts (prompt.py, on filler.py, fit.py, depth.py, ledger.py):
    Layout(instruction).render(model, haystack, question, answer_prefix)  instruction, haystack, question, chat template
    Haystack.load(spec, field)              the built-in filler, a text file, a folder of them or dataset:NAME
    check_lengths(model, lengths, answer_budget)   refuse lengths the model cannot hold (in prepare)
    build_prompt(model, haystack, tokens=, depth=, item=, others=, render=, seed=) -> Built
        .prompt: exactly `tokens` tokens (within a token at a seam); .facts: prompt_tokens,
        haystack_sentences, answer_boundary, answer_token, haystack_tokens, measured_depth
    cells(lengths, depths, samples, by_sample=False)   the (length, depth, index) grid of a plan
    fit_document(document, render, count_tokens, budget, mode)   cut one long document to a budget

Data (data.py):
    load_table(path | folder | Hub(name, config, split), what)   rows through datasets
    load_texts(path | folder | "dataset:NAME[:SPLIT]", what, field, limit)   texts
    dataset_column(spec, field, what, limit)

Scorers:
    numbers.grade(output, queried, targets, names), numbers.substring_hits(output, targets)
        number answers as the needle task reads them (strict per query, and the lenient rule);
        digits.py reads how a number is written, rejected.py what the output takes back
    strings.string_match_all / string_match_part(outputs, references)   lm-eval's RULER scores
    strings.all_references / any_reference(output, references)   their pass/fail forms

Views (view.py, marked.py):
    DepthLengthView   a task's `view`: depth x length heatmaps with n per cell, per model, pair
                      and difference (significant cells marked) and the grid of several models
    depth_length_grid, sample_counts, paired_counts, significance_marks, draw_difference
    marked_prompt(text, items)   a long prompt in HTML with its items marked
"""

from .data import Hub, dataset_column, load_table, load_texts
from .document import fit_document, kept_document
from .marked import mark, marked_prompt
from .plan import cells
from .prompt import Built, Haystack, Layout, build_prompt, check_lengths, measured_depth
from .strings import all_references, any_reference, string_match_all, string_match_part
from .view import (
    DepthLengthView,
    depth_length_grid,
    draw_difference,
    paired_counts,
    sample_counts,
    significance_marks,
)

__all__ = [
    "Built", "DepthLengthView", "Haystack", "Hub", "Layout", "all_references", "any_reference", "build_prompt",
    "cells", "check_lengths", "dataset_column", "depth_length_grid", "draw_difference", "fit_document",
    "kept_document", "load_table", "load_texts", "mark", "marked_prompt", "measured_depth", "paired_counts",
    "sample_counts", "significance_marks", "string_match_all", "string_match_part",
]
