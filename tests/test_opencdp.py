"""Shop events from CSV (model/data/opencdp.py): the Open CDP / REES46 format on rows of the real
slice (tests/data/rees46_sample.csv; credit: REES46 Marketing Platform, rees46.com, Kaggle
`mkechinov/ecommerce-behavior-data-from-multi-category-store`), a generic column mapping,
bad rows reported and skipped, and `intentstream train` / `model evaluate` reading them."""

from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from model.artifact import load_model
from model.data.opencdp import (
    OPENCDP_HEADER,
    MappingError,
    csv_events,
    opencdp_events,
    parse_mapping,
    parse_ts,
)
from tests.conftest import NO_TEST_USERS, run_cli

SAMPLE = Path(__file__).parent / "data" / "rees46_sample.csv"
HEADER = ",".join(OPENCDP_HEADER)


def read(lines, reader=opencdp_events):
    errors: list[tuple[int, str]] = []
    events = list(reader(lines, lambda n, why: errors.append((n, why))))
    return events, errors


def test_the_sample_reads_in_file_order_and_its_bad_rows_are_reported_by_line():
    with open(SAMPLE, encoding="utf-8", newline="") as f:
        events, errors = read(f)
    assert len(events) == 737
    assert Counter(e["type"] for e in events) == {"view": 665, "purchase": 53, "cart": 19}
    assert [n for n, _ in errors] == [102, 403, 704, 742]
    assert "empty user_id" in errors[0][1]
    assert "event_time" in errors[1][1] and "yesterday" in errors[1][1]
    assert "4 fields, expected 9" in errors[2][1]
    assert "8 fields, expected 9" in errors[3][1]  # the slice's last line, cut upstream
    # the first row as it is in the file
    first = {"ts": 1569888000000, "type": "view", "user_id": "541312140",
             "product_id": "44600062", "brand": "shiseido", "price": "35.79"}  # fmt: skip
    assert events[0] == first
    ts = [e["ts"] for e in events]
    assert ts == sorted(ts)  # the slice is in time order, and so are its events
    assert all(set(e) <= {"ts", "type", "user_id", "product_id", "category_code", "brand",
                          "price"} for e in events)  # fmt: skip


def test_types_keep_the_shops_names_empty_fields_left_out_and_times_in_utc_ms():
    rows = [
        HEADER,
        "2019-10-01 00:00:01 UTC,cart,1,2,electronics.audio,sony,10.50,7,"
        "5e9a9d4e-9ce1-4b17-9d3d-1c0c12345678",
        "2019-10-01 00:00:02 UTC,remove_from_cart,1,2,,,,7,5e9a9d4e-9ce1-4b17-9d3d-1c0c12345678",
        "2019-10-01 00:00:03 UTC,wishlist,1,2,,,,7,",  # another type: kept as it is
    ]
    events, errors = read(line + "\r\n" for line in rows)
    assert errors == []
    # the names the live shop sends: a model trained on the export must know them
    assert [e["type"] for e in events] == ["cart", "remove_from_cart", "wishlist"]
    assert events[0] == {"ts": 1569888001000, "type": "cart", "user_id": "7",
                         "product_id": "1", "category_code": "electronics.audio",
                         "brand": "sony", "price": "10.50"}  # fmt: skip
    assert events[1] == {"ts": 1569888002000, "type": "remove_from_cart", "user_id": "7",
                         "product_id": "1"}  # fmt: skip


def test_a_last_line_cut_in_its_session_id_is_a_bad_row_but_a_whole_one_is_kept():
    whole = "2019-10-01 00:00:01 UTC,view,1,2,,,3.0,7,5e9a9d4e-9ce1-4b17-9d3d-1c0c12345678"
    events, errors = read([HEADER + "\n", whole])  # no line end, but whole
    assert len(events) == 1 and errors == []
    events, errors = read([HEADER + "\n", whole + "\n", whole[:-5]])
    assert len(events) == 1 and errors == [(3, "truncated last line: user_session "
                                                "'5e9a9d4e-9ce1-4b17-9d3d-1c0c123'")]  # fmt: skip


def test_a_header_without_the_columns_is_refused_and_an_empty_file_has_no_events():
    with pytest.raises(MappingError, match="event_time"):
        read(["a,b,c\n", "1,2,3\n"])
    assert read([]) == ([], [])


