"""tools/ on the challenge's own record folders: the one log reader on each generation of the
field's logs (tests/fixtures/records: a few lines of each, written for these tests), summarize,
check and compare on folders in each shape the field's submission.json takes. Milliseconds."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "records"
sys.path.insert(0, str(ROOT / "tools"))

import runlog  # noqa: E402


def read(name: str) -> runlog.RunLog:
    return runlog.parse_log(FIXTURES / name)


# ---- THE READER ----

def test_the_baselines_log():
    run = read("baseline.log")
    assert not run.ours and run.seed == 1337
    assert run.tokenizer == "fineweb_1024_bpe.model"
    assert run.setting("data_path") == "fineweb10B_sp1024"
    assert (run.last_step, run.iterations) == (13640, 20000)
    assert run.train_time_ms == 600_160 and run.step_avg_ms == 44.0
    # the raw model's size and total come first; the export's count
    assert (run.model_bytes, run.code_bytes) == (15_800_000, 1200)
    assert run.total_bytes == 15_801_200 and run.export_family == "int8+zlib"
    assert run.score_name == "int8_zlib_roundtrip_exact"
    assert (run.val_loss, run.val_bpb) == (2.07, 1.226)
    assert run.prequant_val_bpb == 1.22 and run.eval_total_ms == 1400


def test_marchs_log_scores_by_its_legal_ttt_line():
    run = read("march.log")
    assert run.seed == 42 and run.score_name == "legal_ttt_exact"
    assert (run.val_loss, run.val_bpb) == (1.889, 1.119)
    assert run.eval_time_ms == 410_000  # the non-exact twin's
    assert run.eval_total_ms == 6500 + 74_000 + 410_000  # the final passes
    assert run.roundtrip_val_bpb == 1.145 and run.prequant_val_bpb == 1.137
    assert run.total_bytes == 15_900_000 and run.code_bytes == 1300
    assert len(run.steps) == 3  # the source line with step:{step} is no step


def test_aprils_log_without_step_and_in_minutes():
    run = read("april.log")
    assert run.seed == 314 and run.setting("ttt_enabled") is True
    assert run.tokenizer == "fineweb_8192_bpe.model vocab 8192"
    assert run.setting("data_path") == "./data/datasets/fineweb10B_sp8192"
    assert [s["step"] for s in run.steps] == [0, 500, 4000, 4550]
    assert run.steps[1]["train_time_ms"] == 60_000  # 1.0m
    assert run.train_time_ms == 588_000  # stopping_early's, to the millisecond
    assert run.step_avg_ms == pytest.approx(588_000 / 4550)
    assert run.score_name == "quantized_ttt" and run.val_bpb == 1.081
    assert run.roundtrip_val_bpb == 1.099 and run.prequant_val_bpb == 1.087
    assert run.eval_total_ms == 25_000 + 121_000 + 366_000
    assert (run.code_bytes, run.total_bytes) == (1400, 15_976_400)


def test_late_aprils_log_with_times_compressed_code_and_a_total():
    run = read("phased.txt")
    assert run.seed == 0 and run.hyperparameters["artifact_dir"] == ""
    assert run.tokenizer == "fineweb_8192_bpe_caseops.model vocab 8192"
    assert (run.last_step, run.train_time_ms) == (4940, 599_600)
    assert (run.code_bytes, run.code_uncompressed) == (700, 1500)
    assert run.total_bytes == 15_900_700
    assert run.score_name == "quantized_ttt_phased" and run.val_loss == 2.319
    assert run.eval_total_ms == 508_800  # total_eval_time, not the diagnostics
    assert run.roundtrip_val_bpb == 1.073 and run.prequant_val_bpb == 1.064


def test_a_file_that_is_no_log_is_skipped_with_its_reason(tmp_path):
    with pytest.raises(runlog.LogError, match="notes.txt: not a run log"):
        read("notes.txt")
    shutil.copy(FIXTURES / "notes.txt", tmp_path)
    shutil.copy(FIXTURES / "april.log", tmp_path / "train_seed314.log")
    (tmp_path / "requirements.txt").write_text("brotli\n")
    (tmp_path / "logs").mkdir()
    shutil.copy(FIXTURES / "phased.txt", tmp_path / "logs" / "train0.txt")
    runs, skipped = runlog.read_logs(tmp_path)
    assert [r.path.name for r in runs] == ["train_seed314.log", "train0.txt"]
    assert len(skipped) == 1 and "notes.txt: not a run log" in skipped[0]


def test_settings_by_their_new_name_or_their_old_one():
    old = {"ttt": True, "log_dir": "logs", "quant_bits": 6}
    new = {"ttt_enabled": False, "artifact_dir": "runs"}
    assert runlog.setting(old, "ttt_enabled") is True
    assert runlog.setting(new, "ttt_enabled") is False
    assert runlog.setting(old, "artifact_dir") == "logs"
    assert runlog.setting(old, "matrix_bits") == 6
    assert runlog.setting(new, "matrix_bits", 8) == 8
    assert runlog.setting({"datasets_dir": "d"}, "data_path") == "d"


# ---- SUMMARIZE ----

def record_of_logs(root: Path, name: str, logs: dict) -> Path:
    """A folder holding the fixture logs under the names given: {name in folder: fixture}."""
    folder = root / name
    for target, fixture in logs.items():
        (folder / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / fixture, folder / target)
    return folder


def test_summarize_reads_every_generation_and_names_what_it_skipped(tmp_path, capsys):
    import summarize
    folder = record_of_logs(tmp_path, "2026-04-01_Mixed", {
        "train.log": "baseline.log", "train_seed42.log": "march.log",
        "train_seed314.log": "april.log", "logs/train0.txt": "phased.txt",
        "notes.txt": "notes.txt"})
    assert summarize.main([str(folder)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "every run: RECORD=2026-04-01_Mixed"
    rows = [line.split() for line in lines[2:6]]
    assert [r[0] for r in rows] == ["train0", "train_seed314", "train_seed42", "train"]
    assert rows[0][1:4] == ["(defaults)", "4940/20000", "121.38ms"]
    phased = dict(zip(lines[1].split(), rows[0]))
    assert phased["score_bpb"] == "1.0600" and phased["score_loss"] == "2.3190"
    assert phased["eval_s"] == "508.8" and phased["artifact_bytes"] == "15,900,700"
    assert phased["code_bytes"] == "700" and phased["prequant_bpb"] == "1.0640"
    assert "read 4 run logs, skipped 1 other files" in out
    assert "skipped " + str(folder / "notes.txt") + ": not a run log" in out


def test_summarize_groups_challenge_folders_one_configuration_each(tmp_path, capsys):
    import summarize
    one = record_of_logs(tmp_path, "2026-04-09_One", {
        "train_seed1.log": "april.log", "train_seed2.log": "april.log"})
    two = record_of_logs(tmp_path, "2026-04-27_Two", {"train_seed0.txt": "phased.txt"})
    assert summarize.main([str(one), str(two), "--group"]) == 0
    out = capsys.readouterr().out
    assert "RECORD=2026-04-27_Two" in out.splitlines()[1]
    assert "RECORD=2026-04-09_One   2/2  1.0810 ± 0.0000" in out


# ---- COMPARE ----

# per-seed values of three of the leaderboard's claims (openai/parameter-golf records/track_10min_16mb)
REC_1_0810 = dict(seeds=[42, 314, 999], bpb=[1.08079, 1.08103, 1.08118],
                  loss=[2.79180191, 2.79241542, 2.79281076])
VARLEN_1_0734 = dict(seeds=[0, 1, 2], bpb=[1.07258208, 1.07324696, 1.07426259],
                     loss=[2.77059090, 2.77230836, 2.77493185])
MUON097_1_0798 = dict(seeds=[0, 42, 1234], bpb=[1.07928348, 1.07996676, 1.08024795],
                      loss=[2.78790132, 2.78966630, 2.79039264])
CLIP12_1_0645 = dict(seeds=[314, 2025, 777, 1, 1337],
                     bpb=[1.06356801, 1.0641313, 1.06466993, 1.06509678, 1.06516558],
                     loss=[2.32748105, 2.32871372, 2.32989245, 2.33082656, 2.33097712])
CASEOPS_1_0655 = dict(seeds=[42, 0, 1234], bpb=[1.0661, 1.06473, 1.06563],
                      loss=[2.33302, 2.33002, 2.33199])


def field_log(path: Path, fixture: str, seed: int, val_loss: float, val_bpb: float) -> Path:
    """A fixture log as another seed's run: its seed and its score line's numbers changed."""
    text = (FIXTURES / fixture).read_text()
    text = re.sub(r"(  seed: |seed:)\d+", rf"\g<1>{seed}", text)
    score = list(re.finditer(r"val_loss:\S+ val_bpb:\S+", text))[-1]
    numbers = f"val_loss:{val_loss:.8f} val_bpb:{val_bpb:.8f}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text[:score.start()] + numbers + text[score.end():])
    return path


def claim_folder(root: Path, name: str, claim: dict, shape: str, fixture="april.log") -> Path:
    """A challenge folder with one log per seed and a submission.json in one of the field's
    shapes: seed_results with val_bpb only, seeds as a dict with both, or no per-seed results."""
    folder = root / name
    seeds = claim["seeds"]
    for seed, loss, bpb in zip(seeds, claim["loss"], claim["bpb"]):
        field_log(folder / f"train_seed{seed}.log", fixture, seed, loss, bpb)
    sub = {"author": "A", "github_id": "a", "name": name, "track": "10min_16mb",
           "val_bpb": round(sum(claim["bpb"]) / len(seeds), 5)}
    if shape == "seed_results":
        sub["seeds"] = seeds
        sub["seed_results"] = {str(s): {"val_bpb": b} for s, b in zip(seeds, claim["bpb"])}
    elif shape == "seeds dict":
        sub["seeds"] = {str(s): {"val_bpb": b, "val_loss": loss}
                        for s, b, loss in zip(seeds, claim["bpb"], claim["loss"])}
    (folder / "submission.json").write_text(json.dumps(sub, indent=2))
    return folder


def test_compare_per_token_as_the_challenge_reads_its_leaderboard(tmp_path, capsys):
    import compare
    best = claim_folder(tmp_path, "2026-04-09_Rec", REC_1_0810, "seed_results")
    varlen = claim_folder(tmp_path, "2026-04-10_VarLen", VARLEN_1_0734, "seed_results")
    # 1.0734 against 1.0810: val_loss from the logs, the challenge's 0.005 nats per token
    assert compare.main([str(varlen), str(best)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("unit: nats per token (val_loss); both used fineweb_8192_bpe.model")
    assert "val_bpb: submission.json; val_loss: logs" in out
    assert "one-sided p = 0.002618" in out and "verdict: SIGNIFICANT" in out
    # the other reading, per byte at the converted margin, agrees; the old one did not
    assert "nats per byte: improvement +0.005293 (needs > 0.001342), p = 0.002621" in out
    per_byte_unconverted = compare.compare(
        compare.in_unit(compare.load_sample(str(varlen)), "byte"),
        compare.in_unit(compare.load_sample(str(best)), "byte"))
    assert per_byte_unconverted.p == pytest.approx(0.24, abs=0.005)
    # 1.0798 against 1.0810 at margin 0, from `seeds` given as a dict: the quoted p = 0.020
    muon = claim_folder(tmp_path, "2026-04-09_Muon", MUON097_1_0798, "seeds dict")
    assert compare.main([str(muon), str(best), "--margin", "0"]) == 1
    out = capsys.readouterr().out
    assert "val_bpb: submission.json; val_loss: submission.json" in out
    assert "one-sided p = 0.0203" in out


def test_compare_reads_one_log_per_seed_when_the_json_has_none(tmp_path, capsys):
    import compare
    clip = claim_folder(tmp_path, "2026-04-22_Clip", CLIP12_1_0645, "none", "phased.txt")
    caseops = claim_folder(tmp_path, "2026-04-19_CaseOps", CASEOPS_1_0655, "seed_results",
                           "phased.txt")
    sample = compare.load_sample(str(clip))
    assert sample.source == "val_bpb: logs; val_loss: logs" and sample.n == 5
    # 1.0645 against 1.0655 at margin 0: the quoted p = 0.063
    assert compare.main([str(clip), str(caseops), "--margin", "0"]) == 1
    out = capsys.readouterr().out
    assert "fineweb_8192_bpe_caseops.model vocab 8192" in out
    assert "one-sided p = 0.0627" in out and "verdict: not significant" in out


def test_compare_across_tokenizers_per_byte_with_the_margin_converted(tmp_path, capsys):
    import compare
    best = claim_folder(tmp_path, "2026-04-09_Rec", REC_1_0810, "seed_results")
    caseops = claim_folder(tmp_path, "2026-04-19_CaseOps", CASEOPS_1_0655, "seed_results",
                           "phased.txt")
    assert compare.main([str(caseops), str(best)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("unit: nats per byte (val_bpb * ln 2; the tokenizers differ)")
    # CaseOps tokens: 2.332 nats per token at 1.0655 bpb is 3.157 bytes per token
    assert "0.005 nats per token at the candidate's 3.157 bytes per token" in out
    assert "not comparable: the tokenizers differ" in out  # the per-token reading, shown


def test_compare_refuses_two_logs_of_one_seed_without_per_seed_results(tmp_path):
    import compare
    folder = claim_folder(tmp_path, "2026-04-29_Rerun", REC_1_0810, "none")
    field_log(folder / "train_seed42_rerun.log", "april.log", 42, 2.7911, 1.0805)
    with pytest.raises(SystemExit, match=r"2 logs of seed 42 \(train_seed42.log, "
                                         r"train_seed42_rerun.log\)"):
        compare.load_sample(str(folder))
    # with seed_results, the log of each seed is the one its val_bpb names
    sub = json.loads((folder / "submission.json").read_text())
    sub["seed_results"] = {str(s): {"val_bpb": b}
                           for s, b in zip(REC_1_0810["seeds"], REC_1_0810["bpb"])}
    (folder / "submission.json").write_text(json.dumps(sub))
    assert compare.load_sample(str(folder)).losses == REC_1_0810["loss"]


# ---- CHECK ----

def challenge_folder(root: Path, name="2026-04-09_Clean", claim=None, fixture="april.log",
                     shape="seed_results") -> Path:
    """A clean folder in the challenge's shape: README.md, a train_gpt.py of the size the logs
    counted, a log per seed and a submission.json that agrees with them."""
    claim = claim or REC_1_0810
    folder = claim_folder(root / "track_10min_16mb", name, claim, shape, fixture)
    (folder / "README.md").write_text("# A record\n")
    run = runlog.parse_log(next(folder.glob("train_seed*")))
    size = run.code_uncompressed or run.code_bytes
    (folder / "train_gpt.py").write_text("#" * (size - 1) + "\n")
    return folder


def check(folder: Path) -> tuple[list, list]:
    import check_record
    warnings = []
    violations = check_record.check_folder(folder, warnings=warnings)
    return violations, warnings


def edit_logs(folder: Path, old: str, new: str) -> None:
    for log in folder.glob("train_seed*"):
        log.write_text(log.read_text().replace(old, new))


def test_a_clean_challenge_folder_passes_in_every_shape(tmp_path):
    for shape in ("seed_results", "seeds dict", "none"):
        folder = challenge_folder(tmp_path / shape, shape=shape)
        assert check(folder) == ([], []), shape
    # late April: timestamps, compressed code, total_eval_time; an ISO timestamp is a date
    folder = challenge_folder(tmp_path / "phased", "2026-04-19_Phased", CASEOPS_1_0655,
                              "phased.txt")
    sub = json.loads((folder / "submission.json").read_text())
    sub["date"] = "2026-04-19T00:00:00Z"
    (folder / "submission.json").write_text(json.dumps(sub))
    assert check(folder) == ([], [])


def test_check_finds_what_breaks_the_challenges_rules(tmp_path):
    folder = challenge_folder(tmp_path)
    edit_logs(folder, "Total submission size quantized+brotli: 15976400",
              "Total submission size quantized+brotli: 16000001")
    edit_logs(folder, "train_time: 588000ms", "train_time: 601500ms")
    edit_logs(folder, "eval_time:366000ms", "eval_time:466000ms")
    (folder / "train_gpt.py").write_text("#" * 1399 + "\n\n")
    violations, _ = check(folder)
    assert len(violations) == 12  # 4 each of the 3 logs
    one = [v for v in violations if v.startswith("train_seed42.log")]
    assert "16,000,001 bytes exceeds the track_10min_16mb cap of 16,000,000 bytes by 1" in one[0]
    assert "train_time 601500ms exceeds the track_10min_16mb limit of 600 s" in one[1]
    assert "total eval_time (the sum of the final passes) 612000ms exceeds" in one[2]
    assert "'Code size: 1,400 bytes' but train_gpt.py is 1,401 bytes (+1)" in one[3]


def test_check_finds_missing_files_and_fields(tmp_path):
    folder = challenge_folder(tmp_path)
    (folder / "README.md").unlink()
    (folder / "train_gpt.py").unlink()
    sub = json.loads((folder / "submission.json").read_text())
    del sub["github_id"]
    del sub["val_bpb"]
    sub["author"] = ""
    (folder / "submission.json").write_text(json.dumps(sub))
    violations, _ = check(folder)
    assert [v.split(": ", 1)[1][:22] for v in violations] == [
        "no README.md; the chal", "no train_gpt.py (nor a", "no author (your name);",
        "no github_id (your Git", "no val_bpb; the challe"]
    for log in folder.glob("*.log"):
        log.unlink()
    (folder / "submission.json").unlink()
    violations, _ = check(folder)
    assert any("no train log" in v for v in violations)
    assert any("no submission.json" in v for v in violations)


def test_check_warns_of_names_and_metadata_that_disagree_with_the_logs(tmp_path):
    folder = challenge_folder(tmp_path)
    sub = json.loads((folder / "submission.json").read_text())
    sub["seed_results"]["42"]["val_bpb"] = 1.0790  # the log shows 1.08079
    sub["seed_results"]["7"] = {"val_bpb": 1.081}  # a seed with no log
    sub["seeds"].append(7)
    sub["mean_val_bpb"] = sub.pop("val_bpb")
    sub["val_loss"] = 1.081  # the bpb, under val_loss
    sub["date"] = "April 9th"
    (folder / "submission.json").rename(folder / "submission_rec.json")
    (folder / "submission_rec.json").write_text(json.dumps(sub))
    (folder / "train_gpt.py").rename(folder / "train_gpt_v2.py")
    violations, warnings = check(folder)
    assert violations == []
    expected = ["submission_rec.json: the challenge names it submission.json",
                "train_gpt_v2.py: the challenge names the script train_gpt.py",
                "date 'April 9th' is not a date", "seed 7 has no log in the folder",
                "seed 42 val_bpb=1.079 but train_seed42.log shows 1.08079",
                "val_loss=1.081 is the val_bpb", "the score is under mean_val_bpb"]
    assert len(warnings) == len(expected)
    for text, warning in zip(expected, warnings):
        assert text in warning, (text, warning)


def test_check_warns_of_few_seeds_and_of_a_script_edited_after_compressed_runs(tmp_path):
    one_seed = dict(seeds=[0], bpb=[1.0661], loss=[2.33302])
    folder = challenge_folder(tmp_path, "2026-04-27_One", one_seed, "phased.txt")
    (folder / "train_gpt.py").write_text("#" * 1600)
    violations, warnings = check(folder)
    assert violations == []
    assert "train_seed0.log: ran a 1,500-byte source, but train_gpt.py is 1,600" in warnings[0]
    assert "counted 700 bytes of compressed code" in warnings[0]
    assert warnings[1].startswith("1 seed logged; a record shows p < 0.01")


def test_check_command_line_exits_1_on_violations_only(tmp_path, capsys):
    import check_record
    clean = challenge_folder(tmp_path / "a", "2026-04-09_Clean")
    warned = challenge_folder(tmp_path / "b", "2026-04-09_Warned")
    (warned / "train_gpt.py").rename(warned / "train_gpt_v2.py")
    assert check_record.main([str(clean), str(warned)]) == 0
    out = capsys.readouterr().out
    assert f"OK   {clean}\n" in out and f"OK   {warned}: 1 warning\n  warning: " in out
    broken = challenge_folder(tmp_path / "c", "2026-04-09_Broken")
    (broken / "README.md").unlink()
    assert check_record.main([str(clean), str(broken)]) == 1
    assert f"FAIL {broken}: 1 violation\n  - " in capsys.readouterr().out


# ---- OUR RECORDS, WITH THE SETTINGS' NEW NAMES OR THEIR OLD ONES ----

def test_make_reads_ttt_by_its_new_name_or_its_old_one(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    from test_records import make, write_log
    for name, flag in (("ttt_enabled", "TTT_ENABLED"), ("ttt", "TTT")):
        logs = []
        for seed in (1, 2, 3):
            path = write_log(tmp_path / name / f"r{seed}.txt", settings={"SEED": str(seed)},
                             val_loss=2.05 + seed / 1000, ttt=(1.95, 1.155, 300_000.0))
            text = path.read_text()
            hp = re.search(r"^hyperparameters: (.*)$", text, re.M)
            settings = {**json.loads(hp.group(1)), name: True, "ttt_chunk_tokens": 1024}
            line = "hyperparameters: " + json.dumps(settings)
            path.write_text(text[:hp.start()] + line + text[hp.end():])
            logs.append(path)
        folder = make(logs, tmp_path / name, short_name="Ttt")
        readme = (folder / "README.md").read_text()
        assert f"Test-time training (`{flag}=1`) is score-first" in readme
        assert "cut into chunks of 1,024 tokens" in readme


def test_compare_takes_val_loss_from_the_line_the_claimed_val_bpb_reports(tmp_path):
    import compare
    folder = tmp_path / "2026-03-23_Sliding"
    folder.mkdir()
    for seed in (42, 43):
        log = (FIXTURES / "march.log").read_text().replace("seed:42", f"seed:{seed}")
        (folder / f"train_seed{seed}.log").write_text(log)
    # the claim is the sliding window's 1.122, not the legal TTT line that follows it
    results = {"42": {"val_bpb": 1.122}, "43": {"val_bpb": 1.122}}
    (folder / "submission.json").write_text(json.dumps({"seed_results": results}))
    sample = compare.load_sample(str(folder))
    assert sample.losses == [1.894, 1.894] and sample.tokenizer == "fineweb_1024_bpe.model"


def test_compare_a_folder_of_known_tokenizer_with_bare_values_per_token(tmp_path, capsys):
    import compare
    best = claim_folder(tmp_path, "2026-04-09_Rec", REC_1_0810, "seed_results")
    values = ",".join(str(x) for x in VARLEN_1_0734["loss"])
    assert compare.main([values, str(best)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("unit: nats per token (val_loss); a side's tokenizer is unknown")
    assert "one-sided p = 0.002618" in out


RESERVED = "fineweb10B_sp8192_lossless_caps_caseops_v1_reserved"  # tracks.json: 80 shards, 47,853,344 tokens


def fingerprinted_folder(tmp_path: Path, shards=80, targets=47853343, tilt=None) -> Path:
    """#2135's shape: the reserved dataset, its fingerprint lines, and (tilt: the hints line's gates) the tilt on."""
    folder = challenge_folder(tmp_path, "2026-04-27_Tilt", CASEOPS_1_0655, "phased.txt")
    edit_logs(folder, "datasets/fineweb10B_sp8192_caseops", f"datasets/{RESERVED}")
    lines = f"1776000000.400 train_shards: {shards}\n1776000000.400 val_tokens: {targets}\n"
    if tilt is not None:
        edit_logs(folder, "  seed:", "  ngram_tilt_enabled: True\n1776000000.200   seed:")
        lines += f"1776000700.500 ngram_tilt:hints {tilt}\n" if tilt else ""
    edit_logs(folder, "1776000010.000 4500/", lines + "1776000010.000 4500/")
    return folder


