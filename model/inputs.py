"""Declared model inputs beyond the event type and the gap: numeric, categorical and
item fields, their declarations checked, and the columns each adds to x.

Plain pydantic, no kernels. The artifact (format 2, model/artifact.py) holds the
declarations and tables; model/input_encoding.py turns a batch's values into x's extra block,
which scoring (model/scoring.py) appends to the features and training
(model/training/sessions.py) keeps as fixed columns and buckets, so the forward pass looks
the rows up in the tables it fits (model/training/bptt.py).

The contract, x_t's layout with inputs, the hash and its buckets, is docs/contract.md (The
model, Declared inputs); the details of each kind follow.

Numeric
-------
A `numeric` input (a price) is parsed as a float (Python's float syntax, as numpy reads
bytes), transformed (`log1p` or `none`), then standardised, (v - mean) / scale, with the
training set's mean and scale stored in the declaration. An absent, null or empty value is
*missing*; one that does not parse, or is not finite after the transform (log1p of a value
<= -1, an overflow), is *bad*. Both give value 0 and missing flag 1, and are counted (bad ones
separately). The missing flag's row of the input weights is the learned default: a missing
value contributes exactly that row to layer 0's input, as a present value of the mean would
contribute nothing. No separate default parameter is needed. With `session`, three more
columns follow: the running mean, minimum and maximum of the session's standardised values
so far, this one included (model/session_stats.py; 0 while the session has none), kept per
user in the state.

Categorical
-----------
A `categorical` input (category, brand) has `buckets` buckets and an embedding table
`input.{name}.embedding` of shape (buckets, dim); x gets the row of the value's bucket (row 0
for a missing value). Different values may share a bucket (a hash collision): choose buckets
well above the number of distinct values that matter.

Item
----
An `item` input (a product id) is hashed and embedded like a categorical, plus two flags kept
from the user's state: `same_as_previous` (1 when the session's most recent event that had an
item had this item) and `seen_in_session` (1 when the item is among the session's remembered
items, the most recent included). Each user remembers the last K = 16 distinct items of the
current session (most recent last; a repeat moves to the end, the oldest is dropped when
full), by their full 32-bit hash, so the memory does not depend on the model's bucket count
and two items collide with probability 2^-32, not 1/buckets. The memory restarts empty when a
session starts (the model's session rule, model/features.py `session_resets`; a user without
state starts empty). An event without the item has both flags 0, is not remembered and
leaves the memory as it was. Packed in the user's state, the memory is one byte of count and
count little-endian uint32 hashes: at most 1 + 16 * 4 = 65 bytes per user and item input.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    ValidationError,
    field_validator,
    model_serializer,
)

# A numeric input's session statistics (model/session_stats.py): its columns after the value
# and missing flag, and the floats each user keeps for them in the state.
STATS_COLUMNS = ("session_mean", "session_min", "session_max")
STATS_FLOATS = 4  # count, sum, min, max

# Event fields the worker reads itself: an input may not take their names.
RESERVED_NAMES = ("user_id", "type", "ts", "event_id", "json", "producer")

MISSING_BUCKET = 0  # every table's row for an absent, null or empty value


_STRICT = ConfigDict(frozen=True, extra="forbid")
_Name = Annotated[str, Field(min_length=1, max_length=64)]


class NumericInput(BaseModel):
    """A number (price): transformed, standardised with the training set's mean and scale,
    and a missing flag; with `session`, also the session's running mean, min and max."""

    model_config = _STRICT

    kind: Literal["numeric"] = "numeric"
    name: _Name
    transform: Literal["log1p", "none"]
    mean: float = Field(allow_inf_nan=False)
    scale: float = Field(gt=0, allow_inf_nan=False)
    session: bool = False

    @model_serializer(mode="wrap")
    def _without_default_session(self, handler) -> dict:
        # an input without session statistics dumps (artifact, registry) as it always has
        doc = handler(self)
        if not doc.get("session"):
            doc.pop("session", None)
        return doc


class CategoricalInput(BaseModel):
    """A category (category code, brand): hashed into buckets, an embedding row per bucket."""

    model_config = _STRICT

    kind: Literal["categorical"] = "categorical"
    name: _Name
    buckets: int = Field(ge=2, le=2**20)
    dim: int = Field(ge=1, le=64)


class ItemInput(BaseModel):
    """An item (product id): embedded as a categorical, plus the session's
    same-as-previous and seen-in-session flags."""

    model_config = _STRICT

    kind: Literal["item"] = "item"
    name: _Name
    buckets: int = Field(ge=2, le=2**20)
    dim: int = Field(ge=1, le=64)


