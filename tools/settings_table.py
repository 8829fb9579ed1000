"""README.md's "Settings" table, made from train_gpt.py's --help: one row per setting, in Hyperparameters order.

    python tools/settings_table.py                    # print the table
    python tools/settings_table.py --write README.md  # replace the table in README.md with it
"""

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train_gpt  # noqa: E402

HEADER = "| variable | default | meaning |"
# A --help line: NAME, its default (a quoted string may hold spaces), its meaning.
HELP_LINE = re.compile(r'(\w+) +(".*?"|\S+) *(.*)')


def settings_table() -> str:
    """The markdown table, ending in a newline."""
    rows = [HEADER, "|---|---|---|"]
    for line in train_gpt.settings_help().splitlines():
        name, default, meaning = HELP_LINE.fullmatch(line).groups()
        meaning = meaning.replace("|", "\\|")  # a bare | would split the cell
        rows.append(f"| `{name}` | {default} | {meaning} |")
    return "\n".join(rows) + "\n"


def write_table(path: Path) -> None:
    """Replace the table in path: from its HEADER line to the first blank line after it."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if HEADER + "\n" not in lines:
        sys.exit(f"{path}: no line '{HEADER}' to replace")
    start = lines.index(HEADER + "\n")
    end = start
    while end < len(lines) and lines[end].strip():
        end += 1
    lines[start:end] = [settings_table()]
    path.write_text("".join(lines), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, metavar="README.md", help="replace the table in this file")
    args = parser.parse_args()
    if args.write:
        write_table(args.write)
    else:
        print(settings_table(), end="")


if __name__ == "__main__":
    main()