def test_check_reads_the_audits_fingerprints(tmp_path):
    """The whole split, or cut at #2135's 2560, with 80 shards and the token channel alone passes; a train split
    that took validation documents, a cut validation split, a word channel's gates or too few hints do not."""
    gates = "total={} gated=628130 token_gate=628130 within_gate=0 word_gate=0 agree2plus=0"
    assert check(fingerprinted_folder(tmp_path / "whole")) == ([], [])
    cut = 47853343 // 2560 * 2560
    edit_logs(tilted := fingerprinted_folder(tmp_path / "cut", targets=cut, tilt=gates.format(cut)),
              "  seed:", "  eval_seq_len: 2560\n1776000000.200   seed:")
    assert check(tilted) == ([], [])

    violations, _ = check(fingerprinted_folder(tmp_path / "shards", shards=1499, targets=40000000))
    assert len(violations) == 6, violations  # 2 each of the 3 logs
    assert any("train_shards 1499, but fineweb10B_sp8192_lossless_caps_caseops_v1_reserved has 80" in v
               for v in violations)
    assert any("val_tokens 40000000, but" in v and "47,853,343 targets" in v for v in violations)

    word = gates.format(47853343).replace("word_gate=0", "word_gate=12")
    violations, _ = check(fingerprinted_folder(tmp_path / "word", tilt=word))
    assert len(violations) == 3 and all("ngram_tilt word_gate=12: that channel reads the scored token" in v
                                        for v in violations), violations
    violations, _ = check(fingerprinted_folder(tmp_path / "short", tilt=gates.format(1000)))
    assert all("total=1000 hints for val_tokens 47853343" in v for v in violations) and len(violations) == 3
    # April's: fewer shards (1.0614's seed 42 trained on 39), a tilt that logged no gates: unchecked, not wrong
    violations, warnings = check(fingerprinted_folder(tmp_path / "april", shards=39, tilt=""))
    assert violations == [] and len(warnings) == 6, warnings  # 2 each of the 3 logs
    assert sum("trained on 39 of fineweb10B_sp8192_lossless_caps_caseops_v1_reserved's 80 shards" in w
               for w in warnings) == 3
    assert sum("no `ngram_tilt:hints` line: its gate counts, which the audit reads, cannot be checked" in w
               for w in warnings) == 3