InputSpec = Annotated[NumericInput | CategoricalInput | ItemInput, Field(discriminator="kind")]


class Inputs(RootModel[list[InputSpec]]):
    """A model's declared inputs, in the order their columns follow the features in x."""

    model_config = ConfigDict(frozen=True)

    root: list[InputSpec] = Field(default_factory=list)

    @field_validator("root")
    @classmethod
    def _names(cls, specs: list[InputSpec]) -> list[InputSpec]:
        names = [s.name for s in specs]
        reserved = [n for n in names if n in RESERVED_NAMES]
        if reserved:
            raise ValueError(f"input names {reserved} are event fields; reserved: {RESERVED_NAMES}")
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"input names must be distinct; repeated: {repeated}")
        return specs

    def __iter__(self):  # type: ignore[override]
        return iter(self.root)

    def __len__(self) -> int:
        return len(self.root)

    def __getitem__(self, i: int) -> InputSpec:
        return self.root[i]


def parse_inputs(doc: object) -> Inputs:
    """Inputs from a JSON-like list (meta.inputs, an inputs file); a problem raises ValueError
    with one line naming where (e.g. `inputs.1.buckets: Input should be ...`)."""
    try:
        return Inputs.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, ['inputs', *e['loc']]))}: {e['msg']}" for e in exc.errors()
        )
        raise ValueError(f"invalid inputs: {problems}") from None


def specs_of(inputs: Inputs | Sequence[InputSpec]) -> list[InputSpec]:
    """The declarations as a list."""
    return list(inputs.root) if isinstance(inputs, Inputs) else list(inputs)


def spec_width(spec: InputSpec) -> int:
    """The number of columns one input adds to x."""
    if spec.kind == "numeric":
        return 2 + len(STATS_COLUMNS) * spec.session
    if spec.kind == "categorical":
        return spec.dim
    return spec.dim + 2


def input_width(inputs: Inputs | Sequence[InputSpec]) -> int:
    """The width of x's extra block: numeric 2 (5 with `session`), categorical dim, item
    dim + 2."""
    return sum(spec_width(s) for s in specs_of(inputs))


def input_columns(inputs: Inputs | Sequence[InputSpec]) -> list[str]:
    """A name per column of x's extra block, in order (for reports and explanations)."""
    out: list[str] = []
    for s in specs_of(inputs):
        if s.kind == "numeric":
            out += [f"{s.name}.value", f"{s.name}.missing"]
            out += [f"{s.name}.{c}" for c in STATS_COLUMNS] if s.session else []
        else:
            out += [f"{s.name}.embedding[{j}]" for j in range(s.dim)]
            if s.kind == "item":
                out += [f"{s.name}.same_as_previous", f"{s.name}.seen_in_session"]
    return out


def table_name(spec: CategoricalInput | ItemInput) -> str:
    """The artifact name of an input's embedding table."""
    return f"input.{spec.name}.embedding"


def table_shapes(inputs: Inputs | Sequence[InputSpec]) -> dict[str, tuple[int, int]]:
    """Artifact name -> (buckets, dim) of every embedding table the inputs need."""
    return {table_name(s): (s.buckets, s.dim) for s in specs_of(inputs) if s.kind != "numeric"}


def table_columns(inputs: Inputs | Sequence[InputSpec]) -> list[tuple[int, int]]:
    """(first column in the extra block, dim) of each categorical and item input's
    embedding rows, in declaration order (the columns of input_parts's buckets)."""
    out, col = [], 0
    for spec in specs_of(inputs):
        if spec.kind != "numeric":
            out.append((col, spec.dim))
        col += spec_width(spec)
    return out


def session_inputs(inputs: Inputs | Sequence[InputSpec]) -> list[str]:
    """The numeric inputs with session statistics, in declaration order (their four floats
    each follow the session memory in a user's state, model/artifact.py)."""
    return [s.name for s in specs_of(inputs) if s.kind == "numeric" and s.session]


def session_stat_columns(inputs: Inputs | Sequence[InputSpec]) -> list[int]:
    """The columns of x's extra block that hold session statistics (three after each value
    and missing flag of a numeric input with `session`)."""
    out, col = [], 0
    for spec in specs_of(inputs):
        if spec.kind == "numeric" and spec.session:
            out += [col + 2 + j for j in range(len(STATS_COLUMNS))]
        col += spec_width(spec)
    return out


def without_session_stats(inputs: Inputs) -> Inputs:
    """The same declarations without session statistics."""
    return Inputs([s.model_copy(update={"session": False}) if s.kind == "numeric" else s
                   for s in inputs])  # fmt: skip
