"""The settings tables: docs/SETTINGS.md's, made from train_gpt.py's Hyperparameters lines (through settings.py,
which --help reads too), and docs/STACK.md's, of the settings each technique of a stack adds (stack/, read from
the built files' Hyperparameters lines the same way), so the pages and the code cannot drift apart.

    python tools/settings_table.py                                          # print the core's table
    python tools/settings_table.py --write docs/SETTINGS.md                 # replace the page's table with it
    python tools/settings_table.py --stack frontier --write docs/STACK.md   # the stack's settings, by technique
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # settings.py, beside train_gpt.py
from settings import rows  # noqa: E402

HEADER = "| variable | default | meaning |"
STACK_HEADER = "| technique | variable | default | meaning |"


def cells(row) -> str:
    """A markdown row: the variable in code, a bare | in the meaning escaped (it would split the cell)."""
    *before, name, default, meaning = row
    return "| " + " | ".join([*before, f"`{name}`", default, meaning.replace("|", "\\|")]) + " |"


def table():
    """The core's settings as a markdown table, ending in a newline."""
    return "\n".join([HEADER, "|---|---|---|", *map(cells, rows())]) + "\n"


def stack_table(stack):
    """The settings the stack's techniques add, each under its technique, ending in a newline."""
    from build_trainer import Tree, stack_settings
    return "\n".join([STACK_HEADER, "|---|---|---|---|", *map(cells, stack_settings(Tree(), stack))]) + "\n"


def write_table(path, text, header=HEADER):
    """Replace the table in path: from its header line to the first blank line after it."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if header + "\n" not in lines:
        sys.exit(f"{path}: no line '{header}' to replace; add that line where the table goes")
    start = lines.index(header + "\n")
    end = start
    while end < len(lines) and lines[end].strip():
        end += 1
    lines[start:end] = [text]
    path.write_text("".join(lines), encoding="utf-8")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, metavar="PAGE.md", help="replace the table in this file")
    parser.add_argument("--stack", help="the settings of this stack of stack/manifest.json, e.g. frontier")
    args = parser.parse_args()
    text = stack_table(args.stack) if args.stack else table()
    if args.write:
        write_table(args.write, text, STACK_HEADER if args.stack else HEADER)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
