"""The model artifact (docs/contract.md, Model artifacts and the registry): one `.npz` file
of named arrays plus UTF-8 JSON meta.

Loading validates everything and never unpickles: every array is read with
`allow_pickle=False`, and any problem raises `ArtifactError` naming what is wrong.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from model.calibration import calibration_of
from model.feature_names import feature_help, is_stateful, memory_width, unknown_features
from model.inputs import (
    STATS_FLOATS,
    Inputs,
    input_width,
    parse_inputs,
    session_inputs,
    session_stat_columns,
    table_columns,
    table_shapes,
)

FORMAT = "intentstream.model/1"  # event type and features only
FORMAT_2 = "intentstream.model/2"  # and declared inputs (meta.inputs, model/inputs.py)
FORMATS = (FORMAT, FORMAT_2)
WIDE_HEAD = "head.W_fq"  # the wide part's weights (meta.wide_head)
_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class ArtifactError(ValueError):
    """A model file or blob that cannot be used, with the reason."""


class ModelMeta(BaseModel):
    """Required meta of an artifact; extra keys (version, metrics, ...) are kept as given."""

    model_config = ConfigDict(extra="allow", frozen=True)

    format: Literal["intentstream.model/1", "intentstream.model/2"]
    cell: Literal["rnn", "gru", "lstm"]
    layers: int = Field(ge=1, le=16)
    hidden: int = Field(ge=1, le=4096)
    event_types: list[str] = Field(min_length=1)
    features: list[str] = Field(default_factory=list)
    head: Literal["sigmoid", "identity"]
    session_gap_seconds: float = Field(ge=0)
    # format 2 only: the declared inputs, in the order their columns follow the features
    inputs: Inputs | None = None
    # a wide part beside the deep one: the head also reads layer 0's feature and input
    # columns (array head.W_fq); an older worker refuses the array, as it should
    wide_head: bool = False

    @field_validator("inputs", mode="before")
    @classmethod
    def _parse_inputs(cls, doc: object) -> object:
        if doc is None or isinstance(doc, Inputs):
            return doc
        return parse_inputs(doc)

    @model_validator(mode="after")
    def _inputs_need_format_2(self) -> ModelMeta:
        if self.format == FORMAT and self.inputs is not None:
            raise ValueError(f"format {FORMAT!r} has no inputs; declaring them needs {FORMAT_2!r}")
        return self

    @property
    def declared_inputs(self) -> Inputs:
        """The declared inputs (none for a format 1 model)."""
        return self.inputs if self.inputs is not None else Inputs([])

    @model_serializer(mode="wrap")
    def _without_absent_inputs(self, handler) -> dict:
        # a format 1 meta dumps (into the artifact, the registry) as it always has
        doc = handler(self)
        if doc.get("inputs") is None:
            doc.pop("inputs", None)
        if not doc.get("wide_head"):
            doc.pop("wide_head", None)
        return doc

    def to_json(self) -> dict:
        """The meta as the artifact stores it (a format 1 meta has no `inputs` key)."""
        return self.model_dump()

    @field_validator("event_types")
    @classmethod
    def _distinct_names(cls, names: list[str]) -> list[str]:
        if any(not n for n in names):
            raise ValueError("event type names must be non-empty")
        if len(set(names)) != len(names):
            raise ValueError("event type names must be distinct")
        return names

    @field_validator("features")
    @classmethod
    def _known_features(cls, names: list[str]) -> list[str]:
        unknown = unknown_features(names, event_types=None)
        if unknown:
            raise ValueError(f"unknown features {unknown}; known: {feature_help()}")
        if len(set(names)) != len(names):
            raise ValueError("feature names must be distinct")
        return names

    @model_validator(mode="after")
    def _typed_features_of_known_types(self) -> ModelMeta:
        unknown = unknown_features(self.features, self.event_types)
        if unknown:
            raise ValueError(f"unknown features {unknown}: TYPE must be one of the event types")
        return self


@dataclass(frozen=True)
class Model:
    """A validated model: meta plus its arrays by artifact name."""

    meta: ModelMeta
    arrays: dict[str, np.ndarray]

    @property
    def embedding_dim(self) -> int:
        return int(self.arrays["embedding"].shape[1])

    @property
    def inputs(self) -> Inputs:
        """The declared inputs (model/inputs.py); empty for a format 1 model."""
        return self.meta.declared_inputs

    def tables(self) -> dict[str, np.ndarray]:
        """The embedding table of each categorical and item input, by artifact name."""
        return {name: self.arrays[name] for name in table_shapes(self.inputs)}

    @property
    def version(self) -> str:
        """The version recorded in meta, or "file" for an unregistered artifact."""
        return str((self.meta.model_extra or {}).get("version", "file"))

    def parameter_count(self) -> int:
        return int(sum(a.size for a in self.arrays.values()))


# Per-layer arrays of each cell, by kind: input weights (input x H), recurrent weights (H x H),
# biases (H). Gates are listed in PyTorch's order (GRU: r, z, n; LSTM: i, f, g, o), which the
# packed layout of model/params.py keeps.
CELL_ARRAYS: dict[str, dict[str, tuple[str, ...]]] = {
    "rnn": {"input": ("W_xh",), "recurrent": ("W_hh",), "bias": ("b_h",)},
    "gru": {
        "input": ("W_xr", "W_xz", "W_xn"),
        "recurrent": ("W_hr", "W_hz", "W_hn"),
        "bias": ("b_r", "b_z", "b_xn", "b_hn"),
    },
    "lstm": {
        "input": ("W_xi", "W_xf", "W_xg", "W_xo"),
        "recurrent": ("W_hi", "W_hf", "W_hg", "W_ho"),
        "bias": ("b_i", "b_f", "b_g", "b_o"),
    },
}

# Floats per layer of a user's state, in units of H: an LSTM keeps h then c (2H), the others h.
STATE_WIDTH = {"rnn": 1, "gru": 1, "lstm": 2}


def state_shape(meta: ModelMeta) -> tuple[int, int]:
    """The shape of one user's state: (layers, hidden), (layers, 2 * hidden) for an LSTM
    (each layer's h, then its cell state c), and below them as many rows as the session
    memory needs (memory_floats)."""
    width = STATE_WIDTH[meta.cell] * meta.hidden
    return (meta.layers + memory_rows(meta), width)


def memory_floats(meta: ModelMeta) -> tuple[int, int]:
    """The session memory's floats in a user's state: (those of the session features,
    model/features.py, 0 without them; those of the numeric inputs' session statistics,
    model/session_stats.py, after them)."""
    features = memory_width(meta.event_types) if is_stateful(meta.features) else 0
    return features, STATS_FLOATS * len(session_inputs(meta.declared_inputs))


def memory_rows(meta: ModelMeta) -> int:
    """State rows that hold the session memory (0 without session features or statistics)."""
    width = STATE_WIDTH[meta.cell] * meta.hidden
    return -(-sum(memory_floats(meta)) // width)


def layer_array_names(cell: str, layer: int) -> list[str]:
    """Names of one layer's arrays for a cell, e.g. layer0.W_xh."""
    kinds = CELL_ARRAYS[cell]
    return [f"layer{layer}.{n}" for kind in ("input", "recurrent", "bias") for n in kinds[kind]]


def array_names(layers: int, cell: str = "rnn") -> list[str]:
    """Names of the parameter arrays of an artifact with `layers` layers (meta excluded)."""
    names = ["embedding"]
    for layer in range(layers):
        names += layer_array_names(cell, layer)
    return [*names, "head.W_hq", "head.b_q"]


def cell_of(arrays: dict[str, np.ndarray]) -> str:
    """The cell whose arrays these are ("gru" or "lstm" when layer 0 has that cell's arrays,
    else "rnn")."""
    if "layer0.W_xr" in arrays:
        return "gru"
    return "lstm" if "layer0.W_xi" in arrays else "rnn"


def expected_shapes(meta: ModelMeta, embedding_dim: int) -> dict[str, tuple[int, ...]]:
    """Shape each array must have for this meta and embedding width: layer 0's input weights
    have D rows for the embedding, F for the features, then `input_width` for the declared
    inputs; each categorical and item input has its table `input.{name}.embedding`."""
    H, F = meta.hidden, len(meta.features)
    X = input_width(meta.declared_inputs)
    shapes: dict[str, tuple[int, ...]] = {"embedding": (len(meta.event_types) + 1, embedding_dim)}
    kinds = CELL_ARRAYS[meta.cell]
    for layer in range(meta.layers):
        inputs = embedding_dim + F + X if layer == 0 else H
        for name in kinds["input"]:
            shapes[f"layer{layer}.{name}"] = (inputs, H)
        for name in kinds["recurrent"]:
            shapes[f"layer{layer}.{name}"] = (H, H)
        for name in kinds["bias"]:
            shapes[f"layer{layer}.{name}"] = (H,)
    shapes["head.W_hq"] = (H, 1)
    shapes["head.b_q"] = (1,)
    if meta.wide_head:
        shapes[WIDE_HEAD] = (F + X, 1)
    return shapes | table_shapes(meta.declared_inputs)


def table_rows(meta: ModelMeta) -> np.ndarray:
    """The rows of head.W_fq (features, then the inputs' block) that are embedding-table
    columns: the wide part reads only the numeric columns (features, values, flags)."""
    at = len(meta.features)  # the inputs' block starts after the features
    columns = table_columns(meta.declared_inputs)
    return np.array([at + c for col, dim in columns for c in range(col, col + dim)], np.int64)


def _undeclared_tables(meta: ModelMeta, names: list[str]) -> None:
    """Refuse an input table (`input.{name}.embedding`) the meta does not call for."""
    kinds = {s.name: s.kind for s in meta.declared_inputs}
    for name in names:
        if not (name.startswith("input.") and name.endswith(".embedding")):
            continue
        which = name[len("input.") : -len(".embedding")]
        if which not in kinds:
            declared = list(kinds) or "none"
            raise ArtifactError(
                f"array '{name}' is the table of input {which!r}, which meta.inputs does not "
                f"declare (declared: {declared})"
            )
        raise ArtifactError(f"array '{name}': input {which!r} is numeric and has no table")


def validate_model(meta: ModelMeta, arrays: dict[str, np.ndarray]) -> Model:
    """Check names, shapes, dtypes and finiteness of the arrays against meta; return the Model."""
    expected = [*array_names(meta.layers, meta.cell), *table_shapes(meta.declared_inputs)]
    expected += [WIDE_HEAD] if meta.wide_head else []
    missing = [n for n in expected if n not in arrays]
    if missing:
        raise ArtifactError(f"missing array(s): {', '.join(missing)}")
    extra = sorted(set(arrays) - set(expected))
    _undeclared_tables(meta, extra)
    if extra:
        raise ArtifactError(
            f"unexpected array(s) for a {meta.layers}-layer {meta.cell} model: {extra}"
        )
    embedding = arrays["embedding"]
    if embedding.ndim != 2 or embedding.shape[1] < 1:
        raise ArtifactError(f"array 'embedding' must be 2-D (V, D), got shape {embedding.shape}")
    for name, shape in expected_shapes(meta, embedding.shape[1]).items():
        a = arrays[name]
        if a.dtype not in _FLOAT_DTYPES:
            raise ArtifactError(f"array '{name}' has dtype {a.dtype}; expected float32 or float64")
        if a.shape != shape:
            raise ArtifactError(f"array '{name}' has shape {a.shape}; expected {shape}")
        if not np.all(np.isfinite(a)):
            raise ArtifactError(f"array '{name}' contains NaN or infinite values")
        if a.dtype == np.float64 and np.any(np.abs(a) > np.finfo(np.float32).max):
            raise ArtifactError(f"array '{name}' has values beyond float32's range")
    if meta.wide_head and np.any(arrays[WIDE_HEAD][table_rows(meta)] != 0):
        raise ArtifactError(f"array '{WIDE_HEAD}': the rows of embedding-table columns must be 0")
    _check_calibration(meta)
    return Model(meta=meta, arrays={n: np.array(arrays[n]) for n in expected})


def _check_calibration(meta: ModelMeta) -> None:
    """A recorded calibration must be a valid map, on a sigmoid head (model/calibration.py)."""
    extra = meta.model_extra or {}
    if "calibration" not in extra:
        return
    try:
        calibration_of(extra)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(x) for x in problem["loc"]) or "calibration"
        raise ArtifactError(f"meta 'calibration' is invalid: {where}: {problem['msg']}") from None
    if meta.head != "sigmoid":
        raise ArtifactError("meta 'calibration' needs a sigmoid head (it maps the head's logit)")


