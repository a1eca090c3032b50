"""Position information against references written from the formulas (tests/models/reference.py):
the T5 bucket of every (query, key) pair, the relative position bias and the rotary embedding."""

import numpy as np
import pytest
import torch

from latentcode.models.positions import RelativePositionBias, Rotary, relative_position_buckets
from tests.models.reference import reference_position_bias, reference_rotary, t5_bucket


def test_t5_unidirectional_buckets():
    buckets = relative_position_buckets(40, 40, n_buckets=32, max_distance=128)
    assert buckets[10, 25] == 0, "keys after the query share the bucket of distance 0"
    assert buckets[10, 10] == 0
    assert buckets[15, 0] == 15, "distances below n_buckets // 2 have a bucket each"
    # distance 20: 16 + floor(log(20/16) / log(128/16) * 16) = 16 + floor(1.717) = 17 (by hand)
    assert buckets[20, 0] == 17
    # distance 39: 16 + floor(log(39/16) / log(8) * 16) = 16 + floor(6.86) = 22
    assert buckets[39, 0] == 22


@pytest.mark.parametrize(("n", "n_buckets", "max_distance"),
                         [(36, 36, 36), (32, 32, 32), (12, 12, 12), (200, 32, 128), (300, 64, 256), (9, 8, 16)])
def test_every_bucket_equals_the_t5_formula(n, n_buckets, max_distance):
    """The paper's setting (n_buckets = max_distance = length) and T5's, every (query, key) pair,
    distances beyond max_distance included."""
    buckets = relative_position_buckets(n, n, n_buckets=n_buckets, max_distance=max_distance)
    expected = np.array([[t5_bucket(max(query - key, 0), n_buckets, max_distance) for key in range(n)]
                         for query in range(n)])
    np.testing.assert_array_equal(buckets, expected)


def test_hand_computed_buckets_of_the_reference():
    """The reference's formula itself, on distances worked out by hand (n_buckets = max_distance = 36:
    max_exact 18; distance 30: 18 + floor(log(30/18) / log(2) * 18) = 18 + floor(13.27) = 31)."""
    assert [t5_bucket(d, 36, 36) for d in (0, 17, 18, 30, 35, 99)] == [0, 17, 18, 31, 35, 35]


def test_relative_position_bias_equals_its_formula():
    bias = RelativePositionBias(n_heads=3, n_ctx=20)
    with torch.no_grad():
        bias.bias_table.copy_(torch.randn(3, 20))
    for n_positions in (20, 7):
        torch.testing.assert_close(bias(n_positions), reference_position_bias(bias.bias_table, n_positions),
                                   rtol=0, atol=0)
    torch.testing.assert_close(bias.block(4, 9, 12), reference_position_bias(bias.bias_table, 12)[:, 4:9],
                               rtol=0, atol=0)


@pytest.mark.parametrize("base", [10000.0, 50.0])
def test_rotary_equals_its_formula(base):
    rotary = Rotary(d_head=8, n_ctx=16, base=base)
    x = torch.randn(2, 16, 3, 8)
    torch.testing.assert_close(rotary(x), reference_rotary(x, base), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rotary(x[:, :5]), reference_rotary(x[:, :5], base), rtol=1e-5, atol=1e-5)


def test_the_rotary_reference_by_hand():
    """d_head 2, position 1, base b: one pair rotated by the angle 1 radian ((1, 0) -> (cos 1, sin 1))."""
    x = torch.tensor([[[[1.0, 0.0]], [[1.0, 0.0]]]], dtype=torch.float64)  # [batch 1, pos 2, head 1, d 2]
    rotated = reference_rotary(x, base=10000.0)
    torch.testing.assert_close(rotated[0, 0, 0], torch.tensor([1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(rotated[0, 1, 0], torch.tensor([np.cos(1.0), np.sin(1.0)], dtype=torch.float64))
