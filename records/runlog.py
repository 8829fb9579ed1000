"""Read what the records tools share: the run logs train_gpt.py writes, and the track table.

A run log (`logs/<RUN_ID>.txt`, written by rank 0) starts with the script's own source between
two marker lines, then one line each of versions, hardware, command, hyperparameters (JSON) and
run layout, then the step lines and the export/round-trip lines. The line formats are an interface
users grep, so this parser accepts exactly those names and ignores any line it does not know
(nvidia-smi output, warnings).

The score of a run is its last `final_*_ttt_exact` line when the script ran score-first test-time
training, else its last `final_*sliding_window*_exact` line when it evaluated with a sliding window,
else its last `final_*_roundtrip_exact` line: all score the artifact after the compress -> reload
round trip, and the last evaluation a run made is the one its record chose to be scored by. After the final
passes, `final_eval_total eval_time:<ms>ms limit:<ms>ms passes:<name>:<ms>ms,...` sums the timed evaluation
(older logs lack it: their passes' eval_time are summed). `Code size: N bytes (packed from M: PACK_CODE=1)`
means the counted code is the packed self-extractor of the M-byte source (PACKED_HEAD). Every other tool
(make, check, compare, summarize, sweep) reads runs through `parse_log`.

A run that failed has `error: rank <r>: <message>` lines, each followed by its traceback; such a run is not
finished, whatever else it logged. `progress:` lines (during evaluation) and anything unknown are ignored.
"""

import base64
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

RECORDS_DIR = Path(__file__).resolve().parent
TRACKS_PATH = RECORDS_DIR / "tracks.json"

SOURCE_HEADER = re.compile(rb"==== train_gpt\.py source bytes:(\d+) sha256:([0-9a-f]{64}) ====\n")
SOURCE_FOOTER = b"==== end of source ===="
STEP_LINE = re.compile(r"step:(\d+)/(\d+)\s+(.*)")
FINAL_LINE = re.compile(r"final_(\w+)\s+(.*)")
FIELD = re.compile(r"([\w/]+):(\S+)")
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
ERROR_LINE = re.compile(r"error: rank (\d+): (.*)")
EVAL_TOTAL_LINE = re.compile(r"final_eval_total eval_time:(\d+)ms limit:(\d+)ms passes:(\S+)"
                             r"(?: graphs_compiled_inside:(\d+))?")
# PACK_CODE=1: the counted code is a two-line self-extractor (lzma + base85) of the minified source
PACKED_HEAD = b'import lzma as L,base64 as B\nexec(L.decompress(B.b85decode("'
PACKED_TAIL = b'")))\n'


