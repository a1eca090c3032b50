import numpy as np

from latentcode.models.positions import relative_position_buckets


def test_t5_unidirectional_buckets():
    buckets = relative_position_buckets(40, 40, n_buckets=32, max_distance=128)
    assert buckets[10, 25] == 0, "keys after the query share the bucket of distance 0"
    assert buckets[10, 10] == 0
    assert buckets[15, 0] == 15, "distances below n_buckets // 2 have a bucket each"
    # distance 20: 16 + floor(log(20/16) / log(128/16) * 16) = 16 + floor(1.717) = 17 (by hand)
    assert buckets[20, 0] == 17
    # distance 39: 16 + floor(log(39/16) / log(8) * 16) = 16 + floor(6.86) = 22
    assert buckets[39, 0] == 22


def test_paper_setting_buckets_equal_max_distance_equal_length():
    n = 36
    buckets = relative_position_buckets(n, n, n_buckets=n, max_distance=n)
    distance = np.maximum(np.arange(n)[:, None] - np.arange(n)[None, :], 0)
    assert buckets.max() <= n - 1
    assert np.all(buckets[distance < 18] == distance[distance < 18])
    # monotone in distance
    along_distance = buckets[n - 1, ::-1]
    assert np.all(np.diff(along_distance) >= 0)
