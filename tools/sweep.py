"""Run settings x seeds of train_gpt.py, N at a time, and print one table: mean ± std per configuration and the
challenge's significance verdict against a baseline configuration.

    python tools/sweep.py --name lr_ttt --grid "MATRIX_LR=0.02,0.03 TTT_LORA_LR=0.0001,0.0003" --seeds 1,2,3 \\
        --base "NUM_LAYERS=11 ITERATIONS=20000" --baseline "MATRIX_LR=0.03 TTT_LORA_LR=0.0001" --gpus 0,1,2,3,4,5,6,7 \\
        -- torchrun --standalone --nproc_per_node=1 train_gpt.py
    python tools/sweep.py --name lrs --configs lrs.txt --seeds 1,2 --cpu-threads 1 --parallel 2 -- python train_gpt.py

Configurations: --grid "NAME=v1,v2 NAME=v3,v4" (every combination), or --configs FILE (one configuration a line,
`NAME=value NAME=value`; `#` comments; a line `-` is the base command alone). Each configuration x seed is one
run, RUN_ID <name>_<name=value...>_s<seed> (lower case, other characters made '_'), env = this environment, then
--base, then the configuration, then SEED, RUN_ID and ARTIFACT_DIR=<out>/logs. --parallel N runs N at a time: with
--gpus, each slot gets its share of the GPUs through CUDA_VISIBLE_DEVICES (8 GPUs and --parallel 2: 4 each);
with --cpu-threads T, each run gets OMP_NUM_THREADS=T.

A run whose log already holds a score is skipped, so a rerun of the same command finishes an interrupted sweep;
a failed run's log is moved to <out>/failed/ and the run is started again. Failures are reported with the end of
their log's error (`error: rank ...` and its traceback), or of their stderr. The table (tools/summarize.py's,
per configuration: score mean ± std over seeds, one-sided Welch test against --baseline at 0.005 nats and p < 0.01,
pre-quantization and round-trip val_bpb, quantization gap, train and eval time, artifact bytes) goes to stdout and
<out>/summary.txt, .csv and .json, with val_bpb curves against step and training time in <out>/*.png (matplotlib,
optional). Console output of each run: <out>/console/<RUN_ID>.out.
"""

import argparse
import hashlib
import itertools
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

import compare
import summarize
from runlog import LogError, parse_log

MAX_RUN_ID = 120  # train_gpt.py allows 200; long grids get a hash instead of a longer name


@dataclass
class PlannedRun:
    settings: dict  # the configuration's
    seed: int
    run_id: str


def parse_grid(text: str) -> list[dict]:
    """'A=1,2 B=x' -> [{A: 1, B: x}, {A: 2, B: x}]."""
    axes = []
    for name, values in summarize.parse_settings(text).items():
        choices = [v for v in values.split(",") if v != ""]
        if not choices:
            raise ValueError(f"--grid: {name}= has no values; write {name}=v1,v2")
        axes.append([(name, v) for v in choices])
    return [dict(combo) for combo in itertools.product(*axes)]


def parse_config_file(path: Path) -> list[dict]:
    configs = []
    for line_no, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            configs.append({} if line == "-" else summarize.parse_settings(line))
        except ValueError as e:
            raise ValueError(f"{path}:{line_no}: {e}") from None
    return configs


def run_id_for(name: str, settings: dict, seed: int) -> str:
    parts = [name] + [f"{k.lower()}={v}" for k, v in sorted(settings.items())] + [f"s{seed}"]
    run_id = re.sub(r"[^A-Za-z0-9.=-]+", "_", "_".join(parts)).strip("._")
    if len(run_id) > MAX_RUN_ID:  # readable head, unique tail
        digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
        run_id = f"{run_id[:MAX_RUN_ID - 16]}_{digest}_s{seed}"
    return run_id


def plan(name: str, configs: list[dict], seeds: list[int]) -> list[PlannedRun]:
    runs = [PlannedRun(c, s, run_id_for(name, c, s)) for c in configs for s in seeds]
    ids = [r.run_id for r in runs]
    if len(set(ids)) != len(ids):
        raise ValueError("two runs would share a RUN_ID: the configurations repeat, or differ only in characters "
                         "a RUN_ID cannot hold")
    return runs


