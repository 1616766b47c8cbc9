#!/usr/bin/env python3
"""Prints server/numtext.c's G1 table (Schubfach for binary32) with exact
integers, and checks the floor-log approximations numtext.c uses.

G1[e] is the top 63 bits of g(e) = floor(10^e * 2^(125 - floor(e log2 10))) + 1,
for e in [-32, 46]: the powers of ten -k that binary32's exponents need.
"""
from decimal import Decimal, getcontext, ROUND_FLOOR
from fractions import Fraction

getcontext().prec = 60


def flog2_pow10(e):
    return (e * 913124641741) >> 38


def check_logs():
    """The floor logs in both forms numtext.c uses: 64-bit (the scalar
    Schubfach) and Dragonbox's 32-bit (the AVX2 lanes), exact for |q| <= 200;
    and the shift h of every binary32 exponent within 33..36, which the
    lanes' 32-bit products rely on."""
    log10_2 = Decimal(2).ln() / Decimal(10).ln()
    log10_3q = (Decimal(3) / 4).ln() / Decimal(10).ln()
    for q in range(-200, 201):
        floor = lambda x: int(x.to_integral_value(rounding=ROUND_FLOOR))
        assert (q * 661971961083) >> 41 == floor(q * log10_2), q
        assert (q * 315653) >> 20 == floor(q * log10_2), q
        assert (q * 661971961083 - 274743187321) >> 41 == floor(log10_3q + q * log10_2), q
        assert (q * 631305 - 261663) >> 21 == floor(log10_3q + q * log10_2), q
        x = Fraction(10) ** q
        r = flog2_pow10(q)
        assert 2 ** r <= x < 2 ** (r + 1), q
        assert (q * 1741647) >> 19 == r, q
    for q in range(-149, 105):  # c 2^q, binary32's exponents
        for k in ((q * 315653) >> 20, (q * 631305 - 261663) >> 21):
            assert 33 <= q + flog2_pow10(-k) + 33 <= 36, q


def main():
    check_logs()
    for e in range(-32, 47):
        v = Fraction(10) ** e * Fraction(2) ** (125 - flog2_pow10(e))
        g = v.numerator // v.denominator + 1
        assert 2 ** 125 <= g < 2 ** 126
        print("    0x%016xu, /* %d */" % (g >> 63, e))


if __name__ == "__main__":
    main()
