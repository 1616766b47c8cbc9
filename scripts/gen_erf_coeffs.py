#!/usr/bin/env python3
"""Prints tp_math.h's piecewise erf: the lines of tp_erff that evaluate it.

erf on [0.85, 3.93) is three degree-8 polynomials, each in u = (a - c) / h
over its interval [c - h, c + h]: Chebyshev fits (6000 Chebyshev nodes of
math.erf, in double), converted to monomials in u and rounded to float.
Evaluated in float arithmetic by Horner (no FMA) they stay within ~1.03 ulp
of the correctly rounded erf on a dense sample (checked below); `make
test-math-exhaustive` checks every FP32 pattern. Needs numpy; run by hand,
not by the build."""
import math

import numpy as np
from numpy.polynomial import chebyshev as C

BOUNDS = [0.85, 1.6, 2.5, 3.93]
DEGREE = 8


def fit(lo, hi):
    c, h = (hi + lo) / 2, (hi - lo) / 2
    x = np.cos(np.linspace(0, np.pi, 6000)) * h + c
    ch = C.chebfit((x - c) / h, np.vectorize(math.erf)(x), DEGREE)
    return np.float32(c), np.float32(1 / h), np.float32(C.cheb2poly(ch))


def horner(x, c, s, coef):
    u = np.float32(np.float32(x - c) * s)
    r = coef[-1]
    for k in coef[-2::-1]:
        r = np.float32(np.float32(r * u) + k)
    return r


def worst_ulp(lo, hi, c, s, coef):
    xs = np.float32(np.linspace(lo, hi, 200001))
    y = horner(xs, c, s, coef).astype(np.float64)
    ref = np.vectorize(math.erf)(xs.astype(np.float64))
    ulp = 2.0 ** (np.floor(np.log2(np.abs(ref))) - 23)
    return float(np.max(np.abs(y - ref) / ulp))


def main():
    fits = [fit(lo, hi) for lo, hi in zip(BOUNDS[:-1], BOUNDS[1:])]
    for (lo, hi), (c, s, coef) in zip(zip(BOUNDS[:-1], BOUNDS[1:]), fits):
        print(f"/* [{lo}, {hi}): {worst_ulp(lo, hi, c, s, coef):.2f} ulp on a dense sample */")
    # the piece bounds are tp_erf_piece's 1.6f and 2.5f and tp_erff's 3.93f
    print(f"/* pieces from {BOUNDS[0]}: below {BOUNDS[1]}, below {BOUNDS[2]}, below {BOUNDS[3]} */")

    def pick(vals):
        return "tp_erf_piece(a, " + ", ".join(f"{float(v):.9g}f" for v in vals) + ")"

    print(f"    float u = (a - {pick([f[0] for f in fits])}) *")
    print(f"              {pick([f[1] for f in fits])};")
    print(f"    float p = {pick([f[2][DEGREE] for f in fits])};")
    for k in range(DEGREE - 1, -1, -1):
        print(f"    p = p * u + {pick([f[2][k] for f in fits])};")

if __name__ == "__main__":
    main()