def slot_envs(parallel: int, gpus: list[str] | None, cpu_threads: int | None) -> list[dict]:
    """One environment per slot: its GPUs, or its CPU thread count."""
    if gpus:
        if len(gpus) % parallel:
            raise ValueError(f"--parallel {parallel} does not split --gpus {','.join(gpus)} evenly")
        share = len(gpus) // parallel
        return [{"CUDA_VISIBLE_DEVICES": ",".join(gpus[i * share:(i + 1) * share])} for i in range(parallel)]
    return [{"OMP_NUM_THREADS": str(cpu_threads)} if cpu_threads else {} for _ in range(parallel)]


class Sweep:
    def __init__(self, args):
        self.args, self.out = args, Path(args.out)
        self.logs, self.console, self.failed = self.out / "logs", self.out / "console", self.out / "failed"
        self.print_lock = threading.Lock()
        self.exit_codes = {}
        self.stopping = False  # Ctrl-C: no new run starts

    def say(self, message: str) -> None:
        with self.print_lock:
            print(message, flush=True)

    def log_path(self, run: PlannedRun) -> Path:
        return self.logs / f"{run.run_id}.txt"

    def finished(self, run: PlannedRun) -> bool:
        try:
            return self.log_path(run).is_file() and parse_log(self.log_path(run)).finished
        except LogError:
            return False

    def set_aside(self, run: PlannedRun) -> None:
        """An unfinished or failed log stays readable in failed/, and train_gpt.py gets a fresh RUN_ID log."""
        path = self.log_path(run)
        if path.exists():
            self.failed.mkdir(parents=True, exist_ok=True)
            n = 1 + sum(1 for _ in self.failed.glob(f"{run.run_id}.*.txt"))
            path.rename(self.failed / f"{run.run_id}.{n}.txt")

    def env_for(self, run: PlannedRun, slot: dict) -> dict:
        return {**os.environ, **self.args.base_env, **run.settings, "SEED": str(run.seed), "RUN_ID": run.run_id,
                "ARTIFACT_DIR": str(self.logs), **slot}

    def launch(self, run: PlannedRun, slots: Queue) -> None:
        slot = slots.get()
        try:
            if self.stopping:
                return
            self.set_aside(run)
            self.console.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            with open(self.console / f"{run.run_id}.out", "w") as out:
                try:
                    code = subprocess.run(self.args.command, env=self.env_for(run, slot), stdout=out,
                                          stderr=subprocess.STDOUT).returncode
                except OSError as e:  # the command itself cannot start
                    out.write(f"sweep.py: cannot start {' '.join(self.args.command)}: {e}\n")
                    code = 127
            self.exit_codes[run.run_id] = code
            state = "finished" if code == 0 and self.finished(run) else f"FAILED (exit {code})"
            self.say(f"{state}: {run.run_id} in {time.perf_counter() - started:.1f} s"
                     + (f" [{' '.join(f'{k}={v}' for k, v in slot.items())}]" if slot else ""))
        finally:
            slots.put(slot)

    def execute(self, runs: list[PlannedRun]) -> None:
        todo = [r for r in runs if not self.finished(r)]
        for r in runs:
            if r not in todo:
                self.say(f"skipped (finished before): {r.run_id}")
        envs = slot_envs(self.args.parallel, self.args.gpus, self.args.cpu_threads)
        slots = Queue()
        for env in envs:
            slots.put(env)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.say(f"{len(todo)} of {len(runs)} runs to do, {len(envs)} at a time: {' '.join(self.args.command)}")
        pool = ThreadPoolExecutor(max_workers=len(envs))
        try:
            for future in [pool.submit(self.launch, r, slots) for r in todo]:
                future.result()
        except KeyboardInterrupt:  # the runs in flight got the same Ctrl-C; start no more
            self.stopping = True
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        pool.shutdown()

    def result(self, run: PlannedRun) -> summarize.Result:
        """The run's numbers from its log; a run without a usable log fails with its console's last lines."""
        path, code = self.log_path(run), self.exit_codes.get(run.run_id)
        try:
            result = summarize.result_from_run(parse_log(path), run.settings) if path.is_file() else None
        except LogError as e:
            result = summarize.Result(run.run_id, run.settings, run.seed, "failed", str(e), str(path))
        if result is None:
            result = summarize.Result(run.run_id, run.settings, run.seed, "failed", None, None)
        result.settings = {**run.settings, "SEED": str(run.seed)}
        if result.status != "finished" and result.error is None:
            tail = self.console_tail(run)
            exit_note = f"exit code {code}" if code is not None else "not run in this invocation"
            where = "no error line in its log" if path.is_file() else "it wrote no log"
            result.error = f"{exit_note}; {where}" + (f"; console ends:\n{tail}" if tail else "")
            result.status = "failed" if code else result.status
        return result

    def console_tail(self, run: PlannedRun, lines: int = 15) -> str:
        path = self.console / f"{run.run_id}.out"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.is_file() else ""


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """(sweep options, the training command after --)."""
    if "--" not in argv:
        return argv, []
    i = argv.index("--")
    return argv[:i], argv[i + 1:]


