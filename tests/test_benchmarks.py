"""Every benchmark script runs (tiny --smoke cases through the interpreter): scripts that only run
on the GPU machine must not rot between GPU sessions."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from opselect.dispatch import get_op

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("bench_*.py"))
PNG = b"\x89PNG\r\n\x1a\n"


def _plots():
    """benchmarks/plots.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("plots", ROOT / "benchmarks" / "plots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _has_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


@pytest.mark.slow  # (make test-all; see the Makefile)
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_script_smoke(script, tmp_path, cpu_triton):
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPSELECT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT), "OUT": str(tmp_path)}
    args = [sys.executable, str(ROOT / "benchmarks" / script), "--smoke"]
    if script != "bench_dispatch.py":
        args.append("--no-save")
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "!!" not in result.stdout, result.stdout[-3000:]  # a provider was wrong or failed
    assert list(tmp_path.glob("*.json")), "the script wrote no JSON under $OUT"
    if _has_matplotlib():  # every harness table (softmax's backward one too) has its chart
        plots = _plots()
        for md in tmp_path.glob("*.md"):
            if plots.plottable(json.loads(md.with_suffix(".json").read_text())):
                assert md.with_suffix(".png").read_bytes().startswith(PNG), md.name


#: The probes that take --smoke (the others need a GPU's timers or kernels cut from a commit).
PROBES = sorted(p.name for p in (ROOT / "benchmarks").glob("probe_*.py")
                if "--smoke" in p.read_text())


@pytest.mark.slow  # (make test-all; as the benchmark scripts' smoke runs)
@pytest.mark.parametrize("script", PROBES)
def test_probe_script_smoke(script, tmp_path, cpu_triton):
    """A probe's variants run on tiny inputs and each one that should be right is: probes import
    the kernels' private helpers, which must not change under them unnoticed."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPSELECT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--smoke",
                             "--rounds", "1"], env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert " ok" in result.stdout and "WRONG" not in result.stdout, result.stdout[-3000:]


@pytest.mark.slow
def test_ab_isin_smoke(tmp_path, cpu_triton):
    """ab_isin.py loads older copies of isin's set kernels beside the current ones (here: copies
    of the current files, from a folder, as on the lent GPU without git) and checks both."""
    older = tmp_path / "before"
    older.mkdir()
    for name in ("common", "hash", "bitmap"):
        (older / f"{name}.py").write_text(
            (ROOT / "opselect" / "kernels" / "isin" / f"{name}.py").read_text())
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPSELECT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ab_isin.py"), "--smoke",
                             "--rounds", "1", "--before", str(older), "--cases", "in 1024"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("before") >= 2 and "WRONG" not in result.stdout, result.stdout
    assert not list((ROOT / "opselect" / "kernels" / "isin").glob("_before_*.py"))


@pytest.mark.slow
def test_ab_isin_backends_smoke(tmp_path, cpu_triton):
    """ab_isin_backends.py checks every config of every backend against torch.isin before it
    times them (an error exit on a wrong answer)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPSELECT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT), "OUT": str(tmp_path)}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ab_isin_backends.py"),
                             "--smoke", "--rounds", "1", "--cases", "in 1024 int64"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "cuckoo/0" in result.stdout and "hash/0" in result.stdout, result.stdout
    assert (tmp_path / "ab_isin_backends.json").exists()


