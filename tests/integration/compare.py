#!/usr/bin/env python3
"""compare.py OUT.safetensors REF.safetensors RTOL

Checks every tensor of REF against the tensor of the same name in OUT:
same dtype, same shape, and

    err = max|out - ref| / max(max|ref|, 1e-6)  <=  RTOL

computed in float64 (BF16 is widened exactly from its bits; an empty tensor
has err 0; any NaN/Inf in out - ref gives err = inf). This is the metric of
graphs/README.md. Tensors only in OUT are ignored.

Prints one line per REF tensor ("ok" or "FAIL", name, dtype, shape, err).
Exit status: 0 all match, 1 a mismatch or an unreadable/malformed file,
2 bad usage. Needs python3 + numpy only.
"""
import json
import struct
import sys

import numpy as np

ST_NP = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("u1"),
}


class FormatError(Exception):
    pass


def load(path):
    """-> {name: (dtype, ndarray)}; raises FormatError naming the problem."""
    try:
        with open(path, "rb") as f:
            buf = f.read()
    except OSError as e:
        raise FormatError("%s: %s" % (path, e.strerror))
    if len(buf) < 8:
        raise FormatError("%s: shorter than the 8-byte header length" % path)
    (hlen,) = struct.unpack("<Q", buf[:8])
    if hlen > len(buf) - 8:
        raise FormatError("%s: header length %d runs past the end of the file" % (path, hlen))
    try:
        header = json.loads(buf[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("%s: bad header JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise FormatError("%s: header is not a JSON object" % path)
    data = memoryview(buf)[8 + hlen:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            st = info["dtype"]
            shape = tuple(int(s) for s in info["shape"])
            b, e = (int(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise FormatError("%s: tensor %s: malformed header entry" % (path, name))
        if st not in ST_NP:
            raise FormatError("%s: tensor %s: unsupported dtype %s" % (path, name, st))
        if any(s < 0 for s in shape):
            raise FormatError("%s: tensor %s: negative dim in %s" % (path, name, list(shape)))
        nbytes = int(np.prod(shape, dtype=np.int64)) * ST_NP[st].itemsize
        if not 0 <= b <= e <= len(data):
            raise FormatError("%s: tensor %s: data_offsets [%d, %d] run past the file"
                              % (path, name, b, e))
        if e - b != nbytes:
            raise FormatError("%s: tensor %s: data_offsets [%d, %d] hold %d bytes, shape %s %s needs %d"
                              % (path, name, b, e, e - b, list(shape), st, nbytes))
        out[name] = (st, np.frombuffer(data[b:e], dtype=ST_NP[st]).reshape(shape))
    return out


def to_f64(st, a):
    if st == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return a.astype(np.float64)


def rel_err(out, ref):
    """max|out - ref| / max(max|ref|, 1e-6), float64."""
    if ref.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(out - ref)
    if not np.all(np.isfinite(diff)):
        return float("inf")
    return float(diff.max() / max(float(np.abs(ref).max()), 1e-6))


def main(argv):
    if len(argv) != 4:
        print("usage: compare.py OUT.safetensors REF.safetensors RTOL", file=sys.stderr)
        return 2
    try:
        rtol = float(argv[3])
    except ValueError:
        print("compare.py: RTOL %r is not a number" % argv[3], file=sys.stderr)
        return 2
    try:
        out = load(argv[1])
        ref = load(argv[2])
    except FormatError as e:
        print("compare.py: %s" % e, file=sys.stderr)
        return 1
    if not ref:
        print("compare.py: %s holds no tensors" % argv[2], file=sys.stderr)
        return 1
    failed = 0
    for name in sorted(ref):
        rst, r = ref[name]
        desc = "%s %s %s" % (name, rst, list(r.shape))
        if name not in out:
            print("FAIL %s: missing from %s" % (desc, argv[1]))
            failed += 1
            continue
        ost, o = out[name]
        if ost != rst:
            print("FAIL %s: dtype %s in output, %s in reference" % (desc, ost, rst))
            failed += 1
            continue
        if o.shape != r.shape:
            print("FAIL %s: shape %s in output, %s in reference" % (desc, list(o.shape), list(r.shape)))
            failed += 1
            continue
        err = rel_err(to_f64(ost, o), to_f64(rst, r))
        if err <= rtol:
            print("ok   %s err=%.3e rtol=%.1e" % (desc, err, rtol))
        else:
            print("FAIL %s: err=%.3e > rtol=%.1e" % (desc, err, rtol))
            failed += 1
    if failed:
        print("compare.py: %d of %d tensors differ" % (failed, len(ref)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
