"""pyrun.py DIR: runs the Python scripts a test script's shell asks for,
one after another, in this one interpreter (lib/onnx.sh's pyrun is the
client). Each of the importer, onnxruntime's reference and compare.py is
short; a fresh interpreter importing numpy, onnx and onnxruntime for each
was most of the ONNX tests' time.

A request is written whole to the FIFO DIR/req and closed: the working
directory, the script and its arguments, one per line (so no argument
holds a newline). The script runs as __main__ (runpy) with that argv and
its directory first on sys.path, as `python SCRIPT ARGS` would, with file
descriptors 1 and 2 on DIR/out and DIR/err (what a C extension writes
lands there too) and the warnings registry reset (a fresh process shows
each warning once). Its exit status (SystemExit's; 1 and the traceback
for an uncaught exception, as python gives) goes to the FIFO DIR/rep,
which is opened before the script runs: if this interpreter dies, the
client reads an end of file instead of a status. Exits when its parent
(the shell) is gone."""
import os
import runpy
import sys
import threading
import time
import traceback
import warnings


def redirect(path, fd):
    """fd onto path (truncated) -> a copy of what fd was."""
    saved = os.dup(fd)
    f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(f, fd)
    os.close(f)
    return saved


def run(d, cwd, script, args):
    """Runs script as __main__ with args -> its exit status."""
    os.chdir(cwd)
    argv, path = sys.argv, list(sys.path)
    sys.argv = [script] + args
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [redirect(os.path.join(d, "out"), 1), redirect(os.path.join(d, "err"), 2)]
    rc = 0
    try:
        with warnings.catch_warnings():  # entering and leaving it resets the registry
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            rc = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            rc = 1
    except BaseException:  # noqa: B902 (what python does with any exception)
        traceback.print_exc()
        rc = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, s in zip((1, 2), saved):
            os.dup2(s, fd)
            os.close(s)
        sys.argv = argv
        sys.path[:] = path
    return rc


def orphaned(parent):
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)


def main():
    d = sys.argv[1]
    threading.Thread(target=orphaned, args=(os.getppid(),), daemon=True).start()
    while True:
        with open(os.path.join(d, "req")) as f:
            lines = f.read().split("\n")[:-1]
        with open(os.path.join(d, "rep"), "w") as rep:
            rc = run(d, lines[0], lines[1], lines[2:]) if len(lines) >= 2 else 2
            rep.write("%d\n" % rc)


if __name__ == "__main__":
    main()