def test_a_generic_mapping_reads_ms_seconds_and_iso_times():
    fmt = parse_mapping("user_id=visitorid, type=event, ts=timestamp, product_id=itemid")
    lines = [
        "timestamp,visitorid,event,itemid,transactionid\n",
        "1433221332117,257597,view,355908,\n",
        "1433221332.5,257597,addtocart,355908,\n",
        "2015-06-02T05:02:12Z,257597,transaction,,42\n",
        "2015-06-02 05:02:13,,view,1,\n",
        "soon,257597,view,1,\n",
        "1433221332117,257597,view\n",
    ]
    events, errors = read(lines, lambda ls, err: csv_events(ls, fmt, err))
    assert events == [
        {"ts": 1433221332117, "type": "view", "user_id": "257597", "product_id": "355908"},
        {"ts": 1433221332500, "type": "addtocart", "user_id": "257597", "product_id": "355908"},
        {"ts": 1433221332000, "type": "transaction", "user_id": "257597"},
    ]
    assert [n for n, _ in errors] == [5, 6, 7]
    assert "empty visitorid" in errors[0][1] and "timestamp" in errors[1][1]


def test_times_and_mappings():
    assert parse_ts("2019-10-01 00:00:00 UTC") == 1569888000000
    assert parse_ts("2019-10-01T02:00:00+02:00") == 1569888000000
    assert parse_ts("1569888000") == 1569888000000
    assert parse_ts("1569888000000") == 1569888000000
    for bad in ("", "nan", "inf", "10/01/2019"):
        with pytest.raises(ValueError):
            parse_ts(bad)
    for bad, why in (("type=event", "user_id"), ("user_id=a,type", "FIELD=COLUMN"),
                     ("user_id=a,user_id=b,type=c", "twice")):  # fmt: skip
        with pytest.raises(MappingError, match=why):
            parse_mapping(bad)


def test_the_train_flags_refuse_a_mapping_that_cannot_read():
    from worker.commands.event_files import data_format
    from worker.common.settings import SettingsError

    with pytest.raises(SettingsError, match="--format csv needs --columns"):
        data_format("csv", None)
    with pytest.raises(SettingsError, match="--columns is the mapping of --format csv"):
        data_format("opencdp", "user_id=a,type=b")
    with pytest.raises(SettingsError, match="--columns: the mapping needs type"):
        data_format("csv", "user_id=a")


@pytest.mark.integration
def test_train_and_evaluate_read_opencdp_files_gzipped_or_not(tmp_path):
    gz = tmp_path / "rees46_sample.csv.gz"
    with open(SAMPLE, "rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    out = tmp_path / "m.npz"
    result = run_cli("train", "--data", str(gz), "--format", "opencdp", "--hidden", "8",
                     "--epochs", "1", "--validation-fraction", "0.3", "--quiet",
                     "--out", str(out), *NO_TEST_USERS)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"{gz}:102: empty user_id" in result.stderr
    assert f"{gz}:742: 8 fields, expected 9" in result.stderr
    assert "skipped 4 bad line(s)" in result.stderr
    model = load_model(out)
    assert model.meta.event_types == ["view", "purchase", "cart"]
    assert model.meta.model_extra["data"]["events"] == 737
    assert model.meta.model_extra["data"]["users"] == 172

    ev = run_cli("model", "evaluate", str(out), "--data", str(SAMPLE), "--format", "opencdp",
                 "--json")  # fmt: skip
    assert ev.returncode == 0, ev.stderr
    assert 0.0 <= json.loads(ev.stdout)[str(out)]["auc_last"] <= 1.0

    # the same rows through a generic mapping (types as they are in the file)
    mapped = run_cli("train", "--data", str(SAMPLE), "--format", "csv", "--columns",
                     "user_id=user_id,type=event_type,ts=event_time", "--hidden", "8",
                     "--epochs", "1", "--validation-fraction", "0.3", "--quiet",
                     "--out", str(tmp_path / "mapped.npz"), *NO_TEST_USERS)  # fmt: skip
    assert mapped.returncode == 0, mapped.stderr
    # cart is not renamed without the built-in mapping
    assert "cart" in load_model(tmp_path / "mapped.npz").meta.event_types

    refused = run_cli("train", "--data", str(SAMPLE), "--format", "csv", "--columns",
                      "user_id=visitorid,type=event")  # fmt: skip
    assert refused.returncode == 2
    assert "visitorid, event not in the header" in refused.stderr
