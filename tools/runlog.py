"""Read run logs, ours and the challenge's, through one table of line formats; and the track table.

Our logs (`logs/<RUN_ID>.txt`, written by train_gpt.py's rank 0) start with the script's own
source between two marker lines, then one line each of versions, hardware, command, build (`core`,
or the stack's build that tools/build_trainer.py wrote), hyperparameters (JSON) and run layout,
then the step lines and the export and round-trip lines.
The challenge's logs (a record folder's `*.log` and `*.txt`, in it and its subfolders such as
`logs/`) were written by many scripts over the weeks, in a few generations of the same lines:

    step:N/M train_loss:X train_time:Nms step_avg:Nms      the baseline, March, ours
    step:N/M val_loss:X val_bpb:Y train_time:Nms ...
    N/M val_loss: X val_bpb: Y                             April: no `step:`, a space after `:`
    N/M train_loss: X train_time: 9.8m tok/s: N            (minutes)
    stopping_early: wallclock_cap train_time:Nms step:N/M
    Serialized model int8+zlib: N bytes                    the compressed model
    Code size: N bytes                                     the counted code is the script itself
    Code size (compressed): N bytes                        ... or a compressed copy of it
    Total submission size int8+zlib: N bytes               code + model: the 16 MB cap's number
    final_int8_zlib_roundtrip_exact val_loss:X val_bpb:Y   scores (also _sliding_window_, _ttt_)
    legal_ttt_exact val_loss:X val_bpb:Y                   March's score-first TTT
    quantized_ttt_phased val_loss:X val_bpb:Y eval_time:Nms   April's scores
    total_eval_time:508.8s

`LINE_FORMATS` lists every format this reader knows; a line matches one whole, or is
ignored (source code, warnings, progress). Some logs put a Unix time before each line;
it is dropped. A file is a run log if it has our source header, or a step or score line.

The score of a run is its last test-time-training line, else its last sliding-window line,
else its last round-trip line (`final_*_exact` ones only, in our logs): all score the
artifact after the compress -> reload round trip. `diagnostic` lines never score.
`final_eval_total eval_time:<ms>ms limit:<ms>ms passes:<name>:<ms>ms,...` (ours) or
`total_eval_time:<s>s` (the field's) is all the timed evaluation; without either, the
final passes' eval_time are summed. `Code size: N bytes (packed from M: PACK_CODE=1)` means
the counted code is the packed self-extractor of the M-byte source (PACKED_HEAD).

A run of ours that failed has `error: rank <r>: <message>` lines, each followed by its
traceback; such a run is not finished, whatever else it logged.
"""

import hashlib
import importlib.util
import json
import linecache
import lzma
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

# PACK_CODE=1: the counted code is a two-line self-extractor (lzma + base85) of the minified source
from packing import pack_source, unpack

TOOLS_DIR = Path(__file__).resolve().parent
RECORDS_DIR = TOOLS_DIR.parent / "records"
TRACKS_PATH = TOOLS_DIR / "tracks.json"

SOURCE_HEADER = re.compile(
    rb"==== train_gpt\.py source bytes:(\d+) sha256:([0-9a-f]{64}) ====\n")
SOURCE_FOOTER = b"==== end of source ===="
ERROR_LINE = re.compile(r"error: rank (\d+): (.*)")
FIELD = re.compile(r"([\w/]+):\s*(\S+)")
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
UNIX_TIME = re.compile(r"\d{9,10}\.\d+ ")
SEED_IN_NAME = re.compile(r"seed[_-]?(\d+)")
# milliseconds per unit of a time field: train_time:1234ms, total_eval_time:5.1s, train_time: 9.8m
TIME_UNITS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0}
LOG_SUFFIXES = (".log", ".txt")
NOT_LOGS = {"requirements.txt"}