def main(argv=None) -> int:
    options, command = split_command(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s (--grid SPEC | --configs FILE) [options] -- COMMAND...")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--grid", help="'NAME=v1,v2 NAME=v3': every combination is a configuration")
    which.add_argument("--configs", type=Path, help="a file of configurations, one a line: 'NAME=v NAME=v' ('-': base)")
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated SEEDs, each configuration runs them all "
                                                         "(default 1,2,3)")
    parser.add_argument("--base", default="", help="env assignments every run gets, e.g. 'NUM_LAYERS=11 ITERATIONS=500'")
    parser.add_argument("--baseline", help="the configuration the others are tested against, e.g. 'MATRIX_LR=0.03'")
    parser.add_argument("--name", help="the sweep's name, the start of every RUN_ID (default: --out's name, or sweep)")
    parser.add_argument("--out", help="the sweep's folder: logs/, console/, failed/, summary.* (default: sweeps/NAME)")
    parser.add_argument("--parallel", type=int, help="runs at a time (default: 1 per GPU with --gpus, else 1)")
    slots = parser.add_mutually_exclusive_group()
    slots.add_argument("--gpus", help="GPU indices to share among the parallel runs, e.g. 0,1,2,3")
    slots.add_argument("--cpu-threads", type=int, help="OMP_NUM_THREADS for each run")
    parser.add_argument("--margin", type=float, default=compare.MARGIN_NATS, help="required improvement in nats")
    parser.add_argument("--alpha", type=float, default=compare.ALPHA, help="significance level")
    parser.add_argument("--dry-run", action="store_true", help="list the runs and their settings, launch nothing")
    args = parser.parse_args(options)
    if not command:
        raise SystemExit("error: give the training command after --, e.g. -- python train_gpt.py")
    args.command = command
    args.name = args.name or (Path(args.out).name if args.out else "sweep")
    args.out = args.out or str(Path("sweeps") / args.name)
    args.gpus = [g for g in args.gpus.split(",") if g] if args.gpus else None
    args.parallel = args.parallel or (len(args.gpus) if args.gpus else 1)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        configs = parse_grid(args.grid) if args.grid else parse_config_file(args.configs)
        args.base_env = summarize.parse_settings(args.base)
        baseline = summarize.parse_settings(args.baseline) if args.baseline is not None else None
        runs = plan(args.name, configs, seeds)
        if args.parallel < 1:
            raise ValueError(f"--parallel {args.parallel}: need at least 1")
        slot_envs(args.parallel, args.gpus, args.cpu_threads)
        if baseline is not None:  # refuse a misspelt baseline before any run
            summarize.find_config([summarize.Config(c, []) for c in configs], baseline)
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    if not configs or not seeds:
        raise SystemExit("error: no configurations or no seeds: nothing to run")
    sweep = Sweep(args)
    if args.dry_run:
        for run in runs:
            env = {**args.base_env, **run.settings, "SEED": run.seed, "RUN_ID": run.run_id, "ARTIFACT_DIR": sweep.logs}
            print(" ".join(f"{k}={v}" for k, v in env.items()) + " " + " ".join(command))
        return 0
    sweep.execute(runs)

    results = [sweep.result(r) for r in runs]
    text, rows, data = summarize.report(results, {}, True, baseline, args.margin, args.alpha)
    text = (f"sweep {args.name}: {len(configs)} configurations x {len(seeds)} seeds"
            + (f"; base: {summarize.settings_label(args.base_env)}" if args.base_env else "") + "\n" + text)
    print(text)
    (sweep.out / "summary.txt").write_text(text + "\n")
    summarize.write_csv(rows, sweep.out / "summary.csv")
    summarize.write_json({"name": args.name, "command": command, "base": args.base_env, "seeds": seeds, **data},
                         sweep.out / "summary.json")
    print(summarize.plot_curves(summarize.group_by_config(results), sweep.out))
    print(f"wrote {sweep.out / 'summary.txt'}, summary.csv, summary.json")
    return 0 if all(r.status == "finished" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
