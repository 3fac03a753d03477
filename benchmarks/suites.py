"""The bench figures of README.md and docs/performance.md, by name: each preset runs `localspec bench`
with the settings its figure was measured with and writes the raw runs to benchmarks/results/, named by
what the preset measures and the build it ran on (avx512, avx2-build: an AVX2 wheel on an AVX-512 CPU,
avx2-native: a CPU without AVX-512).

    .venv/bin/python benchmarks/suites.py --list
    .venv/bin/python benchmarks/suites.py suites                  # the four suites, two repeats (~16 min)
    .venv/bin/python benchmarks/suites.py heldout-edit3 --dry-run  # print the command only

Every run keeps the drafting history off across variants (the bench's default: no variant replays
another's answer) and alternates which variant runs first.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from common import PROMPTS, RESULTS, ROOT

GREEDY_128 = ["--max-tokens", "128", "--temperature", "0"]
PRESETS: dict[str, tuple[str, list[str]]] = {
    "suites": ("edit, code, chat and creative suites against plain, `Llama` and the peers",
               ["--suite", "edit,code,chat,creative", *GREEDY_128, "--repeat", "2"]),
    "sessions": ("follow-ups, regenerations, quotes and tool output, history starting empty per variant",
                 ["--suite", "sessions", *GREEDY_128]),
    "structured": ("JSON schemas, tool calls and JSON rewrites under their grammar, against `Llama` + grammar",
                   ["--suite", "structured", "--max-tokens", "160", "--temperature", "0", "--repeat", "2"]),
    "structured-sampled": ("the structured suite sampled at temperature 0.7 (fixed seeds)",
                           ["--suite", "structured", "--max-tokens", "160", "--temperature", "0.7", "--repeat", "2"]),
    "edit-peers": ("the edit suite with every peer on all eight prompts",
                   ["--suite", "edit", *GREEDY_128, "--repeat", "2", "--peer-prompts", "8"]),
    **{f"heldout-edit{n}": (f"held-out edit set {n or 1} (benchmarks/prompts/heldout_edit{n}.yaml, never tuned on)",
                            ["--suite", str(PROMPTS / f"heldout_edit{n}.yaml"), *GREEDY_128, "--repeat", "2"])
       for n in ("", "2", "3")},
}


def build_tag() -> str:
    """Which of llama.cpp's kernel sets this wheel runs: avx512, avx2-build or avx2-native."""
    import llama_cpp

    built = "AVX512 = 1" in llama_cpp.llama_print_system_info().decode()
    try:
        cpu = "avx512f" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        cpu = built
    return "avx512" if built else ("avx2-build" if cpu else "avx2-native")


def command(preset: str, tag: str, entry: str | None) -> list[str]:
    _what, args = PRESETS[preset]
    out = [str(Path(sys.executable).parent / "localspec"), "bench", *([entry] if entry else []), *args,
           "--json", str(RESULTS / f"bench-{preset}-{tag}.json")]
    if preset == "suites":
        out += ["--plot", str(ROOT / "assets" / f"bench-suites-{tag}.svg")]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", nargs="?", choices=sorted(PRESETS))
    ap.add_argument("--list", action="store_true", help="the presets and what each measures")
    ap.add_argument("--entry", default=None, help="catalog id or GGUF path (default: the default pair)")
    ap.add_argument("--tag", default=None, help="the result's build name (default: found from the wheel)")
    ap.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    args = ap.parse_args()
    if args.list or args.preset is None:
        for name, (what, _args) in PRESETS.items():
            print(f"{name:20} {what}")
        return
    cmd = command(args.preset, args.tag or build_tag(), args.entry)
    print(" ".join(cmd), flush=True)
    if not args.dry_run:
        raise SystemExit(subprocess.call(cmd))


if __name__ == "__main__":
    main()