def _meta_from_array(raw: np.ndarray) -> ModelMeta:
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ArtifactError(f"array 'meta' must be 1-D uint8 (UTF-8 JSON), got {raw.dtype}")
    try:
        doc = json.loads(raw.tobytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"array 'meta' is not UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ArtifactError("array 'meta' must hold a JSON object")
    if doc.get("format") not in FORMATS:
        raise ArtifactError(
            f"unknown format {doc.get('format')!r}; expected one of {list(FORMATS)}"
        )
    try:
        return ModelMeta.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'meta'}: {e['msg']}" for e in exc.errors()
        )
        raise ArtifactError(f"invalid meta: {problems}") from None


def model_from_bytes(data: bytes) -> Model:
    """Parse and validate an artifact held in memory (a file's or a registry entry's bytes)."""
    if not data.startswith((b"PK\x03\x04", b"PK\x05\x06", b"\x93NUMPY")):
        # np.load takes anything else for a pickle, and its refusal advises loading it
        # unsafely: never the advice to give about a file of unknown origin
        raise ArtifactError("not a valid .npz archive (it does not begin as a zip file does)")
    try:
        archive = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise ArtifactError(
            f"not a valid .npz archive (truncated or another format): {exc}"
        ) from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ArtifactError("not a .npz archive (a bare .npy array)")
    arrays: dict[str, np.ndarray] = {}
    with archive:
        for name in archive.files:
            try:
                arrays[name] = archive[name]
            except ValueError as exc:
                if "allow_pickle" in str(exc):
                    raise ArtifactError(
                        f"array '{name}' holds Python objects (pickle); refusing to load it"
                    ) from None
                raise ArtifactError(f"array '{name}' cannot be read: {exc}") from None
            except (OSError, EOFError, zipfile.BadZipFile) as exc:
                raise ArtifactError(f"array '{name}' is damaged or truncated: {exc}") from None
    if "meta" not in arrays:
        raise ArtifactError("missing array: meta")
    meta = _meta_from_array(arrays.pop("meta"))
    return validate_model(meta, arrays)


