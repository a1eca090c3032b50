"""The kernel init: Flax's lecun_normal, a normal truncated at ±2 std and rescaled to variance 1/fan_in."""

import math

import torch

from latentcode.models.initializers import lecun_normal_


def test_lecun_normal_has_variance_one_over_fan_in():
    torch.manual_seed(0)
    fan_in = 64
    weight = lecun_normal_(torch.empty(1000, 1000), fan_in)
    # 10^6 draws: the sample variance's relative s.e. is about 0.0012; an uncorrected truncation gives 0.774.
    assert abs(weight.var().item() * fan_in - 1.0) < 0.01
    # Truncated at two of the rescaled standard deviations, no further.
    bound = 2 / math.sqrt(fan_in) / 0.87962566103423978
    assert weight.abs().max().item() <= bound
    assert weight.abs().max().item() > 0.99 * bound