class LogError(ValueError):
    """A log that is not a complete, well-formed train_gpt.py run log; the message names the file."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def parse_fields(text: str) -> dict:
    """`val_loss:2.1 train_time:1234ms mfu:41.2%` -> {val_loss: 2.1, train_time_ms: 1234.0, mfu_pct: 41.2}."""
    fields = {}
    for key, value in FIELD.findall(text):
        if value.endswith("ms"):
            key, value = key + "_ms", value[:-2]
        elif value.endswith("%"):
            key, value = key + "_pct", value[:-1]
        try:
            fields[key] = float(value)
        except ValueError:
            fields[key] = value
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


@dataclass
class RunLog:
    path: Path
    source: bytes
    versions: dict = field(default_factory=dict)
    hardware: str = ""
    command: str = ""
    hyperparameters: dict = field(default_factory=dict)
    layout: dict = field(default_factory=dict)  # world_size, grad_accum_steps, device, ...
    model_params: int | None = None
    steps: list = field(default_factory=list)  # [{"step", "iterations", **fields}] in log order
    stopping_early: dict | None = None
    export_family: str | None = None  # "int8+zlib", "int6+lzma", ...
    model_bytes: int | None = None
    code_bytes: int | None = None  # the counted code: the packed file's size under PACK_CODE=1
    code_packed_from: int | None = None  # PACK_CODE=1: the size of the source it was packed from
    total_bytes: int | None = None
    artifact_path: str | None = None
    artifact_bytes: int | None = None
    artifact_sha256: str | None = None
    finals: dict = field(default_factory=dict)  # "int8_zlib_roundtrip_exact" -> fields
    calibration: dict = field(default_factory=dict)  # GPTQ's: calibration_time_ms, reserved_ms
    eval_total: dict | None = None  # final_eval_total: eval_time_ms, passes {name: ms}, graphs_compiled_inside
    errors: list = field(default_factory=list)  # "rank <r>: <message>" with its traceback lines, in log order

    @property
    def run_id(self) -> str:
        return self.path.stem

    @property
    def source_sha256(self) -> str:
        return sha256_hex(self.source)

    @property
    def env(self) -> dict:
        return env_from_command(self.command)

    @property
    def seed(self):
        return self.hyperparameters.get("seed")

    @property
    def pytorch_version(self) -> str | None:
        return self.versions.get("torch")

    @property
    def score_name(self) -> str | None:
        """The final line that scores this run (see the module docstring), or None if unfinished."""
        exact = [name for name in self.finals if name.endswith("_exact")]
        for kind in ("_ttt_", "sliding_window", "roundtrip"):
            named = [name for name in exact if kind in name]
            if named:
                return named[-1]
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
        return self.finals[self.score_name]["val_loss"] if self.finished else None

    @property
    def val_bpb(self) -> float | None:
        return self.finals[self.score_name]["val_bpb"] if self.finished else None

    @property
    def roundtrip_val_bpb(self) -> float | None:
        names = [n for n in self.finals if n.endswith("_roundtrip_exact")]
        return self.finals[names[-1]]["val_bpb"] if names else None

    @property
    def eval_time_ms(self) -> float | None:
        """Evaluation time of the scoring pass, from the non-exact twin of the score line."""
        if not self.finished:
            return None
        return self.finals.get(self.score_name.removesuffix("_exact"), {}).get("eval_time_ms")

    @property
    def pass_times_ms(self) -> dict:
        """{final line name: eval_time_ms} of every timed final pass (roundtrip, sliding_window, ttt)."""
        return {name: f["eval_time_ms"] for name, f in self.finals.items() if "eval_time_ms" in f}

    @property
    def eval_total_ms(self) -> float | None:
        """All the timed evaluation after training: the final_eval_total line, or (older logs) the sum of the passes."""
        if self.eval_total is not None:
            return self.eval_total["eval_time_ms"]
        return sum(self.pass_times_ms.values()) if self.pass_times_ms else None

    @property
    def prequant_val_bpb(self) -> float | None:
        """The last in-training validation (`step:N/N val_loss val_bpb`): the model before the export."""
        return next((s["val_bpb"] for s in reversed(self.steps) if "val_bpb" in s), None)

    @property
    def quant_gap_bpb(self) -> float | None:
        """What the export round trip cost: round-trip val_bpb minus pre-quantization val_bpb."""
        if self.roundtrip_val_bpb is None or self.prequant_val_bpb is None:
            return None
        return self.roundtrip_val_bpb - self.prequant_val_bpb

    @property
    def tokenizer(self) -> str | None:
        """'<tokenizer file> vocab <N>', to tell whether two runs' val_loss are in the same unit."""
        hp = self.hyperparameters
        if "tokenizer_path" not in hp:
            return None
        return f"{Path(hp['tokenizer_path']).name} vocab {hp.get('vocab_size', '?')}"

    @property
    def last_step(self) -> int | None:
        return max((s["step"] for s in self.steps), default=None)

    @property
    def iterations(self) -> int | None:
        return self.steps[-1]["iterations"] if self.steps else self.hyperparameters.get("iterations")

    @property
    def train_time_ms(self) -> float | None:
        times = [s["train_time_ms"] for s in self.steps if "train_time_ms" in s]
        if self.stopping_early and "train_time_ms" in self.stopping_early:
            times.append(self.stopping_early["train_time_ms"])
        return max(times, default=None)

    @property
    def step_avg_ms(self) -> float | None:
        avgs = [s["step_avg_ms"] for s in self.steps if "step_avg_ms" in s]
        return avgs[-1] if avgs else None

    @property
    def val_curve(self) -> list:
        """[(step, train_time_ms, val_bpb)] from the in-training validation lines."""
        return [(s["step"], s.get("train_time_ms"), s["val_bpb"]) for s in self.steps if "val_bpb" in s]


def split_source(data: bytes, path: Path) -> tuple[bytes, bytes]:
    """Split a log's bytes into (embedded source, the log lines after it), checking the hash."""
    header = SOURCE_HEADER.match(data)
    if header is None:
        raise LogError(f"{path}: not a train_gpt.py run log (first line should be "
                       f"'==== train_gpt.py source bytes:N sha256:HEX ====')")
    n, claimed = int(header.group(1)), header.group(2).decode()
    source = data[header.end():header.end() + n]
    if len(source) != n or sha256_hex(source) != claimed:
        raise LogError(f"{path}: the embedded source does not match its header (bytes:{n} sha256:{claimed}); "
                       f"the log was edited or truncated, rerun to get an intact log")
    rest = data[header.end() + n:]
    if rest.startswith(b"\n" + SOURCE_FOOTER):  # the writer may add a newline after a source without one
        rest = rest[1:]
    if not rest.startswith(SOURCE_FOOTER):
        raise LogError(f"{path}: '{SOURCE_FOOTER.decode()}' does not follow the {n} source bytes")
    return source, rest[len(SOURCE_FOOTER):]


def parse_log(path) -> RunLog:
    path = Path(path)
    source, rest = split_source(path.read_bytes(), path)
    run = RunLog(path=path, source=source)
    for line_no, raw in enumerate(rest.decode("utf-8", errors="replace").splitlines(), start=1):
        line = raw.strip()
        if m := ERROR_LINE.fullmatch(line):
            run.errors.append(f"rank {m.group(1)}: {m.group(2)}")
            continue
        if run.errors:  # the traceback of the error above: its lines are not log lines
            run.errors[-1] += "\n" + raw.rstrip()
            continue
        try:
            parse_line(run, line)
        except (ValueError, KeyError) as e:
            raise LogError(f"{path}: cannot parse line {line_no} after the source, {line[:80]!r}: {e}") from e
    return run


