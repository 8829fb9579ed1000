"""The settings table of docs/SETTINGS.md, made from train_gpt.py's Hyperparameters lines (through
settings.py, which --help reads too), so the page and the code cannot drift apart.

    python tools/settings_table.py                            # print the table
    python tools/settings_table.py --write docs/SETTINGS.md   # replace the page's table with it
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # settings.py, beside train_gpt.py
from settings import rows  # noqa: E402

HEADER = "| variable | default | meaning |"


def table():
    """The markdown table, ending in a newline."""
    lines = [HEADER, "|---|---|---|"]
    for name, default, meaning in rows():
        meaning = meaning.replace("|", "\\|")  # a bare | would split the cell
        lines.append(f"| `{name}` | {default} | {meaning} |")
    return "\n".join(lines) + "\n"


def write_table(path):
    """Replace the table in path: from its HEADER line to the first blank line after it."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if HEADER + "\n" not in lines:
        sys.exit(f"{path}: no line '{HEADER}' to replace; add that line where the table goes")
    start = lines.index(HEADER + "\n")
    end = start
    while end < len(lines) and lines[end].strip():
        end += 1
    lines[start:end] = [table()]
    path.write_text("".join(lines), encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, metavar="PAGE.md", help="replace the table in this file")
    args = parser.parse_args()
    if args.write:
        write_table(args.write)
    else:
        print(table(), end="")


if __name__ == "__main__":
    main()
