"""A probe that times any trainer's steps from outside it: ours and the challenge's train_gpt.py alike.

    PROBE_OUT=probe.json PROBE_START=13 PROBE_STEPS=20 python -c \
        "import sys; sys.path.insert(0, 'bench'); import step_probe; step_probe.run_script('train_gpt.py')"

Both scripts step a class named Muon once per training step, warmup's steps included, so a global optimizer
step hook counts steps without touching either script. After step PROBE_START the probe synchronizes the
device, reads the clock and resets the peak memory; after PROBE_STEPS more it does the same again, so the
window holds whole steps as each script runs them (its own host reads included) between two syncs. Then, with
PROBE_PROFILE=N, torch.profiler records N more steps. The JSON is written at each stage, and the process ends
after the last (os._exit: the script's evaluation is not what is measured).
"""

import json
import os
import runpy
import sys
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

# Host calls that wait for the device: a steady training step should make none of them.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "aten::_local_scalar_dense")


class Probe:
    def __init__(self, environ=os.environ):
        self.out = environ["PROBE_OUT"]
        self.start = int(environ["PROBE_START"])
        self.steps = int(environ["PROBE_STEPS"])
        self.profile = int(environ.get("PROBE_PROFILE", "0"))
        self.first_timed = int(environ.get("PROBE_FIRST_TIMED", "1"))  # warmup steps + 1
        self.launched = float(environ.get("PROBE_LAUNCHED", time.time()))
        self.cuda = torch.cuda.is_available()
        self.count = 0
        self.report = {}
        self.profiler = None

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def write(self):
        with open(self.out, "w") as f:
            json.dump(self.report, f, indent=1)

    def memory_mib(self, peak=True):
        if not self.cuda:
            return None
        return (torch.cuda.max_memory_allocated() if peak else torch.cuda.memory_allocated()) / 2**20

    def __call__(self, optimizer, args, kwargs):
        if type(optimizer).__name__ != "Muon":
            return
        self.count += 1
        if self.count == self.first_timed:
            self.report["launch_to_first_timed_step_s"] = time.time() - self.launched
        if self.count == self.start:
            self.sync()
            self.report["peak_mib_before_window"] = self.memory_mib()
            self.report["resident_mib"] = self.memory_mib(peak=False)
            if self.cuda:
                torch.cuda.reset_peak_memory_stats()
            self.t0 = time.perf_counter()
        if self.count == self.start + self.steps:
            self.sync()
            self.report["window_steps"] = self.steps
            self.report["ms_per_step"] = 1000 * (time.perf_counter() - self.t0) / self.steps
            self.report["peak_mib_in_window"] = self.memory_mib()
            self.write()
            if not self.profile:
                os._exit(0)
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.cuda:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.start()
            self.t0 = time.perf_counter()
        if self.profiler and self.count == self.start + self.steps + self.profile:
            self.sync()
            wall_ms = 1000 * (time.perf_counter() - self.t0)
            self.profiler.stop()
            trace = os.environ.get("PROBE_TRACE") or f"{self.out}.trace.json"
            self.profiler.export_chrome_trace(trace)
            self.report["profile"] = summarize(trace, self.profile, wall_ms)
            self.write()
            os._exit(0)


def summarize(trace: str, steps: int, wall_ms: float) -> dict:
    """Per profiled step, from the profiler's trace: wall time, the device's busy time (the union of its
    kernels' intervals), kernel launches, host calls that wait for the device; and the costliest kernels."""
    with open(trace) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    busy_us = 0.0
    end = -1.0
    for e in sorted(kernels, key=lambda e: e["ts"]):
        if e["ts"] + e["dur"] > end:
            busy_us += e["ts"] + e["dur"] - max(e["ts"], end)
            end = e["ts"] + e["dur"]
    syncs = {}
    for e in events:
        if e["name"].startswith(SYNC_CALLS):
            syncs[e["name"]] = syncs.get(e["name"], 0) + 1
    totals = {}
    for e in kernels:
        totals[e["name"]] = totals.get(e["name"], 0.0) + e["dur"]
    top = sorted(totals.items(), key=lambda item: -item[1])[:15]
    return {"steps": steps, "wall_ms_per_step": wall_ms / steps,
            "device_busy_ms_per_step": busy_us / 1000 / steps, "kernels_per_step": len(kernels) / steps,
            "sync_calls_per_step": {name: n / steps for name, n in sorted(syncs.items())},
            "top_kernels_ms_per_step": {name[:80]: us / 1000 / steps for name, us in top}}


def run_script(path: str) -> None:
    """Run a trainer as `python path` would, with the probe's hook installed."""
    register_optimizer_step_post_hook(Probe())
    sys.argv = [path]
    sys.path[0] = os.path.dirname(os.path.abspath(path))  # as `python path` has it: its folder first
    runpy.run_path(path, run_name="__main__")
