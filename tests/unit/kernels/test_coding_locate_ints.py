"""The integer locator's popcount sums against a plain per-field count."""

from __future__ import annotations

import numpy as np
import pytest

from distronet.kernels import coding_locate


@pytest.mark.parametrize("w", [1, 2, 3, 4])
@pytest.mark.parametrize("b0", [0, 3, 12])
def test_field_sums_match_per_field_count(w: int, b0: int) -> None:
    rng = np.random.default_rng(1000 * w + b0)
    bmax = 12
    lim = (1 << w) - 1
    mt = coding_locate._mant_table(b0, bmax, lim + 1)
    coefs = coding_locate._field_coefs(b0, w, bmax)
    for count in (1, 2, 7, 64, 333):
        f = rng.integers(0, lim + 1, count)
        x = 0
        for v in f.tolist():
            x = (x << w) | v
        esc, mant = coding_locate._field_sums(x, count, w, coefs)
        assert esc == int((f == lim).sum())
        assert mant == int(mt[f[f != lim]].sum())


def test_escape_mant_short_and_long_paths_agree() -> None:
    rng = np.random.default_rng(7)
    bits = (rng.random(4000) < 0.7).astype(np.uint8)
    z = np.flatnonzero(bits == 0)
    mt = coding_locate._mant_table(5, 12, 14)
    p = 10
    j0 = int(z.searchsorted(p))
    for n_esc in (1, 5, 200, 300, 600):
        ends = z[j0 : j0 + n_esc]
        u = np.diff(ends, prepend=p - 1) - 1
        want = int(mt[np.minimum(7 + u, 13)].sum())
        assert coding_locate._escape_mant(z, j0, n_esc, p, 7, mt, 12) == want
