"""The .npz artifact: round trip, and one test per way a file is refused."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from model.artifact import (
    ArtifactError,
    file_sha256,
    load_model,
    model_from_bytes,
    model_to_bytes,
    save_model,
    sha256_hex,
    state_shape,
)
from model.random_init import random_model
from tests.golden import golden_model

TYPES = ["view", "add_to_cart", "purchase"]


def npz_bytes(arrays: dict[str, np.ndarray], meta: dict | None) -> bytes:
    """An artifact assembled by hand with numpy alone, as a user might write one."""
    buf = io.BytesIO()
    if meta is not None:
        arrays = {"meta": np.frombuffer(json.dumps(meta).encode(), np.uint8), **arrays}
    np.savez(buf, **arrays)
    return buf.getvalue()


def good_parts(layers: int = 2) -> tuple[dict[str, np.ndarray], dict]:
    model = random_model(TYPES, hidden=4, layers=layers, features=["gap"], seed=0)
    return dict(model.arrays), model.meta.model_dump()


def test_round_trip_keeps_arrays_meta_and_digest(tmp_path: Path):
    model = random_model(TYPES, hidden=8, layers=2, features=["gap"], seed=1)
    path = tmp_path / "m.npz"
    digest = save_model(model, path)
    assert digest == file_sha256(path) == sha256_hex(path.read_bytes())
    loaded = load_model(path)
    assert loaded.meta == model.meta
    for name, a in model.arrays.items():
        np.testing.assert_array_equal(loaded.arrays[name], a)
    with np.load(path, allow_pickle=False) as raw:  # readable by plain numpy
        assert json.loads(raw["meta"].tobytes())["format"] == "intentstream.model/1"


def test_hand_written_artifact_with_only_required_meta_loads():
    arrays, meta = good_parts(layers=1)
    required = {
        k: meta[k]
        for k in (
            "format",
            "cell",
            "layers",
            "hidden",
            "event_types",
            "features",
            "head",
            "session_gap_seconds",
        )
    }
    model = model_from_bytes(npz_bytes(arrays, required))
    assert model.version == "file"


def test_optional_meta_is_kept():
    arrays, meta = good_parts()
    meta.update(version="7", metrics={"auc": 0.9})
    model = model_from_bytes(npz_bytes(arrays, meta))
    assert model.version == "7"
    assert model_from_bytes(model_to_bytes(model)).meta.model_extra["metrics"] == {"auc": 0.9}


def test_float64_golden_artifact_loads():
    assert model_from_bytes(model_to_bytes(golden_model())).meta.hidden == 2


def test_refuses_truncated_file(tmp_path: Path):
    data = model_to_bytes(random_model(TYPES, hidden=4, seed=0))
    path = tmp_path / "cut.npz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=r"cut\.npz.*(truncated|damaged|not a valid)"):
        load_model(path)


def test_refuses_non_npz_file(tmp_path: Path):
    path = tmp_path / "model.npz"
    path.write_text("this is not a model\n")
    with pytest.raises(ArtifactError, match=r"not a valid \.npz archive"):
        load_model(path)


@pytest.mark.parametrize("content", [b"garbage", b"\x80\x04K\x01.", b""])
def test_a_non_npz_file_is_refused_without_advice_to_load_it_unsafely(tmp_path, content):
    path = tmp_path / "model.npz"
    path.write_bytes(content)  # the second: a pickle
    with pytest.raises(ArtifactError) as info:
        load_model(path)
    text = str(info.value)
    assert "not a valid .npz archive" in text
    assert "trust" not in text and "allow_pickle" not in text and "pickle.load" not in text


def test_refuses_bare_npy():
    buf = io.BytesIO()
    np.save(buf, np.zeros(3))
    with pytest.raises(ArtifactError, match=r"bare \.npy"):
        model_from_bytes(buf.getvalue())


def test_refuses_missing_file(tmp_path: Path):
    with pytest.raises(ArtifactError, match="cannot read model file"):
        load_model(tmp_path / "nope.npz")


def test_refuses_missing_meta():
    arrays, _ = good_parts()
    with pytest.raises(ArtifactError, match="missing array: meta"):
        model_from_bytes(npz_bytes(arrays, None))


def test_refuses_missing_array():
    arrays, meta = good_parts()
    del arrays["layer1.W_hh"]
    with pytest.raises(ArtifactError, match=r"missing array\(s\): layer1\.W_hh"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_unexpected_array():
    arrays, meta = good_parts(layers=1)
    arrays["layer1.W_hh"] = np.zeros((4, 4), np.float32)
    with pytest.raises(ArtifactError, match="unexpected array"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_wrong_shape():
    arrays, meta = good_parts()
    arrays["layer0.W_xh"] = arrays["layer0.W_xh"][:-1]  # drops the feature row
    with pytest.raises(ArtifactError, match=r"'layer0\.W_xh' has shape"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_embedding_without_unknown_row():
    arrays, meta = good_parts()
    arrays["embedding"] = arrays["embedding"][:-1]
    with pytest.raises(ArtifactError, match="'embedding' has shape"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_integer_dtype():
    arrays, meta = good_parts()
    arrays["head.b_q"] = np.zeros(1, np.int32)
    with pytest.raises(ArtifactError, match=r"'head\.b_q' has dtype int32"):
        model_from_bytes(npz_bytes(arrays, meta))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_refuses_non_finite_values(bad):
    arrays, meta = good_parts()
    arrays["layer1.b_h"] = arrays["layer1.b_h"].copy()
    arrays["layer1.b_h"][2] = bad
    with pytest.raises(ArtifactError, match=r"'layer1\.b_h' contains NaN or infinite"):
        model_from_bytes(npz_bytes(arrays, meta))


class Boom:
    """Unpickling this would run code; loading must refuse before that."""

    def __reduce__(self):
        return (pytest.fail, ("the artifact loader unpickled an object array",))


def test_refuses_object_array_without_unpickling():
    arrays, meta = good_parts()
    arrays["embedding"] = np.array([Boom(), Boom()], dtype=object)
    with pytest.raises(ArtifactError, match=r"'embedding' holds Python objects \(pickle\)"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_unknown_format():
    arrays, meta = good_parts()
    meta["format"] = "intentstream.model/9"
    with pytest.raises(ArtifactError, match=r"unknown format 'intentstream\.model/9'"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_meta_that_is_not_json():
    arrays, _ = good_parts()
    arrays["meta"] = np.frombuffer(b"\xff{not json", np.uint8)
    with pytest.raises(ArtifactError, match="not UTF-8 JSON"):
        model_from_bytes(npz_bytes(arrays, None))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("cell", "transformer", "cell"),
        ("layers", 0, "layers"),
        ("head", "softmax", "head"),
        ("event_types", ["view", "view"], "distinct"),
        ("features", ["price"], "unknown features"),
        ("session_gap_seconds", -1, "session_gap_seconds"),
    ],
)
def test_refuses_invalid_meta_values(key, value, message):
    arrays, meta = good_parts()
    meta[key] = value
    with pytest.raises(ArtifactError, match=f"invalid meta:.*{message}"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_meta_missing_a_required_key():
    arrays, meta = good_parts()
    del meta["hidden"]
    with pytest.raises(ArtifactError, match="invalid meta: hidden: Field required"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_float64_values_beyond_float32_range():
    arrays, meta = good_parts()
    arrays["head.b_q"] = np.array([1e39])
    with pytest.raises(ArtifactError, match=r"'head\.b_q' has values beyond float32's range"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_gru_artifact_written_by_hand_loads_and_mixed_cells_are_refused():
    H, D, V = 3, 2, len(TYPES) + 1
    arrays = {"embedding": np.ones((V, D)), "head.W_hq": np.ones((H, 1)), "head.b_q": np.zeros(1)}
    for gate in "rzn":
        arrays[f"layer0.W_x{gate}"] = np.full((D, H), 0.1)
        arrays[f"layer0.W_h{gate}"] = np.eye(H)
    for bias in ("b_r", "b_z", "b_xn", "b_hn"):
        arrays[f"layer0.{bias}"] = np.zeros(H)
    meta = {"format": "intentstream.model/1", "cell": "gru", "layers": 1, "hidden": H,
            "event_types": TYPES, "head": "sigmoid", "session_gap_seconds": 0}  # fmt: skip
    model = model_from_bytes(npz_bytes(arrays, meta))
    assert (
        model.meta.cell == "gru"
        and model.parameter_count() == V * D + 3 * (D * H + H * H) + 4 * H + H + 1
    )
    with pytest.raises(ArtifactError, match=r"missing array\(s\): layer0\.W_xh"):
        model_from_bytes(npz_bytes(arrays, meta | {"cell": "rnn"}))
    no_bias = {k: v for k, v in arrays.items() if k != "layer0.b_hn"}
    with pytest.raises(ArtifactError, match=r"missing array\(s\): layer0\.b_hn"):
        model_from_bytes(npz_bytes(no_bias, meta))
    extra = arrays | {"layer0.W_xh": np.zeros((D, H))}
    with pytest.raises(ArtifactError, match=r"unexpected array\(s\) for a 1-layer gru model"):
        model_from_bytes(npz_bytes(extra, meta))
    wrong = arrays | {"layer0.W_hz": np.zeros((H, H + 1))}
    with pytest.raises(
        ArtifactError, match=r"'layer0\.W_hz' has shape \(3, 4\); expected \(3, 3\)"
    ):
        model_from_bytes(npz_bytes(wrong, meta))


def test_lstm_artifact_written_by_hand_loads_with_four_gates_and_wrong_shapes_are_refused():
    H, D, V = 3, 2, len(TYPES) + 1
    arrays = {"embedding": np.ones((V, D)), "head.W_hq": np.ones((H, 1)), "head.b_q": np.zeros(1)}
    for gate in "ifgo":
        arrays[f"layer0.W_x{gate}"] = np.full((D, H), 0.1)
        arrays[f"layer0.W_h{gate}"] = np.eye(H)
        arrays[f"layer0.b_{gate}"] = np.zeros(H)
    meta = {"format": "intentstream.model/1", "cell": "lstm", "layers": 1, "hidden": H,
            "event_types": TYPES, "head": "sigmoid", "session_gap_seconds": 0}  # fmt: skip
    model = model_from_bytes(npz_bytes(arrays, meta))
    assert model.meta.cell == "lstm"
    assert model.parameter_count() == V * D + 4 * (D * H + H * H + H) + H + 1
    assert state_shape(model.meta) == (1, 2 * H)  # h, then the cell state c
    no_gate = {k: v for k, v in arrays.items() if k != "layer0.W_hf"}
    with pytest.raises(ArtifactError, match=r"missing array\(s\): layer0\.W_hf"):
        model_from_bytes(npz_bytes(no_gate, meta))
    with pytest.raises(ArtifactError, match=r"unexpected array\(s\) for a 1-layer lstm model"):
        model_from_bytes(npz_bytes(arrays | {"layer0.b_hn": np.zeros(H)}, meta))
    wrong = arrays | {"layer0.b_o": np.zeros(H + 1)}
    with pytest.raises(ArtifactError, match=r"'layer0\.b_o' has shape \(4,\); expected \(3,\)"):
        model_from_bytes(npz_bytes(wrong, meta))


# ---- format 2: declared inputs ------------------------------------------------------------

INPUTS = [
    {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 3.0, "scale": 1.5},
    {"kind": "categorical", "name": "brand", "buckets": 11, "dim": 3},
    {"kind": "item", "name": "product", "buckets": 17, "dim": 4},
]
INPUT_WIDTH = 2 + 3 + (4 + 2)
LAYER0_INPUTS = {"rnn": ("W_xh",), "gru": ("W_xr", "W_xz", "W_xn"),
                 "lstm": ("W_xi", "W_xf", "W_xg", "W_xo")}  # fmt: skip


def format2_parts(cell: str = "gru") -> tuple[dict[str, np.ndarray], dict]:
    model = random_model(TYPES, hidden=4, layers=2, features=["gap"], embedding_dim=3,
                         cell=cell, inputs=INPUTS, seed=3)  # fmt: skip
    return dict(model.arrays), json.loads(json.dumps(model.meta.to_json()))


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_format2_round_trip_widens_layer0_and_keeps_tables(tmp_path: Path, cell: str):
    model = random_model(TYPES, hidden=4, layers=2, features=["gap"], embedding_dim=3,
                         cell=cell, inputs=INPUTS, seed=3)  # fmt: skip
    path = tmp_path / "m.npz"
    save_model(model, path)
    loaded = load_model(path)
    assert loaded.meta == model.meta
    assert loaded.meta.format == "intentstream.model/2"
    assert [s.name for s in loaded.inputs] == ["price", "brand", "product"]
    for name, a in model.arrays.items():
        np.testing.assert_array_equal(loaded.arrays[name], a)
    for w in LAYER0_INPUTS[cell]:
        assert loaded.arrays[f"layer0.{w}"].shape == (3 + 1 + INPUT_WIDTH, 4)
        assert loaded.arrays[f"layer1.{w}"].shape == (4, 4)
    assert loaded.arrays["input.brand.embedding"].shape == (11, 3)
    assert loaded.arrays["input.product.embedding"].shape == (17, 4)
    assert set(loaded.tables()) == {"input.brand.embedding", "input.product.embedding"}
    with np.load(path, allow_pickle=False) as raw:
        doc = json.loads(raw["meta"].tobytes())
    assert doc["format"] == "intentstream.model/2" and doc["inputs"] == INPUTS


def test_format1_meta_stays_as_it_was():
    model = random_model(TYPES, hidden=4, seed=0)
    assert model.meta.format == "intentstream.model/1"
    assert "inputs" not in json.loads(model_to_bytes_meta(model))
    assert "inputs" not in model.meta.model_dump()  # nor in the registry's meta
    assert len(model.inputs) == 0 and model.tables() == {}


def model_to_bytes_meta(model) -> bytes:
    with np.load(io.BytesIO(model_to_bytes(model)), allow_pickle=False) as raw:
        return raw["meta"].tobytes()


def test_format2_without_inputs_loads_as_having_none():
    arrays, meta = good_parts()
    meta["format"] = "intentstream.model/2"
    meta.pop("inputs", None)
    assert len(model_from_bytes(npz_bytes(arrays, meta)).inputs) == 0


def test_refuses_format1_with_inputs():
    arrays, meta = format2_parts()
    meta["format"] = "intentstream.model/1"
    with pytest.raises(ArtifactError, match=r"has no inputs; declaring them needs 'intentstream"):
        model_from_bytes(npz_bytes(arrays, meta))


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
def test_refuses_layer0_not_widened_by_the_inputs(cell: str):
    arrays, meta = format2_parts(cell)
    w = f"layer0.{LAYER0_INPUTS[cell][-1]}"
    arrays[w] = arrays[w][:-1]
    with pytest.raises(ArtifactError, match=rf"'{w}' has shape \(14, 4\); expected \(15, 4\)"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_a_table_of_the_wrong_shape():
    arrays, meta = format2_parts()
    arrays["input.brand.embedding"] = np.zeros((10, 3), np.float32)
    with pytest.raises(ArtifactError, match=r"'input\.brand\.embedding' has shape \(10, 3\); "
                                            r"expected \(11, 3\)"):  # fmt: skip
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_a_missing_table():
    arrays, meta = format2_parts()
    del arrays["input.product.embedding"]
    with pytest.raises(ArtifactError, match=r"missing array\(s\): input\.product\.embedding"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_a_table_for_an_input_not_declared():
    arrays, meta = format2_parts()
    arrays["input.colour.embedding"] = np.zeros((5, 2), np.float32)
    problem = r"table of input 'colour', which meta\.inputs does not declare \(declared: \['price'"
    with pytest.raises(ArtifactError, match=problem):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_a_table_for_a_numeric_input():
    arrays, meta = format2_parts()
    arrays["input.price.embedding"] = np.zeros((5, 2), np.float32)
    with pytest.raises(ArtifactError, match=r"input 'price' is numeric and has no table"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_a_non_finite_table():
    arrays, meta = format2_parts()
    arrays["input.brand.embedding"] = arrays["input.brand.embedding"].copy()
    arrays["input.brand.embedding"][2, 1] = np.nan
    with pytest.raises(ArtifactError, match=r"'input\.brand\.embedding' contains NaN"):
        model_from_bytes(npz_bytes(arrays, meta))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda i: i[1].update(buckets=1), r"inputs\.1\.categorical\.buckets"),
        (lambda i: i[0].update(name="ts"), r"event fields"),
        (lambda i: i[2].update(name="brand"), r"repeated: \['brand'\]"),
        (lambda i: i[0].update(kind="vector"), r"inputs\.0"),
    ],
)
def test_refuses_invalid_inputs_naming_the_problem(change, problem):
    arrays, meta = format2_parts()
    change(meta["inputs"])
    with pytest.raises(ArtifactError, match=r"invalid meta: inputs: .*" + problem):
        model_from_bytes(npz_bytes(arrays, meta))


def wide_parts() -> tuple[dict[str, np.ndarray], dict]:
    inputs = [
        {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 1.0, "scale": 2.0},
        {"kind": "item", "name": "product", "buckets": 5, "dim": 3},
    ]
    model = random_model(TYPES, hidden=4, features=["gap"], seed=2, inputs=inputs,
                         wide_head=True)  # fmt: skip
    return dict(model.arrays), model.meta.model_dump()


def test_a_wide_head_round_trips_and_reads_only_numeric_columns(tmp_path: Path):
    arrays, meta = wide_parts()
    # gap, price (value, missing), product (3 embedding columns, 2 flags)
    assert arrays["head.W_fq"].shape == (1 + 2 + 3 + 2, 1)
    assert not arrays["head.W_fq"][3:6].any() and arrays["head.W_fq"][[0, 1, 2, 6, 7]].all()
    model = model_from_bytes(npz_bytes(arrays, meta))
    assert model.meta.wide_head
    path = tmp_path / "w.npz"
    save_model(model, path)
    np.testing.assert_array_equal(load_model(path).arrays["head.W_fq"], arrays["head.W_fq"])


def test_a_model_without_a_wide_head_keeps_its_meta_as_before():
    _, meta = good_parts()
    assert "wide_head" not in meta  # a format 1 or 2 meta dumps as it always has


def test_refuses_a_wide_head_on_an_embedding_column():
    arrays, meta = wide_parts()
    arrays["head.W_fq"][4, 0] = 0.5  # the product's embedding column
    with pytest.raises(ArtifactError, match="rows of embedding-table columns must be 0"):
        model_from_bytes(npz_bytes(arrays, meta))


def test_refuses_a_wide_head_array_the_meta_does_not_declare():
    arrays, meta = wide_parts()
    with pytest.raises(ArtifactError, match=r"unexpected array.*head\.W_fq"):
        model_from_bytes(npz_bytes(arrays, meta | {"wide_head": False}))
    del arrays["head.W_fq"]
    with pytest.raises(ArtifactError, match=r"missing array\(s\): head\.W_fq"):
        model_from_bytes(npz_bytes(arrays, meta))
