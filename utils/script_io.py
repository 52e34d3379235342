"""script_io.py - what the megac utility scripts do alike with their files.

A failure is one line, "<script>: error: <what>", never a traceback
(`run`); an output is checked before any work (`check_output`: it may not
be an input of the run, nor lie inside a checkpoint directory, and its
directory must exist) and written whole or not at all (`write_atomic`).
"""

import os
import sys


class ScriptError(Exception):
    """A problem with the user's input: reported as the error line."""


def run(main):
    """Calls main(); reports a ScriptError, a ValueError (a damaged file,
    from safetensors_np) or an OSError (a file that cannot be read or
    written) as "<script>: error: ..." with exit status 1."""
    prog = os.path.basename(sys.argv[0])
    try:
        main()
    except (ScriptError, ValueError) as e:
        sys.exit(f"{prog}: error: {e}")
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        sys.exit(f"{prog}: error: {where}{e.strerror or e}")
    except MemoryError:
        sys.exit(f"{prog}: error: out of memory")


def _same_file(a, b):
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output(path, flag, inputs=(), inside=()):
    """Refuses output `path` (named by `flag`, "-o") where it would destroy
    an input (a path in `inputs`) or a file in one of the directories
    `inside` (a checkpoint's), is a directory, or has no directory to be
    written into."""
    if not path:
        raise ScriptError(f"{flag}: an empty path")
    if os.path.isdir(path):
        raise ScriptError(f"{flag} {path} is a directory; name a file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ScriptError(f"{flag} {path}: the directory {parent} does not exist")
    for name in inputs:
        if name and os.path.exists(name) and _same_file(path, name):
            raise ScriptError(f"{flag} {path} is the input {name}: writing it "
                              "would destroy that; name another file")
    real = os.path.realpath(path)
    for d in inside:
        top = os.path.realpath(d)
        if os.path.commonpath([real, top]) == top:
            raise ScriptError(f"{flag} {path} lies inside {d}, a checkpoint's "
                              "directory: writing it could destroy its "
                              "files; name a file outside it")


def write_atomic(path, write):
    """Calls write(file) on a temporary beside `path`, then renames it over
    `path`: an interrupted or failed write leaves no partial file. As
    megac-run writes its files: a symbolic link is written through (its
    target gets the file, the link stays), and a device or a pipe
    (/dev/null) is written in place, since a rename would replace it."""
    path = os.path.realpath(path)
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "wb") as f:
            write(f)
        return
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