def test_merged_table_says_when_each_row_was_measured(tmp_path):
    """A table merged from runs of different days names each day and its number of rows (a
    reader can tell the re-run rows from the old ones); rows saved before rows carried a date
    take their file's."""
    harness = _harness()
    suite = harness.Suite(op="isin", cases=[harness.Case(n, lambda d: ((), {}), 1 << 20)
                                            for n in ("a", "b", "c")],
                          torch_fn=None, check=None)
    old = [{"case": n, "bytes": 1 << 20, "ms": {"torch": 1.0, "hash": 0.5}, "errors": {}}
           for n in ("a", "b", "c")]
    for row in old:  # (as saved: with the numbers derived from the times)
        harness._derive(row, get_op("isin"), 1e12)
    saved = tmp_path / "isin.json"
    saved.write_text(json.dumps({"date": "2026-11-01", "rows": old}))
    new = [{"case": "b", "bytes": 1 << 20, "ms": {"hash": 0.25}, "errors": {},
            "measured": "2026-11-28"}]
    rows = harness._merged(saved, new, suite, 1e12)
    assert [r["measured"] for r in rows] == ["2026-11-01", "2026-11-28", "2026-11-01"]
    assert rows[1]["ms"] == {"torch": 1.0, "hash": 0.25}  # the old providers kept, the new laid over
    result = {"op": "isin", "device": "cpu", "torch": "t", "triton": "t", "opselect": "o",
              "date": "2026-11-28", "copy_bandwidth_GBps": 1000.0, "rows": rows,
              "summary": {}}
    header = harness.markdown(result, suite).splitlines()[2]
    assert "rows measured 2026-11-28 (1), 2026-11-01 (2)" in header, header
    result["rows"] = [dict(r, measured="2026-11-28") for r in rows]
    assert "o, 2026-11-28. Copy" in harness.markdown(result, suite).splitlines()[2]


def test_filter_and_fold_of_a_table_without_a_suite():
    """--filter's a|b|c and whole-name parts; softmax's backward table merged case by case (a
    filtered run once saved that table with no rows)."""
    harness = _harness()
    args = harness.parse_args(["--filter", "x50257|4Kx4K float32$"])
    assert harness.selected(args, "4Kx50257 bfloat16 fwd+bwd")
    assert harness.selected(args, "4Kx4K float32")
    assert not harness.selected(args, "4Kx4K float32 fwd+bwd")
    assert harness.selected(harness.parse_args([]), "anything")
    saved = [{"case": c, "ms": {"torch": 1.0}} for c in "abc"]
    folded = harness.fold_by_case(saved, [{"case": "d", "ms": {}}, {"case": "b", "ms": {}}])
    assert [(r["case"], r["ms"]) for r in folded] == [("a", {"torch": 1.0}), ("b", {}),
                                                      ("c", {"torch": 1.0}), ("d", {})]


def _row(case: str, pct: dict) -> dict:
    """A row as the harness derives it: a provider without a time is None in ms and absent from
    pct_copy_bw."""
    ms = {name: (None if v is None else 1.0 / v) for name, v in pct.items()}
    return {"case": case, "bytes": 1 << 20, "ms": ms, "errors": {},
            "pct_copy_bw": {name: v for name, v in pct.items() if v is not None}}


def test_plot_draws_every_provider_of_a_harness_result(tmp_path):
    """A chart of a harness result: a PNG (issue 35), bars for torch, the plain backends, auto
    and flag_gems; not for per-config columns, nor for a provider no case has a time for; the
    suite's bandwidth target read from its summary."""
    pytest.importorskip("matplotlib")
    plots = _plots()
    result = {"op": "toy", "device": "NVIDIA H200", "gpu": "h200", "copy_bandwidth_GBps": 4000.0,
              "summary": {"cases": 3, "target_85pct_copy_bw_min": 40.0,
                          "targets_met": {"85pct_copy_bw": False, "never_3pct_slower": True}},
              "rows": [
                  _row("small", {"torch": 5.0, "fast": 20.0, "slow": None, "fast#0": 19.0,
                                 "flag_gems": 4.0, "auto-cold": 18.0, "auto-warm": 20.0,
                                 "never": None}),
                  _row("big", {"torch": 60.0, "fast": 90.0, "slow": 30.0, "auto-cold": 88.0,
                               "auto-warm": 91.0, "flag_gems": None, "never": None}),
                  _row("huge", {"torch": 70.0, "fast": None, "slow": 99.0, "auto-cold": 99.0,
                                "auto-warm": 101.0}),
              ]}
    names, colours = plots.providers(result)
    assert names == ["torch", "fast", "slow", "auto-cold", "auto-warm", "flag_gems"]
    assert set(colours) == set(names) and len(set(colours.values())) == len(names)
    assert plots.targets(result) == [85.0]
    path = plots.plot(result, tmp_path / "toy.png")
    data = path.read_bytes()
    assert data.startswith(PNG) and len(data) > 10_000
    # what is not a harness table gets no chart
    assert plots.plottable(result)
    assert not plots.plottable({"rows": [{"case": "x", "us": 1.0}]})
    assert not plots.plottable({"report": {}}) and not plots.plottable([1, 2])


