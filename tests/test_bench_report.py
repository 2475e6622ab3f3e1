"""`specdec bench --report`: the rows of many runs, one table per CPU kind, each row naming its commit."""

import json

import pytest

from specdec.bench.provenance import commit, cpu_kind
from specdec.bench.report import cross_run_report, read_runs
from specdec.cli import main
from specdec.errors import SpecdecError


def row(method, cpu, commit="abc1234", task="chat", median=1.5):
    return {"task": task, "method": method, "temperature": 0.0, "gamma": "auto", "speedup":
            {"median": median, "min": 1.0, "max": 2.0}, "alpha": 0.5, "tau": 1.8, "tokens_per_s": 100.0,
            "path": "lean", "cpu": cpu, "commit": commit, "date": "2026-12-07", "target": "smollm2-135m"}


def write(directory, rows):
    directory.mkdir(parents=True)
    (directory / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_one_table_per_cpu_kind_each_row_with_its_commit(tmp_path):
    write(tmp_path / "zen4", [row("plain", "AMD EPYC (AVX-512 VNNI)"), row("trained", "AMD EPYC (AVX-512 VNNI)")])
    write(tmp_path / "xeon" / "run2", [row("trained", "Intel Xeon (AMX-INT8)", commit="def5678", median=1.75)])
    report = cross_run_report(read_runs([tmp_path]))
    amd, xeon = report.index("### AMD EPYC (AVX-512 VNNI)"), report.index("### Intel Xeon (AMX-INT8)")
    assert amd < xeon and "| plain |" not in report
    assert "| 1.50× (1.00–2.00) |" in report[amd:xeon] and "abc1234" in report[amd:xeon]
    assert "| 1.75× (1.00–2.00) |" in report[xeon:] and "def5678" in report[xeon:]


def test_bad_report_inputs_say_what_is_wrong(tmp_path, capsys):
    with pytest.raises(SpecdecError, match="no rows.jsonl"):
        read_runs([tmp_path])
    (tmp_path / "rows.jsonl").write_text('{"task": "chat"}\n')
    with pytest.raises(SpecdecError, match="rows.jsonl:1: not a bench row"):
        read_runs([tmp_path])
    write(tmp_path / "plain-only", [row("plain", "x")])
    with pytest.raises(SpecdecError, match="no speculative run"):
        cross_run_report(read_runs([tmp_path / "plain-only"]))
    assert main(["bench", "--report", str(tmp_path / "missing")]) == 1
    assert "missing does not exist" in capsys.readouterr().err


def test_cpu_kind_names_the_instructions_that_choose_the_path():
    assert cpu_kind("AMD EPYC", {"avx2", "avx512_vnni", "avx512_bf16"}) == "AMD EPYC (AVX-512 VNNI, AVX-512 BF16)"
    assert cpu_kind("AMD EPYC", {"avx2", "fma"}) == "AMD EPYC (AVX2)"
    assert cpu_kind("Intel Xeon", {"amx_int8", "amx_bf16", "avx512_vnni", "avx2"}).startswith(
        "Intel Xeon (AMX-INT8, AMX-BF16, AVX-512 VNNI")
    assert commit()  # a checkout's short hash, or the version elsewhere
