"""The README's quick start as a new user runs it, timed: its commands read from README.md, each line of the run
stamped with the seconds since launch.

    python bench/quick_start.py                 # the first score (README's "Train" block)
    python bench/quick_start.py --run next      # the first real run (README's "Next" block)

Prints, for the run: the seconds from launch to its score line, the longest time with no line on the console,
and the score. Run it from the repository root after `python data/build_sotu.py`, as the README does; the
figures go in the README and MEASUREMENTS.md with the machine they came from.
"""

import argparse
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCORE = re.compile(r"^final_\w+_roundtrip_exact val_loss:(\S+) val_bpb:(\S+)$")


def readme_command(marker: str) -> list[str]:
    """The bash block that follows the line of README.md starting with marker, as (env, argv)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.split(f"\n{marker}", 1)[1]
    block = re.search(r"```bash\n(.*?)```", after, flags=re.S).group(1)
    return shlex.split(block.replace("\\\n", " "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", choices=("first", "next"), default="first")
    args = parser.parse_args()
    words = readme_command("**Train**" if args.run == "first" else "**Next**")
    env = dict(os.environ)
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    words[0] = sys.executable if words[0] == "python" else words[0]
    print(f"quick_start ({args.run}): {' '.join(words)}", flush=True)
    t0 = last = time.monotonic()
    silences, score, score_s = [], None, None
    proc = subprocess.Popen(words, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        now = time.monotonic()
        silences.append(now - last)
        last = now
        print(f"[{now - t0:6.1f} s] {line}", end="", flush=True)
        if m := SCORE.match(line.strip()):
            score, score_s = float(m[2]), now - t0
    proc.wait()
    if proc.returncode != 0 or score is None:
        raise SystemExit(f"quick_start: the run failed (exit {proc.returncode}) or printed no score")
    print(f"quick_start ({args.run}): score line {score_s:.0f} s after launch; val_bpb {score:.4f}; "
          f"longest silence {max(silences):.1f} s")


if __name__ == "__main__":
    main()