def test_plot_draws_the_metric_a_result_names(tmp_path):
    """A result whose chart names another per-provider number (matmul: percent of the roofline)
    gets bars of that number, its own target lines, and no same-size copy mark; without a
    chart entry the percent of copy bandwidth is drawn, as before."""
    pytest.importorskip("matplotlib")
    plots = _plots()
    rows = [_row("a", {"torch": 5.0, "fast": 20.0}), _row("b", {"torch": 60.0, "fast": None})]
    rows[0]["pct_roofline"] = {"torch": 50.0, "fast": 90.0}
    rows[1]["pct_roofline"] = {"torch": 70.0, "late": 10.0}
    result = {"op": "toy", "device": "NVIDIA H200", "rows": rows,
              "summary": {"target_85pct_copy_bw_min": 1.0},
              "chart": {"metric": "pct_roofline", "label": "% of roofline", "targets": [80],
                        "target_label": "decode {t:g}%"}}
    assert plots.metric(result) == "pct_roofline"
    assert plots.providers(result)[0] == ["torch", "fast", "late"]
    assert plots.targets(result) == [80.0]  # the chart's, not the summary's 85
    assert plots.plot(result, tmp_path / "toy.png").read_bytes().startswith(PNG)
    del result["chart"]
    assert plots.metric(result) == "pct_copy_bw" and plots.targets(result) == [85.0]
    assert plots.providers(result)[0] == ["torch", "fast"]


@pytest.mark.slow  # (make test-all; see the Makefile)
def test_bench_matmul_reports_throughput_and_targets(tmp_path, cpu_triton):
    """bench_matmul.py (issue 36): linear and matmul cases in one table, the peer timed, TFLOP/s
    and percent of peak per provider, the weight's read bandwidth on decode rows only, the
    issue's three targets judged and printed last, the roofline chart."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPSELECT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT), "OUT": str(tmp_path)}
    args = [sys.executable, str(ROOT / "benchmarks" / "bench_matmul.py"), "--smoke", "--no-save"]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "!!" not in result.stdout, result.stdout[-3000:]
    data = json.loads((tmp_path / "matmul.json").read_text())
    assert {r["form"] for r in data["rows"]} == {"linear", "matmul"}
    for row in data["rows"]:
        assert {"torch", "tiled", "persistent", "auto-cold", "auto-warm",
                "triton_autotune"} <= set(row["ms"]), row["case"]
        assert set(row["TFLOPs"]) == set(row["pct_peak"]) == set(row["pct_roofline"])
        assert "copy" not in row["pct_roofline"]
        assert ("pct_weight_bw" in row) == (row["m"] <= 16), row["case"]
    assert any(r["ms"].get("splitk") for r in data["rows"])  # a smoke case long enough in k
    met = data["summary"]["targets_met"]
    assert set(met) == {"never_3pct_slower_than_torch", "decode_80pct_copy_bw",
                        "decode_1.1x_torch_geomean"}
    assert data["chart"]["metric"] == "pct_roofline"
    md = (tmp_path / "matmul.md").read_text()
    assert "| auto TFLOP/s | auto %peak | auto %B bw |" in md
    assert md.rstrip().splitlines()[-3].startswith("| auto never more than 3% slower")
    assert result.stdout.rstrip().splitlines()[-1].startswith("| decode geomean speed-up")
    if _has_matplotlib():
        assert (tmp_path / "matmul.png").read_bytes().startswith(PNG)


@pytest.mark.slow
def test_harness_writes_the_chart_beside_the_table(tmp_path, cpu_triton):
    """A benchmark's run writes <op>.png next to <op>.md under $OUT (torch only, to be quick)."""
    pytest.importorskip("matplotlib")
    env = {**os.environ, "TRITON_INTERPRET": "1", "OPSELECT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT), "OUT": str(tmp_path)}
    args = [sys.executable, str(ROOT / "benchmarks" / "bench_isin.py"), "--smoke", "--no-save",
            "--providers", "torch"]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "isin.md").exists()
    assert (tmp_path / "isin.png").read_bytes().startswith(PNG)