# Settings renamed to the field's names. Logs written before the rename (records/track_cpu) use
# the old names; the field's own logs name the dataset folder datasets_dir. A deliberate copy of
# train_gpt.py's INSTEAD renames, inverted by hand: importing train_gpt would import torch.
FORMER_NAMES = {
    "ttt_enabled": ("ttt",),
    "artifact_dir": ("log_dir",),
    "matrix_bits": ("quant_bits",),
    "embed_bits": ("embed_quant_bits",),
    "matrix_clip_sigmas": ("quant_sigmas",),
    "attn_clip_sigmas": ("attn_quant_sigmas",),
    "mlp_clip_sigmas": ("mlp_quant_sigmas",),
    "embed_clip_sigmas": ("embed_quant_sigmas",),
    "num_loops": ("loop_repeats",),
    "enable_looping_at": ("loop_start_frac",),
    "min_lr": ("min_lr_scale",),
    "parallel_start_layer": ("parallel_from",),
    "muon_row_normalize": ("muon_row_norm",),
    "adam_wd": ("scalar_wd",),
    "smear_gate_enabled": ("smear_gate",),
    "skip_gates_enabled": ("skip_gates",),
    "sparse_attn_gate_enabled": ("attn_gate",),
    "bigram_vocab_size": ("bigram_buckets",),
    "sliding_window_enabled": ("sliding_eval",),
    "data_path": ("datasets_dir",),
}


