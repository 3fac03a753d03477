"""benchmarks/verify_costs.py: the table of live rounds that `--live --json` writes to replay at."""

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def verify_costs():
    return load_benchmark("verify_costs")


def test_sizes_measured_live_keep_their_median_and_the_rest_follow_the_nearest(verify_costs):
    live = {1: [1.0, 1.1, 0.9], 4: [3.4, 3.3, 3.5, 9.0, 3.4], 16: [9.3, 9.2, 9.4], 2: [2.5, 2.4]}  # (2: too few)
    priced = {1: 1.0, 2: 1.9, 3: 2.5, 4: 3.0, 8: 7.0, 12: 8.0, 16: 8.0, 32: 14.0}
    table = verify_costs.live_table(live, priced)
    assert table[1] == 1.0 and table[4] == 3.4 and table[16] == 9.3  # the medians
    assert table[2] == pytest.approx(1.9 * 1.0 / 1.0)  # nearest measured: one position, as priced
    assert table[3] == pytest.approx(2.5 * 3.4 / 3.0)  # nearest measured: 4, 13% dearer than priced
    assert table[8] == pytest.approx(7.0 * 3.4 / 3.0)  # equally near 4 and 12: 4 (12 was not measured)
    assert table[12] == pytest.approx(8.0 * 9.3 / 8.0) and table[32] == pytest.approx(14.0 * 9.3 / 8.0)
    assert set(table) == set(priced)


def test_one_position_stands_on_any_number_of_rounds(verify_costs):
    table = verify_costs.live_table({1: [2.0], 4: [6.0, 6.0, 6.0]}, {1: 1.0, 4: 3.0, 8: 6.0})
    assert table == {1: 2.0, 4: 6.0, 8: 12.0}
