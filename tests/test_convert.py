"""PyTorch nn.GRU / nn.LSTM / nn.RNN weights convert exactly (when torch is installed; the
conversion itself is plain numpy and runs without it)."""

from __future__ import annotations

import numpy as np
import pytest

from model.artifact import FORMAT, ModelMeta, state_shape, validate_model
from model.data.torch_weights import arrays_from_torch
from model.reference import reference_step
from model.scoring import InMemoryScorer, ScoringModel

TYPES = ["view", "search", "add_to_cart", "coupon", "checkout"]


def test_gru_state_dict_of_plain_arrays_converts_gate_by_gate():
    H, n_in = 2, 3
    w_ih = np.arange(3 * H * n_in, dtype=np.float64).reshape(3 * H, n_in)
    w_hh = 100 + np.arange(3 * H * H, dtype=np.float64).reshape(3 * H, H)
    b_ih, b_hh = np.arange(6.0), 10 * np.arange(6.0)
    state = {
        "embedding.weight": np.zeros((4, n_in)), "rnn.weight_ih_l0": w_ih,
        "rnn.weight_hh_l0": w_hh, "rnn.bias_ih_l0": b_ih, "rnn.bias_hh_l0": b_hh,
        "head.weight": np.ones((1, H)), "head.bias": np.zeros(1),
    }  # fmt: skip
    a = arrays_from_torch(state, "gru", layers=1)
    np.testing.assert_array_equal(a["layer0.W_xz"], w_ih[H : 2 * H].T)  # z is PyTorch's 2nd
    np.testing.assert_array_equal(a["layer0.W_hn"], w_hh[2 * H :].T)
    np.testing.assert_array_equal(a["layer0.b_r"], b_ih[:H] + b_hh[:H])
    np.testing.assert_array_equal(a["layer0.b_xn"], b_ih[2 * H :])
    np.testing.assert_array_equal(a["layer0.b_hn"], b_hh[2 * H :])  # kept apart: inside r ⊙
    with pytest.raises(KeyError, match=r"rnn\.weight_ih_l1"):
        arrays_from_torch(state, "gru", layers=2)


def test_lstm_state_dict_of_plain_arrays_converts_gate_by_gate():
    H, n_in = 2, 3
    w_ih = np.arange(4 * H * n_in, dtype=np.float64).reshape(4 * H, n_in)
    w_hh = 100 + np.arange(4 * H * H, dtype=np.float64).reshape(4 * H, H)
    b_ih, b_hh = np.arange(8.0), 10 * np.arange(8.0)
    state = {
        "embedding.weight": np.zeros((4, n_in)), "rnn.weight_ih_l0": w_ih,
        "rnn.weight_hh_l0": w_hh, "rnn.bias_ih_l0": b_ih, "rnn.bias_hh_l0": b_hh,
        "head.weight": np.ones((1, H)), "head.bias": np.zeros(1),
    }  # fmt: skip
    a = arrays_from_torch(state, "lstm", layers=1)
    for k, gate in enumerate("ifgo"):  # PyTorch's order of the row blocks
        rows = slice(k * H, (k + 1) * H)
        np.testing.assert_array_equal(a[f"layer0.W_x{gate}"], w_ih[rows].T)
        np.testing.assert_array_equal(a[f"layer0.W_h{gate}"], w_hh[rows].T)
        np.testing.assert_array_equal(a[f"layer0.b_{gate}"], b_ih[rows] + b_hh[rows])
    assert len([k for k in a if k.startswith("layer0.")]) == 12
    projected = state | {"rnn.weight_hr_l0": np.zeros((1, H))}
    with pytest.raises(ValueError, match="proj_size"):
        arrays_from_torch(projected, "lstm", layers=1)


TORCH_CELLS = {"gru": "GRU", "rnn": "RNN", "lstm": "LSTM"}


@pytest.mark.parametrize("cell", TORCH_CELLS)
def test_a_trained_pytorch_model_scores_the_same_in_every_path(cell):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    F, H, D, L = 1, 12, 6, 2
    rnn_cls = getattr(torch.nn, TORCH_CELLS[cell])

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(len(TYPES) + 1, D)
            self.rnn = rnn_cls(D + F, H, num_layers=L, batch_first=True)
            self.head = torch.nn.Linear(H, 1)

        def forward(self, types, feats):
            out, _ = self.rnn(torch.cat([self.embedding(types), feats], dim=2))
            return torch.sigmoid(self.head(out))[..., 0]

    net = Net()
    # a few steps of real training, so the weights are not just the initialisation
    rng = np.random.default_rng(0)
    types = torch.from_numpy(rng.integers(0, len(TYPES) + 1, (16, 30)))
    feats = torch.from_numpy(rng.uniform(0, 4, (16, 30, F)).astype(np.float32))
    y = torch.from_numpy((rng.random((16, 1)) < 0.5).astype(np.float32)).expand(16, 30)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(20):
        opt.zero_grad()
        torch.nn.functional.binary_cross_entropy(net(types, feats), y).backward()
        opt.step()
    state = {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}
    meta = ModelMeta(format=FORMAT, cell=cell, layers=L, hidden=H, event_types=TYPES,
                     features=["gap"], head="sigmoid", session_gap_seconds=0)  # fmt: skip
    model = validate_model(meta, arrays_from_torch(state, cell, layers=L))

    # one user's session: the gap feature is log1p(seconds since the previous event)
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(1_000, 90_000, 30))
    gaps = np.log1p(np.diff(ts, prepend=ts[0]) / 1000.0).astype(np.float32)
    with torch.no_grad():
        want = net(types[:1], torch.from_numpy(gaps)[None, :, None]).numpy()[0]
    names = [TYPES[t] if t < len(TYPES) else "never-seen" for t in types[0].tolist()]
    got = InMemoryScorer(ScoringModel(model)).score(["u"] * 30, names, ts)
    np.testing.assert_allclose(got, want, atol=2e-5)
    h, ref = np.zeros(state_shape(meta)), []  # an LSTM's: h, then c
    for t, g in zip(types[0].tolist(), gaps, strict=True):
        h, s = reference_step(model.arrays, h, t, np.array([g]), "sigmoid")
        ref.append(s)
    np.testing.assert_allclose(ref, want, atol=2e-6)
