"""`localspec bench`: speculative against plain decoding (and peers) on the shipped prompt suites. Its
options are many; like every command it parses, calls a module (localspec/bench/job.py) and prints."""

from __future__ import annotations

import click

from localspec.cli_options import rpc_load_options, rpc_options
from localspec.engine.params import DRAFTER_SETTINGS


@click.command()
@click.argument("entry_id", required=False)
@click.option("--drafter", default="auto", show_default=True,
              help=f"Drafters to compare with plain decoding: {', '.join(DRAFTER_SETTINGS[:-1])}, or 'all'; comma-separated.")
@click.option("--suite", "suites", default="code,edit,chat,creative", show_default=True,
              help="Prompt suites (8 prompts each: code, edit, chat, creative; structured: JSON schemas, tool calls "
                   "and JSON rewrites under their grammar, against `Llama` with the same grammar), and 'sessions' "
                   "(related requests in order: follow-up edits, regenerations, quotes, repeated tool output), "
                   "or a YAML file of your own prompts (`name:`, `prompts:`) or "
                   "sessions (`sessions:`), comma-separated.")
@click.option("--max-tokens", type=int, default=32, show_default=True)
@click.option("--repeat", type=int, default=1, show_default=True, help="Runs of each variant per prompt.")
@click.option("--temperature", "temperatures", default="0,0.7", show_default=True,
              help="Temperatures, comma-separated (0 = greedy; sampling runs use fixed seeds).")
@click.option("--peers/--no-peers", default=True, show_default=True,
              help="Also run llama-cpp-python's Llama (plain on every prompt, the baseline when it is faster; "
                   "prompt-lookup on --peer-prompts), and llama.cpp's llama-speculative-simple if on PATH.")
@click.option("--prompts", "limit", default=None,
              help="Only the first N prompts of each suite, or only these prompts (ids: code-4,chat-8).")
@click.option("--peer-prompts", type=int, default=4, show_default=True,
              help="Peers run on the first N prompts of each suite (they are the slow part of a run).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write every raw run here.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), default=None, help="Write an SVG plot here.")
@click.option("--ctx", "n_ctx", type=int, default=2048, show_default=True)
@rpc_options
def bench(entry_id, drafter, suites, max_tokens, repeat, temperatures, peers, limit, peer_prompts, json_path, plot_path,
          n_ctx, rpc, rpc_allow_public, tensor_split):
    """Measure speculative against plain decoding (and peers) on shipped prompt suites.

    Variants run back to back per prompt, in alternating order, so machine drift cancels out. Prints a
    Markdown table: tokens/s, speedup against the faster of localspec's and llama-cpp-python's plain
    decoding (ratio of medians, min-max per prompt; the row names the baseline), time to first token
    from an empty cache, acceptance, accepted per round, draft length, the speedup bound the measured
    acceptance and costs allow, and for greedy runs how much of the plain answer the speculative one
    reproduced.
    """
    from localspec.bench.job import run as run_bench
    from localspec.catalog import load_catalog

    try:
        temps = [float(t) for t in temperatures.split(",")]
    except ValueError:
        raise click.BadParameter("must be numbers, e.g. 0,0.7", param_hint="--temperature") from None
    if max_tokens < 1 or repeat < 1:
        raise click.BadParameter("must be at least 1", param_hint="--max-tokens/--repeat")
    report = run_bench(entry_id or load_catalog().default_pair, drafter=drafter,
                       suites=[s.strip() for s in suites.split(",") if s.strip()], max_tokens=max_tokens,
                       repeat=repeat, temperatures=temps, peers=peers,
                       limit=int(limit) if limit and limit.isdigit() else limit, peer_prompts=peer_prompts,
                       n_ctx=n_ctx, placement=rpc_load_options(rpc, rpc_allow_public, tensor_split),
                       json_path=json_path, plot_path=plot_path, say=lambda m: click.echo(m, err=True))
    click.echo(report)
