"""Options several `localspec` commands share, declared once."""

from __future__ import annotations

from typing import Any, Callable

import click

from localspec.engine.contract import DRAFTER_HELP
from localspec.engine.sampling import SamplingSettings

SAMPLING = SamplingSettings()  # the defaults of every sampling option
DRAFTER_OPTION_HELP = "; ".join(f"{name}: {what}" for name, what in DRAFTER_HELP.items()) + "."


def rpc_options(command: Callable[..., Any]) -> Callable[..., Any]:
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


def sampling_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--temperature, --top-k, --top-p, --min-p, --repeat-penalty and --seed (`sampling(**kwargs)` reads them)."""
    for option in reversed((
            click.option("--temperature", type=float, default=SAMPLING.temperature, show_default=True, help="0 = greedy."),
            click.option("--top-k", type=int, default=SAMPLING.top_k, show_default=True),
            click.option("--top-p", type=float, default=SAMPLING.top_p, show_default=True),
            click.option("--min-p", type=float, default=SAMPLING.min_p, show_default=True),
            click.option("--repeat-penalty", type=float, default=SAMPLING.repeat_penalty, show_default=True),
            click.option("--seed", type=int, default=None))):
        command = option(command)
    return command


def sampling(temperature: float, top_k: int, top_p: float, min_p: float, repeat_penalty: float,
             seed: int | None) -> SamplingSettings:
    return SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                            repeat_penalty=repeat_penalty, seed=seed)


class DraftLength(click.ParamType):
    """'auto' (None: the planner chooses) or a fixed number of draft tokens, 0 or more."""

    name = "auto|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or value == "auto" or isinstance(value, int):
            return value if isinstance(value, int) else None
        try:
            fixed = int(value)
        except ValueError:
            self.fail("must be 'auto' or a whole number", param, ctx)
        if fixed < 0:
            self.fail("must be 0 or more", param, ctx)
        return fixed


mmproj_option = click.option(
    "--mmproj", type=click.Path(exists=True, dir_okay=False), default=None, metavar="PATH",
    help="The target's image projector (an mmproj GGUF): images in prompts. A catalog model that lists one "
         "pulls and loads it without this.")

no_history_option = click.option(
    "--no-history-drafts", is_flag=True,
    help="Do not draft from earlier requests (nor add this session's to the history kept under the cache folder).")


def rpc_load_options(rpc: str | None, allow_public: bool, tensor_split: str | None) -> dict:
    """load()'s rpc and tensor_split from the options, or from settings.yaml's rpc_workers."""
    from localspec.rpc import placement_options

    return placement_options(rpc, allow_public, tensor_split)
