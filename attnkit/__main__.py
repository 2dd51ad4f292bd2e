"""Command line: ``attnkit info`` and ``attnkit bench`` (also ``python -m attnkit ...``)."""

from __future__ import annotations

import sys

USAGE = """usage: attnkit COMMAND [options]

commands:
  info     devices, versions, every backend (available or why not) and what auto() picks;
           with --model CONFIG, how each attention module of a diffusers model would be served
  bench    Stable Diffusion it/s per attention processor (tables 1-4) and a transformer's
           forward per attention backend (table 5: --preset flux|sd3|wan); see `attnkit bench --help`
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "info":
        from .info import main as info_main

        return int(info_main(rest) or 0)
    if command == "bench":
        from .bench.cli import main as bench_main

        return int(bench_main(rest) or 0)
    print(f"attnkit: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