@pytest.mark.slow  # (make test-all: make test stays under its 5 minutes on 2 cores)
def test_bench_random_reports_every_mode(tmp_path, cpu_triton):
    """bench_random.py (issue 16 item 3) fits on one seed and reports on another: every call is
    timed for torch, its backends and auto cold / fitted / tuned, with each mode's pick and
    regret, and the targets are judged (on a CPU the numbers themselves mean nothing)."""
    import json

    env = {**os.environ, "TRITON_INTERPRET": "1", "OPSELECT_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": str(ROOT), "OUT": str(tmp_path)}
    args = [sys.executable, str(ROOT / "benchmarks" / "bench_random.py"), "--smoke", "--no-save",
            "--ops", "permute,isin", "--calls", "2", "--seed", "5", "--fit-seed", "4"]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "!!" not in result.stdout, result.stdout[-3000:]
    data = json.loads((tmp_path / "random_permute_isin.json").read_text())
    assert (data["fit"]["seed"], data["report"]["seed"]) == (4, 5)
    assert len(data["fit"]["rows"]) == len(data["report"]["rows"]) == 4
    for row in data["report"]["rows"]:
        assert {"torch", "auto-cold", "auto-fitted", "auto-tuned"} <= set(row["s"]), row["s"]
        assert set(row["picks"]) == set(row["regret"]) == {"cold", "fitted", "tuned"}
        # (a regret below 1 is possible: a pick's default config can beat the tuned one)
        assert all(r > 0 for r in row["regret"].values())
    assert {"permute", "isin", "all"} == set(data["report"]["summary"])
    assert set(data["targets_met"]) == {
        "tuned_never_3pct_slower_than_cold", "auto_tuned_never_3pct_slower_than_torch",
        "auto_cold_never_3pct_slower_than_torch", "cold_regret_p90_le_1.10",
        "cold_regret_max_le_1.5", "tuned_regret_geomean_le_1.03"}
    assert any(key.startswith("permute/") for key in data["fit"]["scales"])


@pytest.mark.slow  # (make test-all; see the Makefile)
def test_bench_random_in_parts_measures_the_same_calls(tmp_path, cpu_triton):
    """A run spread over GPU sessions: the fit seed once, the report seed in parts (--fit-from,
    --part), then --merge: the merged run reports exactly the calls of a whole run."""
    import json

    def run(out, *extra):
        out.mkdir()
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), "OUT": str(out),
               "OPSELECT_CACHE_DIR": str(tmp_path / "cache")}
        args = [sys.executable, str(ROOT / "benchmarks" / "bench_random.py"), "--smoke",
                "--no-save", "--ops", "permute", "--calls", "3", *extra]
        result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return out

    whole = run(tmp_path / "whole")
    fit_rows = str(whole / "random.fit.rows.json")
    one = run(tmp_path / "one", "--fit-from", fit_rows, "--part", "1/2")
    two = run(tmp_path / "two", "--fit-from", fit_rows, "--part", "2/2")
    # The merge may run on another machine (here: parts from a GPU): it reports theirs.
    part_one = one / "random_permute_part1of2.json"
    data = json.loads(part_one.read_text())
    data.update(device="NVIDIA H200", gpu="h200", torch="2.11.0+cu130")
    part_one.write_text(json.dumps(data))
    merged = run(tmp_path / "merged", "--merge", f"{one / 'random_permute_part1of2.json'},"
                                                 f"{two / 'random_permute_part2of2.json'}")

    def calls(path):
        return [row["call"] for row in json.loads(path.read_text())["report"]["rows"]]

    assert len(calls(one / "random_permute_part1of2.json")) == 2
    assert calls(merged / "random_permute.json") == calls(whole / "random_permute.json")
    report = json.loads((merged / "random_permute.json").read_text())
    assert (report["device"], report["gpu"], report["torch"]) == ("NVIDIA H200", "h200",
                                                                  "2.11.0+cu130")


