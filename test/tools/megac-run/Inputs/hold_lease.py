"""hold_lease.py FILE --ready MARKER - holds a write lease on FILE, as a
Samba or NFS server does for a client that caches it: another process's
open of FILE is refused with EWOULDBLOCK when non-blocking, and waits for
the lease's release otherwise. Writes MARKER once the lease is held,
releases it 0.3 s after the kernel asks it to (SIGIO), and prints what
happened. Exits 1 if no one asked within 60 s."""

import argparse
import fcntl
import os
import signal
import sys
import time

F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--ready", required=True)
    a = p.parse_args()
    asked = []
    signal.signal(signal.SIGIO, lambda *_: asked.append(time.time()))
    fd = os.open(a.file, os.O_RDONLY)
    fcntl.fcntl(fd, F_SETLEASE, fcntl.F_WRLCK)
    open(a.ready, "w").close()
    start = time.time()
    while not asked and time.time() - start < 60:
        time.sleep(0.01)
    if not asked:
        print("hold_lease.py: nobody opened the file", flush=True)
        sys.exit(1)
    time.sleep(0.3)
    fcntl.fcntl(fd, F_SETLEASE, fcntl.F_UNLCK)
    print("hold_lease.py: lease broken by an open, released", flush=True)


if __name__ == "__main__":
    main()