class LogError(ValueError):
    """Not a run log, or one of ours that is not intact; the message names the file."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def setting(hyperparameters: dict, name: str, default=None):
    """A hyperparameter by its current name, else by a name it had before (FORMER_NAMES)."""
    for key in (name, *FORMER_NAMES.get(name, ())):
        if key in hyperparameters:
            return hyperparameters[key]
    return default


def number(text: str):
    """'12' -> 12, '1e-08' -> 1e-08, 'True' -> True, anything else stays text."""
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_fields(text: str) -> dict:
    """`val_loss:2.1 train_time: 9.8m mfu:41.2%`
    -> {val_loss: 2.1, train_time_ms: 588000.0, mfu_pct: 41.2}."""
    fields = {}
    for key, value in FIELD.findall(text):
        unit = re.fullmatch(r"(-?[\d.]+)(ms|s|m)", value)
        if unit and (unit.group(2) == "ms" or "time" in key):
            fields[key + "_ms"] = float(unit.group(1)) * TIME_UNITS[unit.group(2)]
        elif value.endswith("%"):
            fields[key + "_pct"] = number(value[:-1])
        else:
            fields[key] = number(value)
    return fields


def env_from_command(command: str) -> dict:
    """The leading NAME=value words of a shell command line, in order."""
    env = {}
    for word in shlex.split(command):
        if not ENV_ASSIGNMENT.match(word):
            break
        name, value = word.split("=", 1)
        env[name] = value
    return env


def score_kind(name: str) -> str:
    """What a score line measured: test-time training, a sliding window, or the plain round trip."""
    if "ttt" in name:
        return "ttt"
    if "sliding" in name:
        return "sliding"
    return "roundtrip"


@dataclass
class RunLog:
    path: Path
    source: bytes | None  # the embedded train_gpt.py (ours); None in the challenge's logs
    versions: dict = field(default_factory=dict)
    hardware: str = ""
    command: str = ""
    hyperparameters: dict = field(default_factory=dict)
    layout: dict = field(default_factory=dict)  # world_size, grad_accum_steps, device, ...
    steps: list = field(default_factory=list)  # [{"step", "iterations", **fields}]
    stopping_early: dict | None = None
    export_family: str | None = None  # "int8+zlib", "int6+lzma", ...
    model_bytes: int | None = None
    code_bytes: int | None = None  # the counted code (packed or compressed, when it was)
    code_packed_from: int | None = None  # PACK_CODE=1: the size of the packed source
    code_uncompressed: int | None = None  # `Code size (uncompressed)`: the source's size
    totals: list = field(default_factory=list)  # [(export family or None, bytes)]
    artifact_path: str | None = None
    artifact_bytes: int | None = None
    artifact_sha256: str | None = None
    finals: dict = field(default_factory=dict)  # "int8_zlib_roundtrip_exact" -> fields
    diagnostics: dict = field(default_factory=dict)  # `diagnostic quantized` -> fields
    prequant: dict | None = None  # `pre-quantization post-ema val_loss:...`
    calibration: dict = field(default_factory=dict)  # calibration_time_ms, reserved_ms
    eval_total: dict | None = None  # final_eval_total: eval_time_ms, passes, ...
    total_eval_ms: float | None = None  # the field's total_eval_time
    errors: list = field(default_factory=list)  # "rank <r>: <message>" + traceback
    build: str | None = None  # `build: core` or a stack's build (tools/build_trainer.py); None: logged before
    fingerprints: dict = field(default_factory=dict)  # the audit's: train_shards, val_tokens (as logged)
    ngram_gates: dict | None = None  # the n-gram tilt's `ngram_tilt:hints total=N gated=G ... word_gate=0`

    @property
    def ours(self) -> bool:
        return self.source is not None

    @property
    def total_bytes(self) -> int | None:
        """Code + compressed model: the last total named by its export, else the last one
        (an unnamed total before the export is the raw model's)."""
        named = [size for family, size in self.totals if family]
        if named:
            return named[-1]
        return self.totals[-1][1] if self.totals else None

    @property
    def run_id(self) -> str:
        return self.path.stem

    @property
    def source_sha256(self) -> str | None:
        return sha256_hex(self.source) if self.ours else None

    @property
    def env(self) -> dict:
        return env_from_command(self.command)

    def setting(self, name: str, default=None):
        return setting(self.hyperparameters, name, default)

    @property
    def seed(self):
        """SEED as logged; in the field's logs, else the number after `seed` in the file name."""
        seed = self.hyperparameters.get("seed")
        if seed is not None or self.ours:
            return seed
        named = named_seed(self)
        return int(named) if named else None

    @property
    def pytorch_version(self) -> str | None:
        return self.versions.get("torch")

    @property
    def score_name(self) -> str | None:
        """The line that scores this run (see the module docstring), or None if unfinished."""
        names = [n for n, f in self.finals.items() if "val_bpb" in f]
        for kind in ("ttt", "sliding", "roundtrip"):
            named = [n for n in names if score_kind(n) == kind]
            exact = [n for n in named if n.endswith("_exact")]
            if self.ours:
                named = exact
            if exact or named:
                return (exact or named)[-1]
        return None

    @property
    def finished(self) -> bool:
        """Scored, and no rank reported an error."""
        return self.score_name is not None and not self.errors

    @property
    def error(self) -> str | None:
        """The last error a rank logged, with its traceback."""
        return self.errors[-1] if self.errors else None

    @property
    def val_loss(self) -> float | None:
        if not self.finished:
            return None
        return self.finals[self.score_name].get("val_loss")

    @property
    def val_bpb(self) -> float | None:
        if not self.finished:
            return None
        return self.finals[self.score_name]["val_bpb"]

    @property
    def roundtrip_val_bpb(self) -> float | None:
        """The plain round trip's score (no sliding window, no TTT)."""
        names = [n for n in self.finals if score_kind(n) == "roundtrip"]
        if self.ours:
            names = [n for n in names if n.endswith("_roundtrip_exact")]
        scored = [n for n in names if "val_bpb" in self.finals[n]]
        if scored:
            return self.finals[scored[-1]]["val_bpb"]
        return self.diagnostics.get("quantized", {}).get("val_bpb")

    @property
    def eval_time_ms(self) -> float | None:
        """Evaluation time of the scoring pass: its line's eval_time, or its non-exact twin's."""
        if not self.finished:
            return None
        own = self.finals[self.score_name].get("eval_time_ms")
        if own is not None:
            return own
        twin = self.finals.get(self.score_name.removesuffix("_exact"), {})
        return twin.get("eval_time_ms")

    @property
    def pass_times_ms(self) -> dict:
        """{final line name: eval_time_ms} of every timed final pass (roundtrip, sliding, ttt)."""
        times = {}
        for name, fields in self.finals.items():
            if "eval_time_ms" in fields:
                times[name] = fields["eval_time_ms"]
        return times

    @property
    def eval_total_ms(self) -> float | None:
        """All the timed evaluation after training: the total line, else the passes' sum."""
        if self.eval_total is not None:
            return self.eval_total["eval_time_ms"]
        if self.total_eval_ms is not None:
            return self.total_eval_ms
        times = self.pass_times_ms
        return sum(times.values()) if times else None

    @property
    def prequant_val_bpb(self) -> float | None:
        """The model before the export: a pre-quantization line, else the last validation."""
        if self.prequant is not None and "val_bpb" in self.prequant:
            return self.prequant["val_bpb"]
        validations = [s["val_bpb"] for s in self.steps if "val_bpb" in s]
        return validations[-1] if validations else None

    @property
    def quant_gap_bpb(self) -> float | None:
        """What the export round trip cost: round-trip val_bpb minus pre-quantization val_bpb."""
        if self.roundtrip_val_bpb is None or self.prequant_val_bpb is None:
            return None
        return self.roundtrip_val_bpb - self.prequant_val_bpb

    @property
    def tokenizer(self) -> str | None:
        """'<tokenizer file> vocab <N>' (or the file alone): are two runs' val_loss in one unit?"""
        path = self.setting("tokenizer_path")
        vocab = self.setting("vocab_size")
        if path is None and self.setting("tokenizer_kind") is None:
            return None
        name = Path(str(path)).name if path else str(self.setting("tokenizer_kind"))
        return name if vocab is None else f"{name} vocab {vocab}"

    @property
    def last_step(self) -> int | None:
        return max((s["step"] for s in self.steps), default=None)

    @property
    def iterations(self) -> int | None:
        if self.steps:
            return self.steps[-1]["iterations"]
        return self.hyperparameters.get("iterations")

    @property
    def train_time_ms(self) -> float | None:
        times = [s["train_time_ms"] for s in self.steps if "train_time_ms" in s]
        if self.stopping_early and "train_time_ms" in self.stopping_early:
            times.append(self.stopping_early["train_time_ms"])
        return max(times, default=None)

    @property
    def step_avg_ms(self) -> float | None:
        """The last step_avg logged, else training time over steps."""
        avgs = [s["step_avg_ms"] for s in self.steps if "step_avg_ms" in s]
        if avgs:
            return avgs[-1]
        if self.train_time_ms is None or not self.last_step:
            return None
        return self.train_time_ms / self.last_step

    @property
    def val_curve(self) -> list:
        """[(step, train_time_ms, val_bpb)] from the in-training validation lines."""
        curve = []
        for s in self.steps:
            if "val_bpb" in s:
                curve.append((s["step"], s.get("train_time_ms"), s["val_bpb"]))
        return curve


# ---- THE LINE FORMATS ----

def on_eval_total(run: RunLog, m: re.Match) -> None:
    passes = {}
    for item in m["passes"].split(","):
        name, ms = item.split(":")
        passes[name] = float(ms.removesuffix("ms"))
    graphs = m["graphs"]
    run.eval_total = {"eval_time_ms": float(m["ms"]), "limit_ms": float(m["limit"]),
                      "passes": passes,
                      "graphs_compiled_inside": int(graphs) if graphs else None}


def on_field_eval_total(run: RunLog, m: re.Match) -> None:
    run.total_eval_ms = float(m["s"]) * 1000


def on_step(run: RunLog, m: re.Match) -> None:
    step = {"step": int(m["step"]), "iterations": int(m["iterations"])}
    run.steps.append({**step, **parse_fields(m["fields"])})


def on_stop(run: RunLog, m: re.Match) -> None:
    run.stopping_early = parse_fields(m["fields"])


def on_prequant(run: RunLog, m: re.Match) -> None:
    run.prequant = parse_fields(m["fields"])


def on_diagnostic(run: RunLog, m: re.Match) -> None:
    run.diagnostics[m["name"]] = parse_fields(m["fields"])


def on_final(run: RunLog, m: re.Match) -> None:
    name = m["name"].removeprefix("final_")
    if m["qualifier"]:  # `final_int8_zlib_roundtrip_exact sliding val_loss:...`
        exact = name.endswith("_exact")
        name = name.removesuffix("_exact") + "_" + m["qualifier"]
        name += "_exact" if exact else ""
    run.finals[name] = parse_fields(m["fields"])


def on_model(run: RunLog, m: re.Match) -> None:
    if m["family"]:  # an unnamed `Serialized model:` is the raw model, before the export
        run.export_family = m["family"]
        run.model_bytes = int(m["bytes"])


def on_code(run: RunLog, m: re.Match) -> None:
    size = int(m["bytes"])
    if m["how"] == "uncompressed":
        run.code_uncompressed = size
        return
    run.code_bytes = size
    run.code_packed_from = int(m["packed"]) if m["packed"] else None


def on_total(run: RunLog, m: re.Match) -> None:
    if m["family"]:
        run.export_family = m["family"]
    run.totals.append((m["family"], int(m["bytes"])))


def on_budget(run: RunLog, m: re.Match) -> None:
    run.totals.append((None, int(m["bytes"])))


def on_code_in_artifact(run: RunLog, m: re.Match) -> None:
    run.code_bytes = int(m["code"])


def on_artifact(run: RunLog, m: re.Match) -> None:
    run.artifact_path = m["path"]
    run.artifact_bytes = int(m["bytes"])
    run.artifact_sha256 = m["sha"]


def on_hyperparameters(run: RunLog, m: re.Match) -> None:
    run.hyperparameters = json.loads(m["json"])


def on_key_values(run: RunLog, m: re.Match) -> None:
    """`val_bpb:enabled tokenizer_kind=sentencepiece tokenizer_path=...`, `seed=42 ...`."""
    for key, value in re.findall(r"(\w+)=(\S+)", m["pairs"]):
        run.hyperparameters.setdefault(key, number(value))


def on_seed(run: RunLog, m: re.Match) -> None:
    run.hyperparameters.setdefault("seed", int(m["seed"]))


def on_dataset(run: RunLog, m: re.Match) -> None:
    run.hyperparameters.setdefault("data_path", m["name"])


def on_build(run: RunLog, m: re.Match) -> None:
    if run.build is None:
        run.build = m["text"]


def on_versions(run: RunLog, m: re.Match) -> None:
    run.versions = dict(FIELD.findall(m["text"]))


def on_hardware(run: RunLog, m: re.Match) -> None:
    if not run.hardware:
        run.hardware = m["text"].strip()


def on_command(run: RunLog, m: re.Match) -> None:
    if not run.command:
        run.command = m["text"].strip()


def on_layout(run: RunLog, m: re.Match) -> None:
    run.layout = parse_fields(m["text"])


def on_gptq(run: RunLog, m: re.Match) -> None:
    run.calibration = parse_fields(m["fields"])


def on_fingerprints(run: RunLog, m: re.Match) -> None:
    run.fingerprints.update({key: int(value) for key, value in FIELD.findall(m["text"])
                             if key in ("train_shards", "val_tokens")})


def on_ngram_gates(run: RunLog, m: re.Match) -> None:
    run.ngram_gates = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", m["pairs"])}


SCORE_FIELDS = r"(?P<fields>.*\bval_loss:.*)"

# (format, what it sets): a line is read by the first format that matches all of it.
LINE_FORMATS = [
    (r"final_eval_total eval_time:(?P<ms>\d+)ms limit:(?P<limit>\d+)ms"
     r" passes:(?P<passes>\S+)(?: graphs_compiled_inside:(?P<graphs>\d+))?",
     on_eval_total),
    (r"total_eval_time:\s*(?P<s>[\d.]+)s", on_field_eval_total),
    (r"(?:step:)?(?P<step>\d+)/(?P<iterations>\d+)\s+(?P<fields>[\w/]+:.*)",
     on_step),
    (r"stopping_early: (?P<fields>.*)", on_stop),
    (r"(?:diagnostic |DIAGNOSTIC )?(?:pre-quantization post-ema|post_ema)\s+"
     + SCORE_FIELDS, on_prequant),
    (r"diagnostic (?P<name>\w+)\s+" + SCORE_FIELDS, on_diagnostic),
    (r"(?P<name>(?:final_|legal_ttt|quantized)\w*)(?: (?P<qualifier>[a-z]+)(?= ))?\s+"
     + SCORE_FIELDS, on_final),
    (r"Serialized model(?: (?P<family>\S+))?: (?P<bytes>\d+) bytes(?: \(.*\))?",
     on_model),
    (r"Code size(?: \((?P<how>compressed|uncompressed)\))?: (?P<bytes>\d+) bytes"
     r"(?: \(packed from (?P<packed>\d+): PACK_CODE=1\))?", on_code),
    (r"Total submission size(?: (?P<family>\S+))?: (?P<bytes>\d+) bytes", on_total),
    (r"budget:(?P<bytes>\d+)/\d+ .*", on_budget),
    (r"\S+ model: \d+ bytes \| Total submission: (?P<bytes>\d+) bytes", on_budget),
    (r"Raw model: \d+ bytes \| Code: (?P<code>\d+) bytes \| Total: \d+", on_code_in_artifact),
    (r"artifact:[\d.]+MB .* code:(?P<code>\d+)", on_code_in_artifact),
    # then the export's time, in newer logs
    (r"artifact: (?P<path>.+?) bytes:(?P<bytes>\d+) sha256:(?P<sha>[0-9a-f]{64})(?: .*)?",
     on_artifact),
    (r"hyperparameters: (?P<json>\{.*\})", on_hyperparameters),
    (r"val_bpb:enabled (?P<pairs>.*)", on_key_values),
    (r"(?P<pairs>\w+=\S+(?: \w+=\S*){3,})", on_key_values),  # a settings dump
    (r"seed:(?P<seed>\d+)", on_seed),
    (r"train_loader:dataset:(?P<name>\S+)(?: .*)?", on_dataset),
    (r"versions:(?P<text>.*)", on_versions),
    (r"build: (?P<text>\S+(?: \S+)*)", on_build),
    (r"hardware:(?P<text>.*)", on_hardware),
    (r"command:(?P<text>.*)", on_command),
    (r"(?P<text>world_size:\d+ .*)", on_layout),
    (r"gptq: (?P<fields>.*)", on_gptq),
    # the audit's fingerprints: ours on one line, the field's a line each
    (r"(?P<text>val_tokens:\d+ (?:val_bytes:\d+ )?train_shards:\d+)", on_fingerprints),
    (r"(?P<text>(?:train_shards|val_tokens): \d+)", on_fingerprints),
    (r"ngram_tilt:hints (?P<pairs>(?:\w+=\d+ ?)+)", on_ngram_gates),
]
COMPILED_FORMATS = [(re.compile(text), handler) for text, handler in LINE_FORMATS]
# April's logs list their settings under `Hyperparameters:`, one `  name: value` a line
SETTINGS_HEADER = "Hyperparameters:"
SETTING_LINE = re.compile(r"  (\w+):(.*)")


def read_line(run: RunLog, line: str) -> None:
    """Set what a line says, by the first of LINE_FORMATS that matches all of it."""
    for pattern, handler in COMPILED_FORMATS:
        m = pattern.fullmatch(line)
        if m:
            handler(run, m)
            return


def read_lines(run: RunLog, lines: list[str]) -> None:
    in_settings = False
    for line_no, raw in enumerate(lines, start=1):
        stamp = UNIX_TIME.match(raw)
        if stamp:
            raw = raw[stamp.end():]
        line = raw.strip()
        if run.ours and ERROR_LINE.fullmatch(line):
            m = ERROR_LINE.fullmatch(line)
            run.errors.append(f"rank {m.group(1)}: {m.group(2)}")
            continue
        if run.errors:  # the traceback of the error above: its lines are not log lines
            run.errors[-1] += "\n" + raw.rstrip()
            continue
        setting_line = SETTING_LINE.fullmatch(raw.rstrip())
        if in_settings and setting_line:
            key, value = setting_line.groups()
            run.hyperparameters[key] = number(value.strip())
            continue
        in_settings = line == SETTINGS_HEADER
        try:
            read_line(run, line)
        except (ValueError, KeyError) as e:
            raise LogError(f"{run.path}: cannot read line {line_no}, {line[:80]!r}: {e}") from e


def split_source(data: bytes, path: Path) -> tuple[bytes, bytes]:
    """Split our log's bytes into (embedded source, the log lines after it), checking the hash."""
    header = SOURCE_HEADER.match(data)
    n = int(header.group(1))
    claimed = header.group(2).decode()
    source = data[header.end():header.end() + n]
    if len(source) != n or sha256_hex(source) != claimed:
        raise LogError(f"{path}: the embedded source does not match its header "
                       f"(bytes:{n} sha256:{claimed}); the log was edited or "
                       f"truncated, rerun to get an intact log")
    rest = data[header.end() + n:]
    # the writer may add a newline after a source without one
    if rest.startswith(b"\n" + SOURCE_FOOTER):
        rest = rest[1:]
    if not rest.startswith(SOURCE_FOOTER):
        raise LogError(f"{path}: '{SOURCE_FOOTER.decode()}' does not follow "
                       f"the {n} source bytes")
    return source, rest[len(SOURCE_FOOTER):]


def is_our_log(path) -> bool:
    """Does the file start with train_gpt.py's source header?"""
    with open(path, "rb") as f:
        return SOURCE_HEADER.match(f.read(200)) is not None


def parse_log(path) -> RunLog:
    """One run log, ours or the challenge's; LogError if it is neither."""
    path = Path(path)
    data = path.read_bytes()
    source = None
    if SOURCE_HEADER.match(data):
        source, data = split_source(data, path)
    run = RunLog(path=path, source=source)
    read_lines(run, data.decode("utf-8", errors="replace").splitlines())
    if not run.ours and not (run.steps or run.finals):
        raise LogError(f"{path}: not a run log: no step line (step:N/M ...) "
                       f"and no score line (final_... val_loss:X val_bpb:Y)")
    return run


def log_paths(folder) -> list[Path]:
    """The run logs a folder may hold: its *.log and *.txt, then those of its subfolders
    (logs/, and the like), each folder's in name order."""
    folder = Path(folder)
    paths = []
    for path in sorted(folder.rglob("*"), key=lambda p: (len(p.parts), str(p))):
        if not path.is_file() or path.name in NOT_LOGS:
            continue
        if path.suffix in LOG_SUFFIXES:
            paths.append(path)
    return paths


def read_logs(folder) -> tuple[list[RunLog], list[str]]:
    """(the runs, why each other file was skipped) of log_paths(folder)."""
    runs = []
    skipped = []
    for path in log_paths(folder):
        try:
            runs.append(parse_log(path))
        except LogError as e:
            skipped.append(str(e))
    return runs, skipped


def distinct_runs(runs: list) -> list:
    """The runs less those whose log is a byte-for-byte copy of an earlier one (a train.log
    beside its train_seed1337.log)."""
    seen = set()
    kept = []
    for run in runs:
        digest = sha256_hex(run.path.read_bytes())
        if digest not in seen:
            seen.add(digest)
            kept.append(run)
    return kept


def submission_path(folder) -> Path | None:
    """A record folder's submission.json, or the one submission*.json it holds instead."""
    folder = Path(folder)
    if (folder / "submission.json").is_file():
        return folder / "submission.json"
    others = sorted(folder.glob("submission*.json"))
    return others[0] if len(others) == 1 else None


def per_seed_results(sub: dict) -> dict:
    """{seed as text: its results} of a submission.json: `seed_results` keyed by seed, or
    `seeds` given as such a dict (some of the field's folders); {} when it has neither."""
    for key in ("seed_results", "seeds"):
        results = sub.get(key)
        if isinstance(results, dict) and results:
            if all(isinstance(entry, dict) for entry in results.values()):
                return {str(seed): entry for seed, entry in results.items()}
    return {}


def number_or_none(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def named_seed(run: RunLog) -> str | None:
    """The seed a log's file name gives (train_seed42.log -> '42')."""
    named = SEED_IN_NAME.search(run.path.name)
    return named.group(1) if named else None


def seed_label(run: RunLog) -> str:
    """The run's seed as text; a run of unknown seed is its own (its file name)."""
    return run.path.name if run.seed is None else str(run.seed)


def matching_run(runs: list, seed: str, entry: dict):
    """The log of this seed's entry: the one it names, else the closest in val_bpb among
    those of that seed (or, failing any, those whose file name gives that seed)."""
    same = [r for r in runs if str(r.seed) == seed]
    if not same:
        same = [r for r in runs if named_seed(r) == seed]
    named = [r for r in same if r.path.name == entry.get("log")]
    if named:
        return named[0]
    claimed = number_or_none(entry.get("val_bpb"))
    if claimed is None or not same:
        return same[0] if same else None
    return min(same, key=lambda r: abs(claimed_line(r, claimed)["val_bpb"] - claimed))


def claimed_line(run: RunLog, val_bpb: float | None) -> dict:
    """The score line of a run that a claimed val_bpb reports: its score, or the line
    closest to the claim (a record may report the sliding window where a TTT line follows)."""
    score = run.finals[run.score_name]
    if val_bpb is None:
        return score
    lines = [f for f in run.finals.values() if "val_bpb" in f]
    return min(lines, key=lambda f: abs(f["val_bpb"] - val_bpb))


def find_artifact(run: RunLog, *extra_dirs) -> Path | None:
    """The run's model file: beside the log, in extra_dirs, or at its logged path."""
    if run.artifact_path is None:
        return None
    name = Path(run.artifact_path).name
    candidates = [run.path.parent / name]
    candidates += [Path(d) / name for d in extra_dirs]
    candidates.append(Path(run.artifact_path))
    candidates.append(run.path.parent.parent / run.artifact_path)
    return next((p for p in candidates if p.is_file()), None)


def import_source(source: bytes, filename: str):
    """A logged train_gpt.py as a module, from its bytes (its top level has no side effects);
    `filename` names it in tracebacks and lets inspect read its source. One module per source."""
    name = f"logged_train_gpt_{sha256_hex(source)[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    linecache.cache[filename] = (len(text), None, lines, filename)  # None: never stale
    spec = importlib.util.spec_from_loader(name, loader=None, origin=filename)
    module = importlib.util.module_from_spec(spec)
    module.__file__ = filename
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


_PACKED = {}  # source sha256 -> its packing, made once per process (lzma at its slowest setting)


def pack_logged_source(source: bytes, filename: str) -> bytes:
    """What PACK_CODE=1 counted: the logged script's own pack_source of the logged source (scripts since
    2026-11-25 have none: tools/packing.py packed them)."""
    key = sha256_hex(source)
    if key not in _PACKED:
        own = getattr(import_source(source, filename), "pack_source", None)
        _PACKED[key] = (own or pack_source)(source)
    return _PACKED[key]


def unpack_code(packed: bytes) -> bytes | None:
    """The program a PACK_CODE=1 file runs (its two lines exactly, nothing around them),
    or None if it is not one (b85decode refuses a quote or newline: not base85)."""
    try:
        return unpack(packed)
    except (ValueError, lzma.LZMAError):
        return None


def load_tracks(path=TRACKS_PATH) -> dict:
    return json.loads(Path(path).read_text())


def track_by_challenge_name(tracks: dict, spelled: str) -> str | None:
    """Our track key (the folder name, track_cpu) for the challenge's spelling (cpu)."""
    for key, track in tracks.items():
        if track.get("challenge_name") == spelled:
            return key
    return None