def load_model(path: str | Path) -> Model:
    """Load and validate an artifact file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ArtifactError(f"cannot read model file {path}: {exc.strerror}") from None
    try:
        return model_from_bytes(data)
    except ArtifactError as exc:
        raise ArtifactError(f"{path}: {exc}") from None


def model_to_bytes(model: Model) -> bytes:
    """Serialise a model to artifact bytes (an uncompressed .npz)."""
    meta_json = json.dumps(model.meta.to_json(), sort_keys=True).encode("utf-8")
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(meta_json, np.uint8), **model.arrays)
    return buf.getvalue()


def save_model(model: Model, path: str | Path) -> str:
    """Write the artifact atomically (temp file + rename); return its sha256."""
    data = model_to_bytes(model)
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return sha256_hex(data)


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of artifact bytes."""
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of an artifact file."""
    return sha256_hex(Path(path).read_bytes())


def file_version(model: Model, path: str | Path) -> str:
    """The version a model loaded from an artifact file goes by: the one its meta records,
    else `file-` and the first 12 hex digits of the file's sha256."""
    return model.version if model.version != "file" else f"file-{file_sha256(path)[:12]}"


def state_space_of(meta: Mapping[str, object], version: str) -> str:
    """The state space of a model, from its meta fields (an artifact's `meta.model_extra`
    or a registry version's meta) and its version: which users' hidden states it reads and
    writes. A model continues the states of the models of its space; any other state is
    rebuilt. It is the declared `state_space` (a model fine-tuned from another's weights
    continues that model's space, see model/training/train.py), else the model's own version."""
    declared = meta.get("state_space")
    return str(declared) if declared else version


DEFAULT_LABEL_TYPE = "purchase"  # TrainConfig's default


def label_type_of(model: Model, default: str = DEFAULT_LABEL_TYPE) -> str:
    """The event type the model was trained to predict (its meta's `label_type`), else
    `default`."""
    return str((model.meta.model_extra or {}).get("label_type") or default)


def statistics_rows(meta: ModelMeta) -> np.ndarray:
    """The rows of head.W_fq (features, then the inputs' block) that read session statistics
    (model/session_stats.py); layer 0's input weights hold them after the embedding's D."""
    at = len(meta.features)
    return np.array([at + c for c in session_stat_columns(meta.declared_inputs)], np.int64)