@pytest.mark.slow
def test_bench_random_fit_is_robust_to_few_and_odd_rows(tmp_path):
    """The fit's scale of a backend is the median ratio of measured to predicted time, pulled
    toward 1 where the rows are few: one odd row (a tie-heavy call, a noisy timing) does not set
    it, and two rows do not move it all the way. (A subprocess: importing bench_random points
    the process's tune cache at a directory of its own.)"""
    import json

    snippet = """
import json, sys
import bench_random as b
from opselect.dispatch.device import device_info
from opselect.heuristics import device_model
import torch
live = device_model.model_for(device_info(torch.device("cpu")))
def rows(ratios):
    return [{"op": "topk", "s": {"maxima": 1e-3 * r}, "predicted_s": {"maxima": 1e-3}}
            for r in ratios]
out = {}
for name, ratios in {"odd": [1.0] * 7 + [10.0], "few": [2.0, 2.0], "many": [2.0] * 60,
                     "host_bound": [3.0 * b.FIT_MIN_S / 1e-3 / 10] * 8}.items():
    out[name] = b.fit(rows(ratios), live)[1].get("topk/maxima")
print(json.dumps({"scales": out, "prior": b.FIT_PRIOR_ROWS, "min_s": b.FIT_MIN_S}))
"""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": f"{ROOT}:{ROOT / 'benchmarks'}",
           "OPSELECT_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-c", snippet], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    scales, prior = data["scales"], data["prior"]
    assert scales["odd"] == pytest.approx(1.0)  # the median, not the geomean (1.33)
    assert scales["few"] == pytest.approx(2.0 ** (2 / (2 + prior)))
    assert 1.0 < scales["few"] < scales["many"] < 2.0
    assert scales["many"] == pytest.approx(2.0 ** (60 / (60 + prior)))
    assert scales["host_bound"] is None  # rows under FIT_MIN_S are host-bound: not fitted


def _harness():
    """benchmarks/harness.py as a module."""
    spec = importlib.util.spec_from_file_location("harness", ROOT / "benchmarks" / "harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("harness", module)  # (its dataclasses look their module up there)
    spec.loader.exec_module(sys.modules["harness"])
    return sys.modules["harness"]


def test_providers_are_timed_in_turns_each_auto_with_its_cache(tmp_path, monkeypatch):
    """A case's providers take turns (A B C A B C, the best of the rounds), auto cold and auto
    warm among them, each timed with its own tune cache entered; a wrong provider is recorded
    and never timed."""
    import torch

    harness = _harness()
    monkeypatch.setenv("OPSELECT_CACHE_DIR", str(tmp_path))
    ref = torch.arange(4)
    turns, clock = [], iter(range(100, 0, -1))  # each timing shorter than the one before

    def time_once(fn):
        fn()
        turns.append((names[fn], os.environ["OPSELECT_CACHE_DIR"]))
        return float(next(clock))

    providers = {"torch": lambda: ref.clone(), "fast": lambda: ref + 0,
                 "wrong": lambda: ref + 1}
    auto = lambda: ref * 1  # noqa: E731
    names = {fn: name for name, fn in providers.items()} | {auto: "auto"}
    row = {"case": "c", "ms": {}, "errors": {}}
    warmed = []
    harness.measure(row, providers, auto, ref=ref, inputs=None,
                    check=lambda got, want, _: None if torch.equal(got, want) else "differs",
                    wanted=lambda p: p != "copy", explain=lambda: "fast",
                    warm=lambda: warmed.append(os.environ["OPSELECT_CACHE_DIR"]),
                    time_once=time_once, rounds=2)
    order = [name for name, _ in turns]
    assert order == ["torch", "fast", "auto", "auto"] * 2
    dirs = [d for name, d in turns if name == "auto"]
    cold, warm = dirs[0], dirs[1]
    assert dirs == [cold, warm, cold, warm] and cold != warm and warmed == [warm]
    assert row["ms"] == {"wrong": None, "torch": 96.0, "fast": 95.0, "auto-cold": 94.0,
                         "auto-warm": 93.0}
    assert row["errors"] == {"wrong": "differs"}
    assert row["auto_cold_choice"] == row["auto_warm_choice"] == "fast"


@pytest.mark.slow  # (make test-all)
def test_host_routed_in_model_smoke(tmp_path):
    """The in-model host timing (a tiny Llama on the CPU; it runs anywhere transformers does)."""
    pytest.importorskip("transformers")
    env = {**os.environ, "OPSELECT_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_routed_in_model.py"),
                             "--smoke"], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "heads.contiguous() (transposed)" in result.stdout
