"""Writing the archive once a program's imports have settled (DUMP, AUTO).

A server stopped by SIGTERM, a pool worker ended by ``os._exit`` never run
their atexit handlers, so a dump at exit alone writes nothing for them.  A
watcher thread writes the archive once no module has been added to
``sys.modules`` for ``PYCDSSETTLE`` seconds; the dump at a normal exit still
runs and adds what was imported since.

The program sees nothing of it: the thread is a bare ``_thread`` thread
(not in ``threading.enumerate()``), blocks every signal (the kernel
delivers them to the program's threads, so a handler waiting in the main
thread runs as without pycds), prints only what the dump at exit would, and
ends at the first of: its write, the exit handler, or the interpreter's
shutdown.  It is not there across a ``fork()``: stopped before it (3.12+
warns when a process that forks has more than one thread, and the kernel's
count includes this one), started again in the child, with a watch of its
own, and in the parent at its next import (an audit hook; 3.13 counts the
threads after the fork's own hooks).
"""

import _signal
import _thread
import os
import sys
import time

__all__ = ["start", "stop"]

_lock = _thread.allocate_lock()    # held while an archive is written
# "paused": stopped for a fork(); "tid": the watcher's native thread id
# while it runs.
_state = {"stopped": False, "write": None, "quiet_s": 0.0, "forks": False,
          "paused": False, "tid": 0, "gen": 0, "watched": None}
# "gen": the watcher that counts (one stopped for a fork that wakes late
# sees a newer one and ends); "watched": (modules seen, since when), kept
# across a fork in the parent, so that forking often does not defer the
# write for ever.
# Held while the watcher may sleep on it; released to wake it at once.
_wake = _thread.allocate_lock()
_wake.acquire()
# Seconds a fork() waits for the watcher's thread to end.
FORK_WAIT_S = 0.5


def start(write, quiet_s):
    """Call write() once, from a thread, when sys.modules stops changing.

    Call ``write()`` once, from a thread of its own, when
    ``len(sys.modules)`` has not changed for ``quiet_s`` seconds (> 0).
    ``write`` must not raise (its errors are its own to report)."""
    _state.update(stopped=False, write=write, quiet_s=quiet_s, watched=None)
    try:
        _spawn()
    except RuntimeError:
        # An isolated subinterpreter has no threads (3.12+; the dump at
        # exit does nothing there either).
        return
    if not _state["forks"]:
        _state["forks"] = True
        os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_parent,
                            after_in_child=_after_fork)


def stop():
    """Stop the watcher, wait for its write; return the lock, held.

    Stop the watcher and wait for a write it has begun (the exit
    handler, before its own write).  Returns the lock held: release it
    when done."""
    _state["stopped"] = True
    _lock.acquire()
    return _lock


def _spawn():
    # The new thread inherits this mask: blocked from its first instruction.
    _state["gen"] += 1
    old = _signal.pthread_sigmask(_signal.SIG_BLOCK, _signal.valid_signals())
    try:
        _thread.start_new_thread(_watch, (_state["gen"],))
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, old)


def _before_fork():
    # Wake the watcher, let it end, and wait for its thread to be gone (the
    # kernel's thread count: /proc/self/task).  Not while it writes: the
    # fork then happens with it, as it would without this.
    tid = _state["tid"]
    if not tid or _state["stopped"] or _lock.locked():
        return
    _state["paused"] = True
    if _wake.locked():
        try:
            _wake.release()
        except RuntimeError:
            pass
    task = f"/proc/self/task/{tid}"
    deadline = time.monotonic() + FORK_WAIT_S
    while os.path.exists(task) and time.monotonic() < deadline:
        time.sleep(0.0002)


def _after_fork_parent():
    # Started again at the next import, not here: 3.13 counts the threads
    # after these hooks have run, and one started now would be counted.
    global _resuming
    if _state["paused"] and not _resuming:
        _resuming = True
        try:
            sys.addaudithook(_resume_at_import)
        except Exception:
            _resuming = False


_resuming = False     # _resume_at_import is an audit hook of this process


def _resume_at_import(event, args):
    # ("import": a module about to be loaded: the fork has long returned.)
    if event == "import" and _state["paused"]:
        _restart()


def _after_fork():
    global _lock, _wake
    _lock = _thread.allocate_lock()     # the parent's writer is not here
    _wake = _thread.allocate_lock()
    _wake.acquire()
    _state["tid"] = 0
    _state["watched"] = None        # (the child's own imports from now)
    if not _state["stopped"] and _state["write"] is not None:
        _state["paused"] = True
        _restart()


def _restart():
    if not _state["paused"]:
        return
    _state["paused"] = False
    if not _wake.locked():
        _wake.acquire(False)
    if not _state["stopped"] and _state["write"] is not None:
        try:
            _spawn()
        except Exception:
            pass


def _watch(gen):
    tid = _state["tid"] = _thread.get_native_id()
    try:
        _watch_until_settled(gen)
    finally:
        if _state["tid"] == tid:
            _state["tid"] = 0


def _watch_until_settled(gen):
    quiet_s = _state["quiet_s"]
    poll = min(max(quiet_s / 4, 0.05), 1.0)
    seen, since = _state["watched"] or (len(sys.modules), time.monotonic())
    while not _state["stopped"]:
        if _wake.acquire(True, poll) or _state["paused"] or _state["gen"] != gen:
            if _state["gen"] == gen:
                _state["watched"] = (seen, since)
            return      # (stopped for a fork: started again after it)
        n = len(sys.modules)
        now = time.monotonic()
        if n != seen:
            seen, since = n, now
        elif now - since >= quiet_s:
            break
    if _state["stopped"] or _state["paused"] or _state["gen"] != gen \
            or not _lock.acquire(False):
        return
    try:
        if not _state["stopped"]:
            _state["write"]()
    finally:
        _lock.release()
