"""Every setting of train_gpt.py, from Hyperparameters' own lines (the one copy there is): what
`python train_gpt.py --help` prints, and README.md's "Settings" table, one row per setting in that order.

    python tools/settings_table.py                    # print the table
    python tools/settings_table.py --write README.md  # replace the table in README.md with it
"""

import argparse
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import train_gpt  # noqa: E402

HEADER = "| variable | default | meaning |"
# A field of Hyperparameters: its name, its default, its comment (methods are indented deeper).
FIELD = re.compile(r"^    (\w+): \w+ = (.+?)(?:  # (.*))?$", re.M)


def settings() -> list[tuple[str, str, str]]:
    """(NAME, default as written, meaning) per setting, in Hyperparameters order."""
    source = inspect.getsource(train_gpt.Hyperparameters)
    return [(name.upper(), default, meaning) for name, default, meaning in
            (m.groups("") for m in FIELD.finditer(source))]


def settings_help() -> str:
    """train_gpt.py --help: one aligned line per setting."""
    return "\n".join(f"{name:<27} {default:<13} {meaning}" for name, default, meaning in settings())


def settings_table() -> str:
    """The markdown table, ending in a newline."""
    rows = [HEADER, "|---|---|---|"]
    for name, default, meaning in settings():
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