def parse_line(run: RunLog, line: str) -> None:
    if m := EVAL_TOTAL_LINE.fullmatch(line):
        passes = dict(item.split(":") for item in m.group(3).split(","))
        run.eval_total = {"eval_time_ms": float(m.group(1)), "limit_ms": float(m.group(2)),
                          "passes": {name: float(ms.removesuffix("ms")) for name, ms in passes.items()},
                          "graphs_compiled_inside": int(m.group(4)) if m.group(4) else None}
    elif m := STEP_LINE.fullmatch(line):
        run.steps.append({"step": int(m.group(1)), "iterations": int(m.group(2)), **parse_fields(m.group(3))})
    elif m := FINAL_LINE.fullmatch(line):
        run.finals[m.group(1)] = parse_fields(m.group(2))
    elif line.startswith("versions:"):
        run.versions = dict(FIELD.findall(line.removeprefix("versions:")))
    elif line.startswith("hardware:") and not run.hardware:
        run.hardware = line.removeprefix("hardware:").strip()
    elif line.startswith("command:") and not run.command:
        run.command = line.removeprefix("command:").strip()
    elif line.startswith("hyperparameters:"):
        run.hyperparameters = json.loads(line.removeprefix("hyperparameters:"))
    elif line.startswith("world_size:"):
        run.layout = parse_fields(line)
    elif m := re.fullmatch(r"model_params:(\d+)", line):
        run.model_params = int(m.group(1))
    elif line.startswith("gptq:"):
        run.calibration = parse_fields(line.removeprefix("gptq:"))
    elif line.startswith("stopping_early:"):
        run.stopping_early = parse_fields(line.removeprefix("stopping_early:"))
    elif m := re.fullmatch(r"Serialized model (\S+): (\d+) bytes", line):
        run.export_family, run.model_bytes = m.group(1), int(m.group(2))
    elif m := re.fullmatch(r"Code size: (\d+) bytes(?: \(packed from (\d+): PACK_CODE=1\))?", line):
        run.code_bytes = int(m.group(1))
        run.code_packed_from = int(m.group(2)) if m.group(2) else None
    elif m := re.fullmatch(r"Total submission size (\S+): (\d+) bytes", line):
        run.export_family, run.total_bytes = m.group(1), int(m.group(2))
    elif m := re.fullmatch(r"artifact: (.+?) bytes:(\d+) sha256:([0-9a-f]{64})(?: .*)?", line):  # then export_time
        run.artifact_path, run.artifact_bytes, run.artifact_sha256 = m.group(1), int(m.group(2)), m.group(3)


def find_artifact(run: RunLog, *extra_dirs) -> Path | None:
    """Locate the run's model file: beside the log, in extra_dirs, or at its logged path from the run's cwd."""
    if run.artifact_path is None:
        return None
    name = Path(run.artifact_path).name
    candidates = [run.path.parent / name, *(Path(d) / name for d in extra_dirs),
                  Path(run.artifact_path), run.path.parent.parent / run.artifact_path]
    return next((p for p in candidates if p.is_file()), None)


def import_source(source: bytes, filename: str):
    """A logged train_gpt.py as a module, from its bytes (its top level has no side effects); `filename` names it in
    tracebacks and lets inspect read its source. One module per distinct source."""
    name = f"logged_train_gpt_{sha256_hex(source)[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    text = source.decode("utf-8")
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)  # None: never stale
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None, origin=filename))
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
    """What PACK_CODE=1 counted: the logged script's own pack_source applied to the logged source."""
    key = sha256_hex(source)
    if key not in _PACKED:
        _PACKED[key] = import_source(source, filename).pack_source(source)
    return _PACKED[key]


def unpack_code(packed: bytes) -> bytes | None:
    """The program a PACK_CODE=1 file runs (its two lines exactly, nothing around them), or None if it is not one."""
    if not (packed.startswith(PACKED_HEAD) and packed.endswith(PACKED_TAIL)):
        return None
    payload = packed[len(PACKED_HEAD):-len(PACKED_TAIL)]
    if re.fullmatch(rb"[0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~]*", payload) is None:  # base85's alphabet: no quote, no newline
        return None
    try:
        return lzma.decompress(base64.b85decode(payload))
    except (ValueError, lzma.LZMAError):
        return None


def load_tracks(path=TRACKS_PATH) -> dict:
    return json.loads(Path(path).read_text())


def track_by_challenge_name(tracks: dict, spelled: str) -> str | None:
    """Our track key (the folder name, track_cpu) for the challenge's spelling in submission.json (cpu)."""
    return next((key for key, track in tracks.items() if track.get("challenge_name") == spelled), None)
