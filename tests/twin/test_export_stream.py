"""The streamed series export of ``twin run``: the same bytes as the in-memory export, families
and a window chosen on the command line, and a file the real promtool backfills."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from firedrill.adapters.outputs import write_chunks
from firedrill.cli import app
from firedrill.errors import ExportError, OutputError
from firedrill.model.series import Series, labels_of
from firedrill.specfile import load_fleet
from firedrill.twin.exposition import (
    as_sources,
    family_of,
    select_families,
    stream_openmetrics,
    stream_promtool_input_series,
    to_openmetrics,
    to_promtool_input_series,
)
from firedrill.twin.recorder import BLOCK_SCRAPES, SeriesStore
from firedrill.twin.run import run_twin

FLEET = "examples/fleet.yaml"
runner = CliRunner()


def _twin_run(out: Path, *extra: str) -> None:
    args = ["twin", "run", FLEET, "--hours", "0.1", "--seed", "3", "--out", str(out), "--quiet"]
    result = runner.invoke(app, [*args, *extra])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def in_memory() -> tuple[list[Series], float]:
    """Every series of the run ``_twin_run`` makes, as the export read them before streaming."""
    twin = run_twin(load_fleet(Path(FLEET)), seed=3, hours=0.1)
    return [s for n in twin.series_names() for s in twin.query(n, start_s=0, end_s=twin.t)], twin.t


# -- the same bytes as before ---------------------------------------------------------------------


def test_the_streamed_openmetrics_file_is_the_in_memory_export(
    tmp_path: Path, in_memory: tuple[list[Series], float]
) -> None:
    _twin_run(tmp_path)
    series, _ = in_memory
    assert (tmp_path / "series.om.txt").read_text() == to_openmetrics(series)


def test_the_streamed_promtool_file_is_the_in_memory_export(
    tmp_path: Path, in_memory: tuple[list[Series], float]
) -> None:
    _twin_run(tmp_path, "--series", "promtool", "--window", "60:5m")
    window = [
        Series(s.name, s.labels, s.t_s[m], s.values[m])
        for s in in_memory[0]
        if (m := (s.t_s >= 60) & (s.t_s <= 300)).any()
    ]
    expected = to_promtool_input_series(window, interval_s=15.0, start_s=60.0, end_s=300.0)
    assert (tmp_path / "input_series.yaml").read_text() == expected


def _histogram(t_s: list[float], labels: dict[str, str], scale: float) -> list[Series]:
    t = np.asarray(t_s)
    out = [
        Series("lat_seconds_bucket", labels_of(**labels, le=le), t, np.cumsum(np.ones_like(t)) * k)
        for k, le in ((1, "0.5"), (2, "+Inf"))
    ]
    out.append(Series("lat_seconds_count", labels_of(**labels), t, np.cumsum(np.ones_like(t)) * 2))
    out.append(Series("lat_seconds_sum", labels_of(**labels), t, t * scale))
    return out


@settings(max_examples=40, deadline=None)
@given(
    chunk=st.integers(min_value=1, max_value=7),
    n=st.integers(min_value=1, max_value=12),
    skew=st.booleans(),
    values=st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.integers(-(2**60), 2**60).map(float),
            st.just(-0.0),
        ),
        min_size=12,
        max_size=12,
    ),
)
def test_streaming_writes_what_to_openmetrics_writes(
    chunk: int, n: int, skew: bool, values: list[float]
) -> None:
    t = [15.0 * i for i in range(n)]
    series = [
        Series("g", labels_of(pod="b"), np.asarray(t), np.asarray(values[:n])),
        Series("g", labels_of(pod="a"), np.asarray(t[1:]), np.asarray(values[1:n])),
        *_histogram(t, {"pod": "a"}, 0.1),
        # a group whose series do not share their times is merged by time, as before
        *_histogram(t[1:] if skew else t, {"pod": "b"}, 1.0),
        Series("reqs_total", labels_of(), np.asarray(t), np.arange(n, dtype=np.float64)),
    ]
    if skew:
        series[-2] = Series(series[-2].name, series[-2].labels, np.asarray(t), np.asarray(t))
    streamed = "".join(stream_openmetrics(as_sources(series), epoch_s=1.7e9, chunk_samples=chunk))
    assert streamed == to_openmetrics(series, epoch_s=1.7e9)


def test_a_refused_sample_is_the_same_error_as_before() -> None:
    t = np.asarray([0.0, 15.0, 30.0])
    series = [Series("x_total", labels_of(), t, np.asarray([1.0, np.nan, 2.0]))]
    with pytest.raises(ExportError) as before:
        to_openmetrics(series)
    with pytest.raises(ExportError) as streamed:
        "".join(stream_openmetrics(as_sources(series)))
    assert str(streamed.value) == str(before.value)


def test_promtool_entries_stream_as_one_yaml_list() -> None:
    t = np.asarray([0.0, 15.0, 30.0])
    series = [
        Series("a", labels_of(x="1"), t, np.asarray([1.0, 1.0, 1.0])),
        Series("b", labels_of(), t, np.asarray([0.5, 1.0, 1.5])),
    ]
    for chosen in (series, series[:1], []):
        kw = {"interval_s": 15.0, "start_s": 0.0, "end_s": 30.0}
        streamed = "".join(stream_promtool_input_series(as_sources(chosen), **kw))
        assert streamed == to_promtool_input_series(chosen, **kw)


# -- choosing families and a window ---------------------------------------------------------------


def test_a_family_is_chosen_whole_by_name_glob_or_one_of_its_series() -> None:
    names = [
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_to_first_token_seconds_count",
        "vllm:num_requests_waiting",
        "http_requests_total",
    ]
    ttft = "vllm:time_to_first_token_seconds"
    assert select_families(names, ["vllm:time_to_first_token_seconds_count"]) == {ttft}
    assert select_families(names, ["vllm:*"]) == {ttft, "vllm:num_requests_waiting"}
    assert select_families(names, ["http_requests"]) == {"http_requests"}
    with pytest.raises(ExportError, match="did you mean vllm:num_requests_waiting"):
        select_families(names, ["vllm:num_request_waiting"])
    # a family the twin writes only when something happens is not unknown
    known = ["DCGM_FI_DEV_XID_ERRORS"]
    assert select_families(names, ["DCGM_*"], known=known) == {"DCGM_FI_DEV_XID_ERRORS"}


def test_twin_run_exports_only_the_chosen_families_over_the_window(
    tmp_path: Path, in_memory: tuple[list[Series], float]
) -> None:
    _twin_run(
        tmp_path, "--families", "vllm:time_to_first_token_seconds_bucket,http_*",
        "--families", "firedrill_replicas_ready", "--window", "2m:", "--series", "openmetrics",
    )  # fmt: skip
    chosen = {"vllm:time_to_first_token_seconds", "http_requests", "firedrill_replicas_ready"}
    expected = [
        Series(s.name, s.labels, s.t_s[m], s.values[m])
        for s in in_memory[0]
        if family_of(s.name) in chosen and (m := s.t_s >= 120).any()
    ]
    text = (tmp_path / "series.om.txt").read_text()
    assert text == to_openmetrics(expected)
    types = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert types == sorted(chosen)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--families", "vllm:num_request_waiting"], "did you mean vllm:num_requests_waiting"),
        (["--families", " , "], "names no family"),
        (["--families", "vllm:*", "--series", "none"], "drop --series none"),
        (["--window", "10m:5m"], "empty window"),
        (["--window", "3:9"], "no scrape between 3 s and 9 s"),
        (["--window", "1h:2h"], "after the run ends"),
        (["--window", "soon:1h"], "neither seconds"),
        (["--window", "300"], "START:END"),
    ],
)
def test_a_bad_choice_is_a_usage_error_before_anything_is_written(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    args = ["twin", "run", FLEET, "--hours", "0.05", "--out", str(tmp_path / "o"), "--quiet"]
    result = runner.invoke(app, [*args, *extra])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split()).replace("│", "").replace("  ", " ")
    assert not (tmp_path / "o" / "summary.json").exists()


# -- the real promtool ----------------------------------------------------------------------------


def test_promtool_backfills_a_streamed_openmetrics_export(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found; install the Debian package prometheus", pytrace=False)
    _twin_run(tmp_path, "--families", "vllm:*,http_requests,firedrill_cell_nodes")
    export = tmp_path / "series.om.txt"
    series_in_file = {
        line.rsplit(" ", 2)[0] for line in export.read_text().splitlines() if line[0] != "#"
    }
    result = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(export), str(tmp_path / "db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # one block of the run's 6 minutes, holding every series of the file
    rows = [ln.split() for ln in result.stdout.splitlines() if ln and ln[0].isdigit()]
    assert len(rows) == 1
    assert int(rows[0][-2]) == len(series_in_file)  # NUM SERIES
    assert (int(rows[0][1]), int(rows[0][2])) == (0, 360_001)  # MIN/MAX TIME (ms)


# -- the store behind it --------------------------------------------------------------------------


def test_the_store_keeps_exact_float32_and_widens_a_family_that_is_not() -> None:
    store = SeriesStore(15.0, 4)  # grows past its hint
    labels = [labels_of(i=str(i)) for i in range(3)]
    store.family("counts_total", labels)
    store.family("ratio", labels)
    store.family("zero", labels[:1])
    n = BLOCK_SCRAPES * 3 + 5
    for k in range(n):
        store.begin_scrape(15.0 * k)
        store.write("counts_total", k, np.asarray([k, 2**40 + 3 * k, 0.5]))
        store.write("ratio", k, np.asarray([0.1 * k, 1 / 3, np.nan]))
        store.write("zero", k, np.asarray([-0.0 if k % 2 else 0.0]))
        if k == BLOCK_SCRAPES + 2:  # a family registered mid-run, zero before it
            store.family("late_total", labels[:1])
            store.fill("late_total", 0.0, until_k=k)
        if k >= BLOCK_SCRAPES + 2:
            store.write("late_total", k, np.asarray([1.0]))
    assert store.families["counts_total"].rows.dtype == np.float32
    assert store.families["ratio"].rows.dtype == np.float64
    zero = store.query("zero", start_s=0, end_s=1e9)[0].values
    assert np.signbit(zero).tolist() == [k % 2 == 1 for k in range(n)]  # -0.0 stays -0.0
    [c0, c1, c2] = store.query("counts_total", start_s=0, end_s=1e9)
    assert c0.values.dtype == np.float64
    assert c0.values.tolist() == list(map(float, range(n)))
    assert c1.values.tolist() == [2.0**40 + 3 * k for k in range(n)]  # float32 offsets
    assert set(c2.values.tolist()) == {0.5}
    ratio = store.query("ratio", {"i": "0"}, start_s=0, end_s=1e9)[0].values
    assert ratio.tolist() == [0.1 * k for k in range(n)]
    assert np.isnan(store.query("ratio", {"i": "2"}, start_s=30, end_s=3000)[0].values).all()
    late = store.query("late_total", start_s=0, end_s=1e9)[0].values
    assert late.tolist() == [0.0] * (BLOCK_SCRAPES + 2) + [1.0] * (n - BLOCK_SCRAPES - 2)
    t, _, now = store.instant("ratio")
    assert t == 15.0 * (n - 1)
    assert now[:2].tolist() == [0.1 * (n - 1), 1 / 3]
    streamed = "".join(stream_openmetrics(store.stored(["ratio"], start_s=0, end_s=1e9)))
    assert streamed == to_openmetrics(store.query("ratio", start_s=0, end_s=1e9))


def test_a_restricted_store_records_only_what_it_keeps() -> None:
    store = SeriesStore(15.0, 8)
    store.family("kept", [labels_of()])
    store.family("dropped|a", [labels_of(a="1")])
    store.restrict(lambda name: name == "kept")
    store.family("dropped|b", [labels_of(a="2")])
    k = store.begin_scrape(0.0)
    store.write("kept", k, np.asarray([1.0]))
    store.write("dropped|a", k, np.asarray([2.0]))  # not recorded, not an error
    store.set_sparse("dropped", labels_of(node="n"), 0.0, 1.0)
    assert store.series_names() == ["kept"]
    with pytest.raises(KeyError):
        store.write("never_registered", k, np.asarray([1.0]))


def test_a_failed_stream_leaves_no_file_and_the_old_one_alone(tmp_path: Path) -> None:
    path = tmp_path / "series.om.txt"
    path.write_text("before\n")

    def chunks() -> object:
        yield "partial\n"
        raise ExportError("refused")

    with pytest.raises(ExportError):
        write_chunks(path, chunks())  # type: ignore[arg-type]
    assert path.read_text() == "before\n"
    assert list(tmp_path.iterdir()) == [path]
    with pytest.raises(OutputError):
        write_chunks(tmp_path / "series.om.txt" / "x", iter(["a"]))


@settings(max_examples=30, deadline=None)
@given(
    scrapes=st.integers(min_value=1, max_value=3 * BLOCK_SCRAPES + 3),
    start=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**62), 2**62)),
    steps=st.lists(
        st.one_of(
            st.integers(0, 2**20),
            st.floats(allow_nan=True, allow_infinity=True),
            st.just(-0.0),
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_what_the_store_reads_back_is_what_was_written_bit_for_bit(
    scrapes: int, start: float, steps: list[float]
) -> None:
    store = SeriesStore(15.0, 2)
    store.family("counter_total", [labels_of(c="0"), labels_of(c="1")])
    written = []
    value = float(start)
    for k in range(scrapes):
        with np.errstate(all="ignore"):
            value = float(np.float64(value) + np.float64(steps[k % len(steps)]))
        row = np.asarray([value, steps[k % len(steps)]], dtype=np.float64)
        written.append(row)
        store.write("counter_total", store.begin_scrape(15.0 * k), row)
    expected = np.asarray(written)
    for i, s in enumerate(store.query("counter_total", start_s=0, end_s=1e12)):
        got, want = s.values, expected[:, i]
        same = (got.view(np.int64) == want.view(np.int64)) | (np.isnan(got) & np.isnan(want))
        assert bool(same.all())


def test_with_slo_the_chosen_families_are_exported_but_every_family_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restricted: list[bool] = []
    real = SeriesStore.restrict

    def spy(self: SeriesStore, keep: Callable[[str], bool]) -> None:
        restricted.append(keep("vllm:num_requests_waiting") and not keep("http_requests_total"))
        real(self, keep)

    monkeypatch.setattr(SeriesStore, "restrict", spy)
    one = ["--families", "vllm:num_requests_waiting"]
    _twin_run(tmp_path / "slo", *one, "--slo", "examples/slo.yaml")
    assert restricted == []  # the burn-rate evaluator reads http_requests_total and the rest
    text = (tmp_path / "slo" / "series.om.txt").read_text()
    assert [ln for ln in text.splitlines() if ln.startswith("#")] == [
        "# TYPE vllm:num_requests_waiting gauge",
        "# EOF",
    ]
    _twin_run(tmp_path / "plain", *one)
    assert restricted == [True]
    assert (tmp_path / "plain" / "series.om.txt").read_text() == text
